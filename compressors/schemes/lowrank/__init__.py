"""Low-rank compression: PowerSGD."""
