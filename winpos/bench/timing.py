"""Interleaved timing and peak-memory measurement (these machines are noisy: compare side by side, in one run)."""
from __future__ import annotations

import gc
import math
import multiprocessing as mp
import os
import resource
import statistics
import sys
import time
from typing import Callable

import torch
from winpos.errors import WinposError
from winpos.utils.outputs import atomic_write_json


def progress(total: int, desc: str):
    """A tqdm bar on stderr (stdout stays a clean report); ``TQDM_DISABLE=1`` silences it."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True)


def interleaved_times(fns: dict[str, Callable[[], object]], repeats: int = 7, warmup: int = 2,
                      desc: str | None = None) -> dict[str, list[float]]:
    """Seconds of every timed call of each function (one entry per round), calling them round-robin so drift hits
    all of them alike. A function that launches GPU work must synchronize before it returns. ``desc``: show a
    progress bar."""
    bar = progress((warmup + repeats) * len(fns), desc) if desc else None
    for _ in range(warmup):
        for fn in fns.values():
            fn()
            if bar is not None:
                bar.update()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
            if bar is not None:
                bar.update()
    if bar is not None:
        bar.close()
    return times


def interleaved_medians(fns: dict[str, Callable[[], object]], repeats: int = 7, warmup: int = 2,
                        desc: str | None = None) -> dict[str, float]:
    """Median seconds per call of each function (see ``interleaved_times``)."""
    return {name: statistics.median(ts) for name, ts in interleaved_times(fns, repeats, warmup, desc).items()}


def round_ratios(peer: list[float], mine: list[float]) -> list[float]:
    """Per-round speedups ``peer / mine`` of two functions timed in the same rounds: their spread shows how far the
    machine's noise moves a ratio (both calls of a round share its conditions)."""
    if len(peer) != len(mine) or not peer:
        raise WinposError(f"need the same nonzero number of rounds for both, got {len(peer)} and {len(mine)}")
    return [p / m for p, m in zip(peer, mine)]


def _vm_hwm_kib() -> float:
    """Peak RSS of this process image (VmHWM); unlike ru_maxrss it is not inherited from the parent across exec."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return float(line.split()[1])
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _release_and_reset_peak() -> None:
    """Return freed heap to the OS (glibc ``malloc_trim``) and reset VmHWM to the current RSS (Linux
    ``clear_refs``), so building the inputs, which may peak higher than the call itself, does not hide the call's
    peak. Where either is unavailable the measurement is a lower bound."""
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:  # output-policy: a kernel control file, not an output
            f.write("5")
    except OSError:
        pass


def _child_peak(builder, args, threads, queue):
    torch.set_num_threads(threads)
    fn = builder(*args)
    _release_and_reset_peak()
    base = _vm_hwm_kib()
    fn()
    peak = _vm_hwm_kib()
    queue.put((peak - base) / 1024.0)  # KiB -> MiB
    if os.environ.get("WINPOS_BENCH_DEBUG"):
        print("child rss", base, peak, flush=True)


def peak_rss_mib(builder: Callable[..., Callable[[], object]], *args) -> float:
    """Peak RSS growth (MiB) of one call of ``builder(*args)()`` in a fresh (spawned) process, above its RSS after
    building the inputs. ``builder`` must be a module-level function (it is pickled)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child_peak, args=(builder, args, torch.get_num_threads(), queue))
    proc.start()
    value = queue.get(timeout=600)
    proc.join()
    return value


def cuda_peak_mib(fn: Callable[[], object]) -> float:
    """Peak CUDA memory allocated (MiB) by one call of ``fn``, above what was allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, float) for v in value):
        return f"{value[0]:.3g}-{value[1]:.3g}"  # a (low, high) range
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def print_table(title: str, rows: list[dict], cols: list[str]) -> None:
    """A markdown table of ``rows`` (missing or None cells print as ``-``)."""
    print(f"\n## {title}")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(_cell(r.get(c)) for c in cols) + " |")


def _finite(obj):
    """NaN / inf -> None, so the file is standard JSON (``json`` would write bare ``NaN``)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def write_json(path, payload) -> None:
    if path:
        atomic_write_json(path, _finite(payload), indent=2, allow_nan=False)
        print(f"\nwrote {path}")
