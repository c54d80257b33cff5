"""``benchmark.py kernels``: a thin wrapper around ``python -m winpos.kernels.bench`` (Triton kernels vs SDPA).

The kernel benchmark runs in a child process: its ``--dry-run`` needs the Triton interpreter, which Triton fixes
at its first import in a process. Without CUDA the GPU benchmark cannot run, so the wrapper says so and runs the
dry run (tiny shapes on CPU: it checks the benchmark end to end, its timings mean nothing).
"""
from __future__ import annotations

import subprocess
import sys

GPU_NEEDED = ("the kernel benchmark needs a CUDA GPU and none is available: running its --dry-run instead "
              "(tiny shapes under the Triton interpreter; it checks the benchmark end to end, the timings are "
              "meaningless)")


def command(args: list[str], cuda: bool) -> tuple[list[str], bool]:
    """The child's command line for the forwarded ``args``, and whether a dry run was forced for lack of CUDA."""
    forced = not cuda and "--dry-run" not in args and not {"-h", "--help"} & set(args)
    return [sys.executable, "-m", "winpos.kernels.bench", *args, *(["--dry-run"] if forced else [])], forced


def run(args: list[str]) -> int:
    """Run the kernel benchmark with ``args`` (its own flags: ``--json``, ``--dry-run``, ``--reps``, ``--models``,
    ``--impls``, ...); returns its exit status."""
    import torch

    cmd, forced = command(list(args), torch.cuda.is_available())
    if forced:
        print(GPU_NEEDED, flush=True)
    return subprocess.call(cmd)
