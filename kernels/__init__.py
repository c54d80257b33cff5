"""Triton kernels for fused window attention (installed as ``winpos.kernels``)."""
