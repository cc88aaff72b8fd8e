"""Sparsifiers: Top-k, random-k, threshold selections (SIDCo, DGC, RedSync, Gaussian-k, tail count), Wangni."""
