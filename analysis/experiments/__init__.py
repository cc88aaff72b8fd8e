"""The papers' experiments, one module per experiment, each with the paper's published numbers beside ours."""
