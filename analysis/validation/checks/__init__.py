"""The checks the project knows, one module per paper family; :mod:`analysis.validation.registry` lists them."""
