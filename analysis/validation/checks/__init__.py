"""The checks the project knows, one module per paper family; :mod:`gradstat.analysis.validation.registry` lists
them."""
