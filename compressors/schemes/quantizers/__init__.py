"""Quantizers: the scaled dithered family (QSGD, TernGrad, ECQ-SGD, DQSG, NDQSG, QCS) and the sign family
(signSGD, 1-bit SGD)."""
