"""One backbone row of the GPU check, run in a child process so that the check can stop it at a hard deadline
(a ``torch.compile`` that runs long is killed with its process; the row is then reported as timed out):

    python -m winpos.bench.gpu_check_rows NAME [--compiled] [--dry-run] --json OUT.json

bf16 autocast forward and forward+backward seconds per image (batch 1 at 1024^2; 64 px toy models with
``--dry-run``), and what the kernels' first-use self-check did in the process (``winpos.kernels.self_check_report``:
the signatures the model launched, which fell back, and the seconds each check took).
"""
from __future__ import annotations

import argparse
import sys
import time

from ..utils.outputs import atomic_write_json
from .blocked_imports import install_from_env


def _outputs(y):
    if isinstance(y, dict):
        return list(y.values())
    return list(y) if isinstance(y, (list, tuple)) else [y]


def backbones(dry_run: bool) -> dict:
    """Name -> builder of the models the backbone step times."""
    from winpos.backbones import create

    if dry_run:
        return {"winpos ViTDet toy paper": lambda: create("vitdet_toy", "paper", img_size=64, window_size=4),
                "winpos HieraDet toy original": lambda: create("hieradet_toy", "original")}

    def timm_hiera():
        import timm
        import torch.nn as nn

        class Trunk(nn.Module):  # (B, 3, H, W) -> the last stage's features, no classifier
            def __init__(self):
                super().__init__()
                self.net = timm.create_model("sam2_hiera_base_plus", pretrained=False, num_classes=0)

            def forward(self, x):
                return self.net.forward_features(x)

        return Trunk()

    return {"winpos ViTDet-B paper": lambda: create("vitdet_b", "paper"),
            "winpos HieraDet-B+ original": lambda: create("hieradet_bplus", "original"),
            "timm sam2_hiera_base_plus": timm_hiera}


def time_row(name: str, compiled: bool, dry_run: bool) -> dict:
    import torch

    from winpos.bench.cuda_timing import bench

    cuda = torch.cuda.is_available() and not dry_run
    dev = "cuda" if cuda else "cpu"
    size, reps = (64, 1) if dry_run else (1024, 5)
    row = {"model": name, "compiled": compiled, "image_size": size, "batch": 1}
    torch.manual_seed(0)
    model = backbones(dry_run)[name]().to(dev)
    fn = torch.compile(model, fullgraph=False) if compiled else model
    x = torch.randn(1, 3, size, size, device=dev)
    autocast = torch.autocast(dev, dtype=torch.bfloat16, enabled=cuda)

    def fwd():
        with torch.no_grad(), autocast:
            fn(x)

    def fwd_bwd():
        with autocast:
            loss = sum(o.float().mean() for o in _outputs(fn(x)))
        loss.backward()
        model.zero_grad(set_to_none=True)

    t0 = time.time()
    fwd()  # first call: compile, the kernels' first-use checks
    row["first_fwd_s"] = time.time() - t0
    row["fwd_s"] = bench(fwd, reps=reps, warmup=0)["median_ms"] / 1e3
    row["fwd_bwd_s"] = bench(fwd_bwd, reps=reps, warmup=1)["median_ms"] / 1e3
    row["first_call_and_timing_s"] = time.time() - t0
    from winpos.kernels import self_check_report

    row["self_check"] = self_check_report()
    row["status"] = "ok"
    return row


def main(argv=None) -> int:
    install_from_env()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("name")
    p.add_argument("--compiled", action="store_true")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--json", required=True)
    args = p.parse_args(argv)
    if args.name not in backbones(args.dry_run):
        print(f"unknown backbone row {args.name!r}; choose from {', '.join(backbones(args.dry_run))}",
              file=sys.stderr)
        return 2
    row = time_row(args.name, args.compiled, args.dry_run)
    atomic_write_json(args.json, row, indent=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
