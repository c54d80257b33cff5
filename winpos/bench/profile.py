"""Which ops a forward pass spends its time in (``torch.profiler``), to explain a ratio that misses its target."""
from __future__ import annotations

from typing import Callable


def top_ops(fn: Callable[[], object], top: int = 10, cuda: bool = False) -> dict:
    """Profile one call of ``fn``; the ``top`` ops by self time.

    Self time excludes the time of the ops an op calls, so the shares add up to at most 1 over all ops. On CUDA
    the device self time is used (the CPU side only launches kernels there).
    Returns ``{"clock": "cpu" | "cuda", "total_ms": float, "ops": [{"op", "calls", "self_ms", "share"}, ...]}``.
    """
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        fn()
    attr = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = [e for e in prof.key_averages() if getattr(e, attr) > 0]
    total_us = sum(getattr(e, attr) for e in events)
    events.sort(key=lambda e: getattr(e, attr), reverse=True)
    ops = [{"op": e.key, "calls": e.count, "self_ms": getattr(e, attr) / 1e3,
            "share": getattr(e, attr) / total_us if total_us else 0.0} for e in events[:top]]
    return {"clock": "cuda" if cuda else "cpu", "total_ms": total_us / 1e3, "ops": ops}


def side_by_side(mine: dict, peer: dict) -> list[dict]:
    """Table rows over the union of both profiles' top ops: ``op, ms, share, peer_ms, peer_share`` (``None``
    where an op is not among that model's top ops), ordered by the larger of the two self times."""
    a = {o["op"]: o for o in mine["ops"]}
    b = {o["op"]: o for o in peer["ops"]}
    names = sorted(set(a) | set(b), key=lambda n: -max(a.get(n, {}).get("self_ms", 0), b.get(n, {}).get("self_ms", 0)))
    return [{"op": n, "ms": a[n]["self_ms"] if n in a else None, "share": a[n]["share"] if n in a else None,
             "peer_ms": b[n]["self_ms"] if n in b else None, "peer_share": b[n]["share"] if n in b else None}
            for n in names]


def linear_ceiling(model, x, repeats: int = 3) -> dict:
    """The model's own ``nn.Linear`` layers timed alone, at the shapes one forward of ``x`` gives them: what its
    matmuls cost by themselves and the throughput they reach at those shapes (small channel counts, e.g. Hiera's
    112 in stage 1, run far below a square matmul's throughput). A forward cannot be faster than its linears, so
    this bounds the fraction of the square-matmul peak a model can reach.

    Forward hooks record ``(rows, in_features, out_features)`` per call; each distinct shape is then timed with
    random data, the best of ``repeats`` calls after a warm-up, without grad.
    Returns ``{"linear_s", "linear_gflop", "gflops_per_s", "shapes": [{"rows", "in", "out", "calls", "ms",
    "gflops_per_s"}]}`` (1 multiply-add = 1 flop, the fvcore convention of the other tables).
    """
    import time
    from collections import Counter

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    calls: Counter = Counter()

    def hook(module, inputs, output):
        inp = inputs[0]
        calls[(inp.numel() // inp.shape[-1], module.in_features, module.out_features, module.bias is not None)] += 1

    from winpos.backbones.fused import fused_linear

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, nn.Linear)]
    try:
        with torch.no_grad(), fused_linear(False):  # the fused path calls oneDNN directly, past the hooks
            model(x)
    finally:
        for h in handles:
            h.remove()
    shapes, total_s, total_gflop = [], 0.0, 0.0
    with torch.no_grad():
        for (rows, k, n, has_bias), count in sorted(calls.items(), key=lambda kv: -kv[0][0] * kv[0][1] * kv[0][2]):
            a, w = torch.randn(rows, k, device=x.device), torch.randn(n, k, device=x.device)
            b = torch.randn(n, device=x.device) if has_bias else None
            F.linear(a, w, b)
            best = float("inf")
            for _ in range(repeats):
                if x.device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                F.linear(a, w, b)
                if x.device.type == "cuda":
                    torch.cuda.synchronize()
                best = min(best, time.perf_counter() - t0)
            gflop = rows * k * n / 1e9
            shapes.append({"rows": rows, "in": k, "out": n, "calls": count, "ms": best * 1e3,
                           "gflops_per_s": gflop / best})
            total_s += best * count
            total_gflop += gflop * count
    return {"linear_s": total_s, "linear_gflop": total_gflop,
            "gflops_per_s": total_gflop / total_s if total_s else None, "shapes": shapes}
