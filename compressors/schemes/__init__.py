"""The papers' compression schemes, one module each, by family: sparsifiers, quantizers, low rank."""
