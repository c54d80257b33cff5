"""GPU timing for the kernel benchmark and the GPU check: CUDA events around each call, with the L2 cache flushed
before every timed call, and optionally CUDA-graph replay (no host launch overhead in the measurement).

Why both: a call whose inputs still sit in L2 from the previous repetition looks faster than it will inside a
model (Hopper's L2 is 50 MB, larger than many window-attention working sets), and a call whose host side (Python,
argument binding, several launches) takes longer than its GPU work measures the host. ``eager`` rows are what a
model sees without graphs; ``graph`` rows are the GPU time alone. Off CUDA (dry runs) both fall back to one
wall-clock call per repetition: the numbers only show that the code path runs.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

FLUSH_BYTES = 256 * 2**20  # larger than any current GPU's L2 (H100 / H200: 50 MB)

__all__ = ["FLUSH_BYTES", "bench", "wall_bench"]

_FLUSH: dict = {}


def _flush_buffer(device) -> torch.Tensor:
    key = str(device)
    if key not in _FLUSH:
        _FLUSH[key] = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device=device)
    return _FLUSH[key]


def _summary(ms: list[float]) -> dict:
    return {"median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms), "reps": len(ms)}


def wall_bench(fn: Callable[[], object], reps: int) -> dict:
    """Wall-clock milliseconds of ``reps`` calls (CPU / dry runs)."""
    ms = []
    for _ in range(max(reps, 1)):
        t0 = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t0) * 1e3)
    return _summary(ms)


def _events(fn: Callable[[], object], reps: int, flush: torch.Tensor | None) -> list[float]:
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for a, b in zip(starts, ends):
        if flush is not None:
            flush.zero_()  # evicts the previous call's inputs and outputs from L2
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return [a.elapsed_time(b) for a, b in zip(starts, ends)]


def bench(fn: Callable[[], object], reps: int = 20, warmup: int = 3, flush_l2: bool = True,
          graph: bool = False) -> dict:
    """Milliseconds per call of ``fn`` on the current CUDA device: ``{"median_ms", "min_ms", "max_ms", "reps"}``.

    ``flush_l2``: overwrite a ``FLUSH_BYTES`` buffer before every timed call (outside the timed region).
    ``graph``: capture one call into a CUDA graph (after warm-up on a side stream, as capture requires) and time
    its replays; raises what capture raises when ``fn`` cannot be captured (a host synchronization, a CPU tensor,
    an allocation the graph pool cannot serve). Without CUDA: ``wall_bench``.
    """
    if not torch.cuda.is_available():
        return wall_bench(fn, reps)
    flush = _flush_buffer(torch.device("cuda")) if flush_l2 else None
    if graph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(max(warmup, 1)):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        run = g.replay
        run()
    else:
        for _ in range(warmup):
            fn()
        run = fn
    torch.cuda.synchronize()
    return _summary(_events(run, reps, flush))
