"""COCO evaluation behind ``tools/eval_coco.py``: box and mask AP (APs/APm/APl) with the official pycocotools
(detectron2's ``COCOEvaluator(use_fast_impl=False)``), the same model at several test sizes (resolution sweep:
JSON + PNG plot of AP vs size), and inference speed (images / s at batch 1).

Every result file is written atomically, detectron2's own included: ``StagedCOCOEvaluator`` lets
``COCOEvaluator`` write ``instances_predictions.pth`` and ``coco_instances_results.json`` into a private staging
folder and renames them into place only when both are complete, so a full disk or a kill leaves the previous files
as they were (a failed write is one ``WriteError`` line naming the folder). ``evaluate_checkpoint`` claims its
output folder before any work (``winpos.utils.output_folders.claim_output_dir``: locked while it writes; earlier
results are replaced only with ``force``, which first removes what the earlier evaluation wrote there, as its
manifest lists)."""
from __future__ import annotations

import copy
import json
import logging
import os
import shutil
import tempfile
import time

import torch
from detectron2.evaluation import COCOEvaluator, inference_on_dataset
from detectron2.utils import comm

from omegaconf import OmegaConf

from winpos.d2.data import ensure_registered
from winpos.d2.own_data import check_dataset_content, check_num_classes
from winpos.d2.train_loop import eval_autocast
from winpos.errors import WinposError
from winpos.utils.output_folders import STAGING_PREFIX, claim_output_dir, publish_folder, refuse_links
from winpos.utils.outputs import as_write_error, atomic_savefig, atomic_write, check_output_dir, refuse_linked_folders

__all__ = ["build_coco_evaluator", "StagedCOCOEvaluator", "set_test_size",
           "evaluate", "evaluate_checkpoint", "resolution_sweep", "plot_sweep",
           "plot_sweeps", "measure_fps", "sweep_table", "load_sweeps"]

logger = logging.getLogger(__name__)


def build_coco_evaluator(dataset_name, tasks=None, output_dir=None, use_fast_impl: bool = False,
                         max_dets_per_image=None, distributed: bool = True, shapes: dict | None = None):
    """``COCOEvaluator`` after making sure ``dataset_name`` is registered (the embedded ``shapes_*`` are
    registered on demand). ``use_fast_impl=False``: the official pycocotools ``COCOeval``."""
    (name,) = ensure_registered(dataset_name, shapes)
    return StagedCOCOEvaluator(name, tasks=tasks, distributed=distributed, output_dir=output_dir,
                         use_fast_impl=use_fast_impl, max_dets_per_image=max_dets_per_image)


class StagedCOCOEvaluator(COCOEvaluator):
    """``COCOEvaluator`` whose files reach ``output_dir`` whole or not at all.

    ``evaluate`` points detectron2's writer at a staging folder inside ``output_dir`` (same file system) and moves
    each file into place with ``os.replace`` once every one is written. A write that fails leaves the previous
    files untouched, removes the staging folder and raises ``winpos.utils.outputs.WriteError`` saying so.
    """

    def evaluate(self, img_ids=None):
        final = self._output_dir
        if not final or not comm.is_main_process():  # only the main process writes (the others return early)
            return super().evaluate(img_ids)
        refuse_linked_folders(os.path.join(final, "coco_instances_results.json"))  # a linked size_96/: refused
        os.makedirs(final, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=final)
        self._output_dir = staging
        try:
            results = super().evaluate(img_ids)
            publish_folder(staging, final)
        except Exception as e:
            state = "the previous files there are unchanged" if any(
                os.path.exists(os.path.join(final, n)) for n in ("instances_predictions.pth",
                                                                  "coco_instances_results.json")) \
                else "nothing was written"
            error = as_write_error(e, f"could not write the evaluation files into {final}", state)
            if error is not None:
                raise error from e
            raise
        finally:
            self._output_dir = final
            shutil.rmtree(staging, ignore_errors=True)
        return results


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
    """Run the test set of ``cfg`` through ``model``; returns ``{"bbox": {"AP": ..., "APs": ...}, "segm": ...}``.
    With ``train.amp.eval`` the model runs under autocast in ``train.amp.precision`` (as training's evaluation)."""
    loader, evaluator = _loader_and_evaluator(cfg, output_dir)
    if progress and comm.is_main_process():
        from tqdm import tqdm

        loader = tqdm(loader, desc="inference", total=len(loader))
    with eval_autocast(cfg, model):
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


def resolution_sweep(cfg, model, sizes, output_dir: str, fps: bool = False, progress: bool = True,
                     label: str = "", compare: dict | None = None, title: str = "", warmup: int = 5) -> dict:
    """Evaluate ``model`` at each test size; writes ``{output_dir}/resolution_sweep.json`` and ``.png`` (titled
    ``title``, this run drawn as ``label`` next to the ``compare`` runs ``{label: {size: results}}``, the training
    size marked). Each size's AP tables are logged under a ``== test size N px ==`` header, and a size x AP table
    follows the last.

    Returns ``{size: {"bbox": {...}, "segm": {...}, "fps": float (if fps)}}``.
    """
    sizes = [int(s) for s in sizes]
    if not sizes or any(s <= 0 for s in sizes):
        raise WinposError(f"--sizes must be positive ints such as 512,768,1024, got {sizes}")
    results = {}
    for size in sizes:
        cfg_s = copy.deepcopy(cfg)
        set_test_size(cfg_s, model, size)
        logger.info(f"== test size {size} px ==")
        res = evaluate(cfg_s, model, os.path.join(output_dir, f"size_{size}"), progress)
        if fps:
            res["fps"] = measure_fps(cfg_s, model, warmup=warmup)
        results[size] = res
    logger.info("AP by test size" + (f" ({label})" if label else "") + ":\n" + sweep_table(results))
    if comm.is_main_process():
        os.makedirs(output_dir, exist_ok=True)
        atomic_write(os.path.join(output_dir, "resolution_sweep.json"),
                     lambda f: json.dump(_json_safe({str(k): v for k, v in results.items()}), f, indent=2), "w")
        train_size = OmegaConf.select(cfg, "dataloader.train.mapper.image_size", default=None)
        runs = {label or "this run": results, **(compare or {})}
        plot_sweeps(runs, os.path.join(output_dir, "resolution_sweep.png"), train_size=train_size, title=title)
    return results


def sweep_table(results: dict) -> str:
    """A size x AP text table of ``{size: {"bbox": {"AP": ...}, "segm": {...}[, "fps"]}}``."""
    tasks = sorted({t for r in results.values() for t, v in r.items() if isinstance(v, dict) and "AP" in v})
    names = {"bbox": "box AP", "segm": "mask AP"}
    head = ["size (px)"] + [names.get(t, f"{t} AP") for t in tasks] + (["images/s"] if any("fps" in r for r in
                                                                                        results.values()) else [])
    rows = [head]
    for size in sorted(results, key=lambda k: int(k) if str(k).isdigit() else -1):
        r = results[size]
        row = [str(size)] + [_fmt(r.get(t, {}).get("AP")) for t in tasks]
        if len(head) > len(tasks) + 1:
            row.append(_fmt(r.get("fps")))
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows)


def _fmt(value) -> str:
    return "-" if value is None or value != value else f"{value:.2f}"  # NaN (no object of that size): "-"


def _json_safe(obj):
    """NaN (pycocotools' AP of an empty size range) as null: strict JSON readers refuse NaN."""
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return None if isinstance(obj, float) and obj != obj else obj


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
            ax.plot(sizes, [by_int[s].get(task, {}).get("AP", float("nan")) for s in sizes], marker="o",
                    label=f"{label} {task} AP".strip() if len(runs) == 1 else label)
        ax.set_xticks(sorted({int(s) for res in runs.values() for s in res}))  # every run's sizes
        if train_size:
            ax.axvline(train_size, color="grey", linestyle="--", linewidth=1, label=f"train size {train_size} px")
        ax.set_xlabel("test image size (px)")
        name = {"bbox": "box AP", "segm": "mask AP"}.get(task, f"{task} AP")
        ax.set_ylabel(name)
        ax.set_title(f"{name} by test size", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=120)
    plt.close(fig)


def load_sweeps(specs) -> dict:
    """``["LABEL=path/resolution_sweep.json", ...]`` -> ``{LABEL: {size: results}}``, each file read and checked
    before any work (a missing or foreign file is a WinposError naming it)."""
    runs = {}
    for spec in specs or ():
        label, eq, path = spec.partition("=")
        if not eq or not label or not path:
            raise WinposError(f"--compare {spec!r} must look like LABEL=path/to/resolution_sweep.json")
        try:
            with open(path) as f:
                data = json.load(f)
        except OSError as e:
            raise WinposError(f"--compare {spec}: cannot read {path} ({e.strerror or e}); pass the "
                              "resolution_sweep.json of an earlier eval_coco.py --sizes run") from e
        except json.JSONDecodeError as e:
            raise WinposError(f"--compare {spec}: {path} is not JSON ({e}); pass a resolution_sweep.json") from e
        if not isinstance(data, dict) or not data or not all(str(k).isdigit() and isinstance(v, dict)
                                                             for k, v in data.items()):
            raise WinposError(f"--compare {spec}: {path} is not a resolution sweep ({{size: results}}); pass the "
                              "resolution_sweep.json of an eval_coco.py --sizes run")
        runs[label] = data
    return runs


def _run_label(cfg) -> str:
    for key in ("model.backbone.net", "model.backbone.bottom_up"):
        node = OmegaConf.select(cfg, key, default=None)
        if node is not None and "recipe" in node and "net" in node:
            return f"{node.net} {node.recipe}"
    return ""


def _count_test_images(cfg) -> int:
    from detectron2.data import DatasetCatalog

    names = cfg.dataloader.test.dataset.names
    names = ensure_registered(names)
    return sum(len(DatasetCatalog.get(n)) for n in names)


def evaluate_checkpoint(config_file, checkpoint: str = "", overrides=(), sizes=None, fps: bool = False,
                        output_dir=None, test_dataset=None, progress: bool = True, force: bool = False,
                        warmup: int = 5, label: str = "", compare=()) -> dict:
    """Load ``config_file`` (+ strict ``overrides``), build its model with ``checkpoint`` (default
    ``train.init_checkpoint``), and evaluate on its test set (or ``test_dataset``).

    Without ``sizes``: returns ``{"bbox": {...}, "segm": {...}[, "fps": float]}`` and writes ``results.json``.
    With ``sizes``: ``resolution_sweep`` (``{size: results}``; JSON + PNG). Output goes to ``output_dir``
    (default ``<train.output_dir>/eval``); result files already there are refused unless ``force``.
    ``warmup``: images run before the ``fps`` timing starts; ``label`` / ``compare`` (``LABEL=sweep.json``
    strings): the sweep plot's line for this run (default: preset and recipe) and earlier sweeps drawn with it.
    Raises WinposError before any work without weights (``checkpoint`` empty and no ``train.init_checkpoint``),
    for a class count that differs from the test dataset's, or for ``fps`` on a test set not larger than ``warmup``.
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
    check_output_dir(output_dir, planned=planned, force=force)  # at once; claimed (locked, cleared) before writing
    compare_runs = load_sweeps(compare)
    if compare_runs and not sizes:
        raise WinposError("--compare draws earlier sweeps next to this one: it needs --sizes")
    check_num_classes(cfg, ("test",))
    check_dataset_content(cfg, ("test",))
    if fps:
        n = _count_test_images(cfg)
        if n <= warmup:
            raise WinposError(f"--fps: the test set has {n} images, not more than --warmup {warmup}; lower --warmup "
                              f"(e.g. --warmup {max(0, n - 2)}) or use a larger test set")
    model = build_model(cfg)
    load_init_checkpoint(WinposCheckpointer(model), checkpoint)
    model.eval()
    # last of the checks, first of the writes: the folder is held from here until the process ends
    claim = claim_output_dir(output_dir, planned=planned + ["instances_predictions.pth", "coco_instances_results.json"],
                             force=force)
    if sizes:  # a size's folder that is a link (moved away, linked back) is refused before any work
        refuse_links(output_dir, [f"size_{int(s)}" for s in sizes])
        label = label or _run_label(cfg)
        title = f"{os.path.basename(str(config_file))}\n{os.path.basename(str(checkpoint))}"
        results = resolution_sweep(cfg, model, sizes, output_dir, fps=fps, progress=progress, label=label,
                                   compare=compare_runs, title=title, warmup=warmup)
    else:
        results = dict(evaluate(cfg, model, output_dir, progress))
        if fps:
            results["fps"] = measure_fps(cfg, model, warmup=warmup)
        if comm.is_main_process():
            os.makedirs(output_dir, exist_ok=True)
            atomic_write(os.path.join(output_dir, "results.json"),
                         lambda f: json.dump(_json_safe(results), f, indent=2), "w")
    removed = claim.finish()  # the earlier outputs this evaluation did not write again (with force)
    if removed:
        logger.info(f"removed {len(removed)} earlier outputs of {output_dir} (--force): {', '.join(removed[:4])}")
    return results


if __name__ == "__main__":  # a library module: name the command instead of exiting 0 having done nothing
    print("error: winpos.d2.evaluate is a library module, not a command; run winpos-eval (--help says how)",
          file=__import__("sys").stderr)
    raise SystemExit(2)
