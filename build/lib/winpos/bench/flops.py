"""FLOP counting (fvcore, plus the attention ops it does not know) and the machine's measured matmul throughput."""
from __future__ import annotations

import time

import torch


def _sdpa_flops(inputs, outputs):
    """2 * B * heads * Nq * Nk * (d_qk + d_v) multiply-adds counted as fvcore does (1 MAC = 1 flop)."""
    from fvcore.nn.jit_handles import get_shape

    q, k, v = (get_shape(x) for x in inputs[:3])
    batch = 1
    for s in q[:-2]:
        batch *= s
    return batch * q[-2] * k[-2] * (q[-1] + v[-1])


def count_gflops(model, x) -> float:
    """Forward GFLOPs (fvcore convention: one multiply-add = one flop) of ``model(x)`` in inference, i.e. traced
    under ``no_grad``: the path that is timed (relpos, for one, computes differently when autograd is on)."""
    from fvcore.nn import FlopCountAnalysis

    with torch.no_grad():
        analysis = FlopCountAnalysis(model, x)
        analysis.set_op_handle("aten::scaled_dot_product_attention", _sdpa_flops)
        analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
        return analysis.total() / 1e9


def matmul_gflops_per_s(n: int = 2048, dtype=torch.float32, repeats: int = 5, device="cpu") -> float:
    """Measured throughput of an n x n matmul in GFLOP/s, fvcore convention (n^3 multiply-adds = n^3 flops):
    the best of ``repeats`` calls after one warm-up, on ``device``."""
    cuda = torch.device(device).type == "cuda"
    a, b = (torch.randn(n, n, dtype=dtype, device=device) for _ in range(2))
    a @ b
    best = float("inf")
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        a @ b
        if cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return n ** 3 / best / 1e9
