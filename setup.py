"""Package layout: the folders ``theory/``, ``compressors/`` and ``analysis/`` stay at the top of the source tree (the
design card's layout) and install as ``gradstat.theory``, ``gradstat.compressors`` and ``gradstat.analysis``, so that
nothing generic lands at the top level of site-packages. Everything else is in ``pyproject.toml``."""

from setuptools import find_packages, setup

LAYERS = ("theory", "compressors", "analysis")

setup(
    packages=["gradstat"] + [f"gradstat.{p}" for p in find_packages(include=[f"{layer}*" for layer in LAYERS])],
    package_dir={"gradstat": "gradstat", **{f"gradstat.{layer}": layer for layer in LAYERS}},
)
