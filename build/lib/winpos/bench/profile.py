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
