"""Interleaved timing and peak-memory measurement (these machines are noisy: compare side by side, in one run)."""
from __future__ import annotations

import gc
import os
import json
import multiprocessing as mp
import resource
import statistics
import time
from typing import Callable

import torch


def interleaved_medians(fns: dict[str, Callable[[], object]], repeats: int = 7, warmup: int = 2) -> dict[str, float]:
    """Median seconds per call of each function, calling them round-robin so drift hits all of them alike."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _vm_hwm_kib() -> float:
    """Peak RSS of this process image (VmHWM); unlike ru_maxrss it is not inherited from the parent across exec."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return float(line.split()[1])
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _child_peak(builder, args, threads, queue):
    torch.set_num_threads(threads)
    fn = builder(*args)
    gc.collect()
    base = _vm_hwm_kib()
    fn()
    peak = _vm_hwm_kib()
    queue.put((peak - base) / 1024.0)  # KiB -> MiB
    if os.environ.get("WINPOS_BENCH_DEBUG"):
        print("child rss", base, peak, flush=True)


def peak_rss_mib(builder: Callable[..., Callable[[], object]], *args) -> float:
    """Peak RSS growth (MiB) of one call of ``builder(*args)()`` in a fresh (spawned) process, after building its
    inputs. ``builder`` must be a module-level function (it is pickled)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child_peak, args=(builder, args, torch.get_num_threads(), queue))
    proc.start()
    value = queue.get(timeout=600)
    proc.join()
    return value


def print_table(title: str, rows: list[dict], cols: list[str]) -> None:
    print(f"\n## {title}")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")


def write_json(path, payload) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(payload, f, indent=2)
        print(f"\nwrote {path}")
