#!/usr/bin/env python
"""The prepared GPU check: kernel tests on CUDA, the kernel benchmark, backbone throughput; one JSON and a log.

    python tools/gpu_check.py OUT_DIR                 # on a CUDA machine (torch, triton, timm; no network): < 9 min
    python tools/gpu_check.py OUT_DIR --dry-run       # the same steps on the CPU with tiny shapes (checks the script)
    WINPOS_BLOCK_IMPORTS=image WINPOS_KERNEL_FAULT=fwd python tools/gpu_check.py OUT_DIR --dry-run
                                                      # rehearsal: the lent image's imports, a kernel broken on purpose

Writes OUT_DIR/gpu_check.json (one entry per step: status, seconds, numbers), OUT_DIR/gpu_check.log and
OUT_DIR/kernels.json (the kernel benchmark's rows). Exit 0: every step passed; 1: a step failed (the JSON says
which); 2: bad input (no GPU without --dry-run, an OUT_DIR holding an earlier check without --force). The steps are
described in winpos/bench/gpu_check.py.
"""
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # a bare checkout: winpos from the source tree until it is installed

from winpos.errors import WinposError  # noqa: E402
from winpos.utils.cli import ArgumentParser, finite_float, run_cli  # noqa: E402


def main(argv=None):
    import argparse

    from winpos.bench.blocked_imports import install_from_env

    install_from_env()  # WINPOS_BLOCK_IMPORTS: refuse what the lent GPU image lacks (the rehearsal)

    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir", help="folder for gpu_check.json, gpu_check.log and kernels.json")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, Triton interpreter: checks the script")
    p.add_argument("--budget", type=finite_float, default=450.0, help="seconds for the whole check, a hard deadline "
                   "(default 450)")
    p.add_argument("--steps", default=None, help="comma list of steps to run (default: all)")
    p.add_argument("--force", action="store_true", help="replace the results of an earlier check in OUT_DIR")
    args = p.parse_args(argv)
    from winpos.bench.gpu_check import STEPS, install_if_needed, run_check
    from winpos.utils.outputs import check_output_dir

    steps = STEPS if args.steps is None else tuple(s.strip() for s in args.steps.split(",") if s.strip())
    unknown = [s for s in steps if s not in STEPS]
    if unknown or not steps:
        raise WinposError(f"--steps {args.steps!r}: unknown step(s) {unknown}; choose from {', '.join(STEPS)}")
    if args.budget <= 0:
        raise WinposError(f"--budget {args.budget} must be a positive number of seconds, e.g. 450")
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        raise WinposError("the GPU check needs a CUDA GPU and none is available; run it with --dry-run to check the "
                          "script on the CPU (tiny shapes, timings meaningless)")
    check_output_dir(args.out_dir, planned=("gpu_check.json", "gpu_check.log", "kernels.json"),
                     force=args.force or bool(os.environ.get("WINPOS_GPU_CHECK_INSTALL")))
    if not os.environ.get("WINPOS_GPU_CHECK_INSTALL"):
        installed = install_if_needed(ROOT)
        if installed is not None:  # start again: only a new process sees the editable install
            os.environ["WINPOS_GPU_CHECK_INSTALL"] = json.dumps(installed)
            os.execv(sys.executable, [sys.executable, *sys.argv])
    report = run_check(args.out_dir, dry_run=args.dry_run, budget_s=args.budget, steps=steps)
    print(f"\n{'all steps passed' if report['ok'] else 'FAILED: ' + ', '.join(k for k, v in report['steps'].items() if v['status'] != 'ok')}"
          f" in {report['elapsed_s']:.0f} s; wrote {args.out_dir}/gpu_check.json")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(run_cli(main))
