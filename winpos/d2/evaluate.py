"""COCO evaluation behind ``tools/eval_coco.py``: box and mask AP (APs/APm/APl) with the official pycocotools
(detectron2's ``COCOEvaluator(use_fast_impl=False)``), the same model at several test sizes (resolution sweep:
JSON + PNG plot of AP vs size), and inference speed (images / s at batch 1). Result files are written atomically;
``evaluate_checkpoint`` checks its output folder before any work and replaces earlier results only with ``force``."""
from __future__ import annotations

import copy
import json
import logging
import os
import time

import torch
from detectron2.evaluation import COCOEvaluator, inference_on_dataset
from detectron2.utils import comm

from winpos.d2.data import ensure_registered
from winpos.errors import WinposError
from winpos.outputs import atomic_write, check_output_dir

__all__ = ["build_coco_evaluator", "set_test_size", "evaluate", "evaluate_checkpoint", "resolution_sweep", "plot_sweep",
           "plot_sweeps", "measure_fps"]

logger = logging.getLogger(__name__)


def build_coco_evaluator(dataset_name, tasks=None, output_dir=None, use_fast_impl: bool = False,
                         max_dets_per_image=None, distributed: bool = True, shapes: dict | None = None):
    """``COCOEvaluator`` after making sure ``dataset_name`` is registered (the embedded ``shapes_*`` are
    registered on demand). ``use_fast_impl=False``: the official pycocotools ``COCOeval``."""
    (name,) = ensure_registered(dataset_name, shapes)
    return COCOEvaluator(name, tasks=tasks, distributed=distributed, output_dir=output_dir,
                         use_fast_impl=use_fast_impl, max_dets_per_image=max_dets_per_image)


def set_test_size(cfg, model, size: int) -> None:
    """Evaluate at ``size``: the test mapper resizes the long side to ``size``, and a model that pads batches to a
    fixed square (``square_pad``, 1024 in the LSJ recipes) pads to ``size`` instead."""
    mapper = cfg.dataloader.test.mapper
    if "image_size" in mapper:
        mapper.image_size = int(size)
    else:
        raise WinposError("dataloader.test.mapper has no image_size; use winpos.d2.data.build_test_mapper in the config "
                          "to evaluate at several sizes")
    backbone = getattr(model, "module", model).backbone
    if getattr(backbone, "_square_pad", 0):
        backbone._square_pad = int(size)


def _loader_and_evaluator(cfg, output_dir):
    from detectron2.config import instantiate

    ev = copy.deepcopy(cfg.dataloader.evaluator)
    ev.output_dir = output_dir
    return instantiate(cfg.dataloader.test), instantiate(ev)


def evaluate(cfg, model, output_dir=None, progress: bool = True) -> dict:
    """Run the test set of ``cfg`` through ``model``; returns ``{"bbox": {"AP": ..., "APs": ...}, "segm": ...}``."""
    loader, evaluator = _loader_and_evaluator(cfg, output_dir)
    if progress and comm.is_main_process():
        from tqdm import tqdm

        loader = tqdm(loader, desc="inference", total=len(loader))
    return inference_on_dataset(model, loader, evaluator)


def measure_fps(cfg, model, num_images: int = 50, warmup: int = 5) -> float:
    """Images per second of ``model`` at batch 1 on the first ``num_images`` test images (data loading and
    evaluation excluded; CUDA synchronized)."""
    from detectron2.config import instantiate

    loader = instantiate(cfg.dataloader.test)
    model.eval()
    seen, timed, total = 0, 0, 0.0
    with torch.no_grad():
        for batch in loader:
            if seen >= warmup + num_images:
                break
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            start = time.perf_counter()
            model(batch)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            if seen >= warmup:
                total += time.perf_counter() - start
                timed += 1
            seen += 1
    if timed == 0:
        raise WinposError(f"the test set has {seen} images, not more than warmup={warmup}; use a larger test set")
    return timed / total


def resolution_sweep(cfg, model, sizes, output_dir: str, fps: bool = False, progress: bool = True) -> dict:
    """Evaluate ``model`` at each test size; writes ``{output_dir}/resolution_sweep.json`` and ``.png``.

    Returns ``{size: {"bbox": {...}, "segm": {...}, "fps": float (if fps)}}``.
    """
    sizes = [int(s) for s in sizes]
    if not sizes or any(s <= 0 for s in sizes):
        raise WinposError(f"--sizes must be positive ints such as 512,768,1024, got {sizes}")
    results = {}
    for size in sizes:
        cfg_s = copy.deepcopy(cfg)
        set_test_size(cfg_s, model, size)
        res = evaluate(cfg_s, model, os.path.join(output_dir, f"size_{size}"), progress)
        if fps:
            res["fps"] = measure_fps(cfg_s, model)
        results[size] = res
        aps = ", ".join(f"{t} AP {r['AP']:.2f}" for t, r in res.items() if isinstance(r, dict))
        logger.info(f"size {size}: {aps}")
    if comm.is_main_process():
        os.makedirs(output_dir, exist_ok=True)
        atomic_write(os.path.join(output_dir, "resolution_sweep.json"),
                     lambda f: json.dump({str(k): v for k, v in results.items()}, f, indent=2), "w")
        plot_sweep(results, os.path.join(output_dir, "resolution_sweep.png"))
    return results


def plot_sweep(results: dict, path: str) -> None:
    """Line plot of AP (every task: bbox, segm) against test size, for one model."""
    plot_sweeps({"": results}, path)


def plot_sweeps(runs: dict, path: str, train_size: int | None = None, title: str = "") -> None:
    """AP against test size, one panel per task (bbox, segm), one line per run (``{label: {size: results}}``);
    a dashed vertical line marks the training size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({t for res in runs.values() for r in res.values() for t, v in r.items()
                    if isinstance(v, dict) and "AP" in v})
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.6 * len(tasks), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for label, res in runs.items():
            sizes = sorted(int(s) for s in res)
            by_int = {int(k): v for k, v in res.items()}
            ax.plot(sizes, [by_int[s][task]["AP"] for s in sizes], marker="o",
                    label=f"{label} {task} AP".strip() if len(runs) == 1 else label)
            ax.set_xticks(sizes)
        if train_size:
            ax.axvline(train_size, color="grey", linestyle="--", linewidth=1, label=f"train size {train_size}")
        ax.set_xlabel("test image size (px)")
        ax.set_ylabel(f"{task} AP")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, dpi=120, format=os.path.splitext(path)[1][1:] or "png"), "wb")
    plt.close(fig)


def evaluate_checkpoint(config_file, checkpoint: str = "", overrides=(), sizes=None, fps: bool = False,
                        output_dir=None, test_dataset=None, progress: bool = True, force: bool = False) -> dict:
    """Load ``config_file`` (+ strict ``overrides``), build its model with ``checkpoint`` (default
    ``train.init_checkpoint``), and evaluate on its test set (or ``test_dataset``).

    Without ``sizes``: returns ``{"bbox": {...}, "segm": {...}[, "fps": float]}`` and writes ``results.json``.
    With ``sizes``: ``resolution_sweep`` (``{size: results}``; JSON + PNG). Output goes to ``output_dir``
    (default ``<train.output_dir>/eval``); result files already there are refused unless ``force``.
    Raises WinposError without weights (``checkpoint`` empty and no ``train.init_checkpoint``).
    """
    from winpos.d2.checkpoint import WinposCheckpointer, load_init_checkpoint
    from winpos.d2.config import load_config
    from winpos.d2.engine import build_model, resolve_device

    cfg = load_config(config_file, overrides)
    cfg.train.device = resolve_device(cfg)
    if test_dataset:
        cfg.dataloader.test.dataset.names = test_dataset
    if "evaluator" not in cfg.dataloader:
        raise WinposError(f"{config_file} has no dataloader.evaluator; add build_coco_evaluator to the config")
    cfg.dataloader.evaluator.dataset_name = cfg.dataloader.test.dataset.names
    checkpoint = checkpoint or cfg.train.init_checkpoint
    if not checkpoint:
        raise WinposError("no weights to evaluate: pass --checkpoint or set train.init_checkpoint")
    output_dir = output_dir or os.path.join(cfg.train.output_dir, "eval")
    planned = ["resolution_sweep.json", "resolution_sweep.png"] if sizes else ["results.json"]
    check_output_dir(output_dir, planned=planned, force=force)
    model = build_model(cfg)
    load_init_checkpoint(WinposCheckpointer(model), checkpoint)
    model.eval()
    if sizes:
        return resolution_sweep(cfg, model, sizes, output_dir, fps=fps, progress=progress)
    results = dict(evaluate(cfg, model, output_dir, progress))
    if fps:
        results["fps"] = measure_fps(cfg, model)
    if comm.is_main_process():
        os.makedirs(output_dir, exist_ok=True)
        atomic_write(os.path.join(output_dir, "results.json"), lambda f: json.dump(results, f, indent=2), "w")
    return results
