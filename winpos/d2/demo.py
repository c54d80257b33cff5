"""The main job on the embedded default: train tiny Mask R-CNNs on the shapes dataset on CPU, evaluate them with
official pycocotools AP, sweep the test resolution, and plot the trained position embeddings.

``tools/run_demo.py`` is the command-line front; every step is a library call tested elsewhere.
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

logger = logging.getLogger("winpos")

CONFIGS = {
    "abswin": "configs/shapes/mask_rcnn_hieradet_tiny_abswin.py",
    "abs": "configs/shapes/mask_rcnn_hieradet_tiny_abs.py",
    "rope": "configs/shapes/mask_rcnn_hieradet_tiny_rope.py",
    "lookhere": "configs/shapes/mask_rcnn_hieradet_tiny_lookhere.py",
    "paper": "configs/shapes/mask_rcnn_hieradet_tiny_paper.py",
}


# The demo trains on the one-class view of the shapes data: within a CPU budget a from-scratch tiny transformer learns
# to find and segment the objects, but not yet to tell the four outlines apart (dataset="shapes" keeps the classes).
DATASETS = {
    "shapes1": ["dataloader.train.dataset.names=shapes1_train", "dataloader.test.dataset.names=shapes1_val",
                "model.roi_heads.num_classes=1"],
    "shapes": [],
}
TRAIN_SIZE = 256


def _root() -> Path:
    return Path(__file__).resolve().parents[2]


def train_and_evaluate(encoding: str, output_dir: Path, max_iter: int | None, sizes, extra=()) -> dict:
    """Train one shapes config (resuming if a checkpoint exists), then evaluate it at each test size."""
    from winpos.d2.config import load_config
    from winpos.d2.engine import do_train, resolve_device
    from winpos.d2.evaluate import evaluate_checkpoint

    if encoding not in CONFIGS:
        raise ValueError(f"unknown encoding {encoding!r} for the demo; choose from {', '.join(CONFIGS)}")
    config = str(_root() / CONFIGS[encoding])
    run_dir = output_dir / encoding
    run_dir.mkdir(parents=True, exist_ok=True)
    overrides = [f"train.output_dir={run_dir}", *extra]
    if max_iter:
        overrides.append(f"train.max_iter={max_iter}")
    cfg = load_config(config, overrides)
    cfg.train.device = resolve_device(cfg)
    t0 = time.time()
    do_train(cfg, resume=True)
    train_s = time.time() - t0
    final = run_dir / "model_final.pth"
    sweep = evaluate_checkpoint(config, str(final), overrides, sizes=sizes, output_dir=str(run_dir / "sweep"),
                                progress=True)
    return {"config": CONFIGS[encoding], "train_seconds": train_s, "checkpoint": str(final),
            "sweep": {str(k): v for k, v in sweep.items()}}


def plot_embeddings(checkpoint: str, out_dir: Path, sizes) -> dict:
    """Measure and plot the trained model's effective position embedding (winpos checkpoint family)."""
    from winpos.diagnostics.report import run_posemb_viz

    return run_posemb_viz([checkpoint], str(out_dir), sizes, progress=False)


def run_demo(output_dir="output/demo", encodings=("abswin", "abs"), max_iter=None, sizes=(192, 256, 320, 384),
             dataset="shapes1") -> dict:
    from winpos.d2.evaluate import plot_sweeps

    if dataset not in DATASETS:
        raise ValueError(f"unknown demo dataset {dataset!r}; choose from {', '.join(DATASETS)}")
    for enc in encodings:
        if enc not in CONFIGS:
            raise ValueError(f"unknown encoding {enc!r} for the demo; choose from {', '.join(CONFIGS)}")
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    summary = {"dataset": dataset}
    for enc in encodings:
        summary[enc] = train_and_evaluate(enc, output_dir, max_iter, sizes, DATASETS[dataset])
    plot_sweeps({enc: summary[enc]["sweep"] for enc in encodings}, str(output_dir / "resolution_sweep.png"),
                train_size=TRAIN_SIZE, title=f"tiny HieraDet Mask R-CNN on {dataset}, trained at {TRAIN_SIZE} px")
    first = encodings[0]
    summary["diagnostics"] = plot_embeddings(summary[first]["checkpoint"], output_dir / "posemb", [256, 384])
    with open(output_dir / "summary.json", "w") as f:
        json.dump(summary, f, indent=2, default=str)
    print_summary(summary, encodings, sizes, output_dir)
    return summary


def print_summary(summary, encodings, sizes, output_dir) -> None:
    print(f"\n=== winpos demo: tiny HieraDet Mask R-CNN on {summary['dataset']} (trained at {TRAIN_SIZE} px, CPU) ===")
    header = "encoding  | " + " | ".join(f"{s:>4}px box/mask AP" for s in sizes)
    print(header)
    for enc in encodings:
        sweep = summary[enc]["sweep"]
        cells = [f"{sweep[str(s)]['bbox']['AP']:6.1f} / {sweep[str(s)]['segm']['AP']:5.1f}" for s in sizes]
        print(f"{enc:9s} | " + " | ".join(f"{c:>18s}" for c in cells) +
              f"   (trained in {summary[enc]['train_seconds'] / 60:.1f} min)")
    print(f"\nresolution sweep (all encodings): {output_dir}/resolution_sweep.png")
    print(f"position-embedding plots: {output_dir}/posemb/*.png; every number: {output_dir}/summary.json")
