"""The window-attention bug and its fixes, end to end at CPU scale (``tools/reproduce.py``).

Protocol (Bolya et al., ICLR 2024, shrunk to the embedded one-class shapes data):

* **Stage 1** pretrains a small HieraDet Mask R-CNN at a low resolution (64 px: a 16x16 token grid attended in
  4x4-token windows) with one position encoding per run: a learned absolute embedding (``abs``), abs-win,
  RoPE, LookHere, or abs + relpos in every block. Its learned embedding is measured with winpos's window
  similarity (WS at the stage-1 window, centred).
* **Stage 2** finetunes each stage-1 detector at ``k`` times the token grid (2x: 128 px, 4x: 256 px), windows
  unchanged, with the same budget for every row and ``seeds`` seeds, and evaluates box / mask AP (pycocotools)
  at that size. Two conditions separate what a larger input changes: ``upscaled`` (the 64 px images resized by
  ``k``: objects grow with the grid) and ``canvas`` (a ``k`` times larger image holding objects of the 64 px
  size at the same density: only the grid grows).

Rows (``ROWS``): (a) ``abs``: the absolute embedding naively interpolated; (b) ``abs2win``: the same checkpoint
converted exactly to abs-win on import (``reproduce_checkpoints.convert_abs_to_abswin``); (a') / (b') the same two for an absolute
embedding that starts window-periodic (``periodic_start``: what Hiera's MAE embedding looks like; a detector
trained from the usual random start for minutes learns a smooth whole-image code instead, WS near 0); (c) ``abswin`` pretrained and finetuned;
(d) ``rope``; (e) ``lookhere``; (f) ``relpos``: abs + relpos in every block, both naively interpolated (ViTDet's
original recipe). Every run is a subprocess with one torch thread, ``workers`` at a time; each writes
``result.json`` atomically when it finishes, so a re-run skips finished runs and resumes unfinished ones.
The checkpoint work (periodic start, conversion, window structure, export) is in ``winpos.d2.reproduce_checkpoints``.
"""
from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from winpos.d2.run_pool import THREADS_FILE
from winpos.d2.run_pool import launch as _launch
from winpos.d2.run_pool import run_pool as _pool
from winpos.errors import WinposError

logger = logging.getLogger(__name__)

PRETRAIN_SIZE = 64
WINDOW = 4  # stage-1 window in tokens (configs/shapes/reproduce_hieradet.py: window_spec[0])
PRETRAIN_SHAPES = dict(image_size=PRETRAIN_SIZE, train_images=2000, val_images=200, min_objects=1, max_objects=6)
CONDITIONS = ("canvas", "upscaled")

# backbone fields of each pretrained encoding
ENCODINGS = {
    "abs": dict(pos_embed="abs", window_pos="none", global_pos="none"),
    "abs_periodic": dict(pos_embed="abs", window_pos="none", global_pos="none"),  # + window-periodic start
    "abs_periodic_strong": dict(pos_embed="abs", window_pos="none", global_pos="none"),  # 5x larger start
    "abswin": dict(pos_embed="abswin", window_pos="none", global_pos="none"),
    "rope": dict(pos_embed="none", window_pos="rope", global_pos="rope"),
    "lookhere": dict(pos_embed="none", window_pos="lookhere", global_pos="lookhere"),
    "relpos": dict(pos_embed="abs", window_pos="relpos", global_pos="relpos"),
}


# (window_std, global_std) of the window-periodic starts (``periodic_start``). The default 0.1 is the scale of the
# embedding a detector learns here from the usual random start; the strong one is that of the patch embedding's
# output (std 0.66 at 64 px), so the detector cannot ignore it.
PERIODIC_STARTS = {"abs_periodic": (0.1, 0.05), "abs_periodic_strong": (0.5, 0.25)}


@dataclass(frozen=True)
class Row:
    label: str
    pretrained: str  # key of ENCODINGS: which stage-1 checkpoint the row starts from
    convert: bool = False  # abs -> abs-win on import


ROWS = {
    "abs": Row("(a) abs, naive interpolation", "abs"),
    "abs2win": Row("(b) abs -> abs-win on import", "abs", convert=True),
    "abs_periodic": Row("(a') periodic-start abs, naive", "abs_periodic"),
    "abs_periodic2win": Row("(b') periodic-start abs -> abs-win", "abs_periodic", convert=True),
    "abs_strong": Row("(a'') strong periodic-start abs, naive", "abs_periodic_strong"),
    "abs_strong2win": Row("(b'') strong periodic-start abs -> abs-win", "abs_periodic_strong", convert=True),
    "abswin": Row("(c) abs-win pretrained", "abswin"),
    "rope": Row("(d) RoPE", "rope"),
    "lookhere": Row("(e) LookHere", "lookhere"),
    "relpos": Row("(f) abs + relpos everywhere, naive", "relpos"),
}


@dataclass
class Protocol:
    """Budgets of one reproduction. ``pretrain_iters`` / ``finetune_iters`` at batch 8."""

    config: str
    output_dir: str = "output/reproduce"
    rows: tuple = tuple(ROWS)
    multipliers: tuple = (2, 4)
    conditions: tuple = CONDITIONS
    seeds: tuple = (0, 1, 2)
    pretrain_iters: int = 1500
    finetune_iters: int = 150
    pretrain_lr: float = 1e-3
    finetune_lr: float = 2e-4
    mim_iters: int = 0  # optional stage 1a: masked-token pretraining (winpos.d2.masked_pretrain)
    zero_shot: bool = True  # also evaluate every stage-2 start without finetuning, and stage 1 without embedding
    workers: int = 2
    stage1_dir: str | None = None  # where stage-1 checkpoints live (default <output_dir>/stage1)
    pretrain_init: str | None = None  # stage 1 continues from this detector checkpoint instead of a fresh start

    def validate(self) -> None:
        bad = [r for r in self.rows if r not in ROWS]
        if bad:
            raise WinposError(f"unknown row(s) {bad}; choose from {', '.join(ROWS)}")
        bad = [c for c in self.conditions if c not in CONDITIONS]
        if bad:
            raise WinposError(f"unknown condition(s) {bad}; choose from {', '.join(CONDITIONS)}")
        for k in self.multipliers:
            check_multiplier(k)
        if not self.seeds:
            raise WinposError("no seeds given; pass at least one, e.g. --seeds 0,1,2")
        if not isinstance(self.mim_iters, int) or self.mim_iters < 0:
            raise WinposError(f"mim_iters={self.mim_iters!r} must be an int >= 0 (0 = no masked-token stage)")
        for name, v in (("pretrain_iters", self.pretrain_iters), ("finetune_iters", self.finetune_iters),
                        ("workers", self.workers)):
            if not isinstance(v, int) or v < 1:
                raise WinposError(f"{name}={v!r} must be a positive int")
        if not isinstance(self.pretrain_lr, (int, float)) or not 0 < self.pretrain_lr < 1:
            raise WinposError(f"pretrain_lr={self.pretrain_lr!r} must be a learning rate in (0, 1), e.g. 1e-3")
        if self.pretrain_init is not None and not os.path.isfile(self.pretrain_init):
            raise WinposError(f"--pretrain-init {self.pretrain_init!r} does not exist; pass a stage-1 detector "
                              "checkpoint (e.g. one written by --export-stage1)")
        if self.pretrain_init is not None and len({ROWS[r].pretrained for r in self.rows}) != 1:
            raise WinposError("--pretrain-init continues one stage-1 detector: pass rows of one pretrained encoding "
                              "(e.g. --rows abs_periodic,abs_periodic2win)")
        if not os.path.isfile(self.config):
            raise WinposError(f"config {self.config!r} does not exist; pass configs/shapes/reproduce_hieradet.py "
                              "from a winpos checkout")


def check_multiplier(k, window: int = WINDOW, pretrain_size: int = PRETRAIN_SIZE) -> int:
    """Image side of stage 2 at ``k`` times the pretraining token grid; the stage-1 windows must tile that grid
    exactly, else the comparison would mix in padded windows."""
    if isinstance(k, bool) or not isinstance(k, (int, float)) or not k >= 1:
        raise WinposError(f"grid multiplier {k!r} must be a number >= 1 (1 = the {pretrain_size // 4}x"
                          f"{pretrain_size // 4} pretraining grid), e.g. 2 or 4")
    grid = pretrain_size // 4 * k
    if grid != int(grid) or int(grid) % window:
        fits = ", ".join(f"{m:g}" for m in (1.25, 1.5, 2, 3, 4))
        raise WinposError(f"grid multiplier {k:g} gives a {grid:g}x{grid:g} token grid that the {window}-token "
                          f"windows do not tile; use a multiplier that keeps it a multiple of {window}, e.g. {fits}")
    return int(grid) * 4


def label(k) -> str:
    """``2`` -> ``"2x"``, ``1.5`` -> ``"1.5x"``."""
    return f"{k:g}x"


def dataset_params(k, condition: str) -> dict:
    """Shapes-generator parameters of the stage-2 data (see the module docstring)."""
    if condition not in CONDITIONS:
        raise WinposError(f"unknown condition {condition!r}; choose from {', '.join(CONDITIONS)}")
    size = check_multiplier(k)
    if condition == "upscaled" or k == 1:
        return dict(PRETRAIN_SHAPES)
    a = k * k  # same density and the same total object count and pixels as the 64 px set
    return dict(image_size=size, object_side=PRETRAIN_SIZE, train_images=math.ceil(2000 / a),
                val_images=max(math.ceil(200 / a), 16), min_objects=round(a), max_objects=round(6 * a))


# ------------------------------------------------------------------------------------------ one run (subprocess)
def _schedule(max_iter: int, warmup: int):
    from detectron2.config import LazyCall as L
    from detectron2.solver import WarmupParamScheduler
    from fvcore.common.param_scheduler import MultiStepParamScheduler

    step = min(round(0.85 * max_iter), max_iter - 1)  # lr x0.1 for the last 15%
    values, milestones = ([1.0, 0.1], [step]) if step >= 1 else ([1.0], [])
    return L(WarmupParamScheduler)(
        scheduler=L(MultiStepParamScheduler)(values=values, milestones=milestones, num_updates=max_iter),
        warmup_length=min(warmup / max_iter, 0.5), warmup_factor=0.001)


def build_cfg(spec: dict):
    """The LazyConfig of one run from its spec (encoding, size, dataset, init, iterations, lr, seed, out dir)."""
    from winpos.d2.config import load_config

    cfg = load_config(spec["config"], [])
    net = cfg.model.backbone.bottom_up
    for key, value in ENCODINGS[spec["encoding"]].items():
        setattr(net, key, value)
    if spec.get("converted"):
        net.pos_embed, net.pos_global_size = "abswin", PRETRAIN_SIZE // 4  # the residual at the 16x16 grid
    size = spec["size"]
    cfg.model.backbone.square_pad = size
    for part in (cfg.dataloader.train, cfg.dataloader.test):
        part.dataset.shapes = dict(spec["shapes"])
        part.mapper.image_size = size
    if spec.get("four_class"):  # the four outlines as classes; the class-specific predictors start afresh
        cfg.dataloader.train.dataset.names, cfg.dataloader.test.dataset.names = "shapes_train", "shapes_val"
        cfg.model.roi_heads.num_classes = 4
    cfg.train.max_iter = spec["iters"]
    cfg.train.seed = spec["seed"]
    cfg.train.output_dir = spec["out"]
    cfg.train.init_checkpoint = spec.get("init", "")
    cfg.train.checkpointer.period = max(spec["iters"] // 4, 50)
    cfg.train.eval_period = 0
    cfg.train.device = "cpu"
    cfg.optimizer.lr = spec["lr"]
    if spec["iters"] > 0:
        cfg.lr_multiplier = _schedule(spec["iters"], spec.get("warmup", 50))
    return cfg


def run_one(spec: dict) -> dict:
    """Train (resuming) and evaluate one run; write ``<out>/result.json`` atomically and return it. Meant for a
    fresh process (``_launch``): the embedded datasets are registered once per process with the spec's sizes."""
    from detectron2.utils.logger import setup_logger

    import winpos.d2  # noqa: F401 - registrations
    from winpos.d2.engine import do_train
    from winpos.outputs import atomic_write

    os.makedirs(spec["out"], exist_ok=True)
    setup_logger(output=os.path.join(spec["out"], "log.txt"), name="detectron2", abbrev_name="d2")
    setup_logger(output=os.path.join(spec["out"], "log.txt"), name="winpos")
    if spec["encoding"] in PERIODIC_STARTS and not spec.get("init"):
        spec = dict(spec, init=os.path.join(spec["out"], "init_periodic.pth"))
        if not os.path.isfile(spec["init"]):
            from winpos.d2.reproduce_checkpoints import periodic_start

            periodic_start(spec, spec["init"], *PERIODIC_STARTS[spec["encoding"]])
    if spec.get("mim_iters") and not spec.get("init"):
        spec = dict(spec, init=os.path.join(spec["out"], "init_masked.pth"))
        if not os.path.isfile(spec["init"]):
            from winpos.d2.masked_pretrain import pretrain_masked

            pretrain_masked(spec, spec["mim_iters"], spec["init"])
    cfg = build_cfg(spec)
    t0 = time.time()
    if spec["iters"] == 0:  # zero-shot: the starting weights evaluated at the new size, no finetuning
        results = evaluate_checkpoint_cfg(cfg, spec["init"], zero_embedding=spec.get("zero_embedding", False))
    else:
        from winpos.d2.engine import ThreadShareHook

        hook = ThreadShareHook(os.path.join(spec["out"], THREADS_FILE))
        results = do_train(cfg, resume=True, extra_hooks=[hook])
    if not results:  # resumed a finished run without a result file: evaluate its final weights
        results = evaluate_checkpoint_cfg(cfg)
    out = {"spec": spec, "seconds": time.time() - t0,
           "bbox": {k: float(v) for k, v in results["bbox"].items()},
           "segm": {k: float(v) for k, v in results["segm"].items()}}
    atomic_write(os.path.join(spec["out"], "result.json"), lambda f: json.dump(out, f, indent=1), "w")
    return out


def evaluate_checkpoint_cfg(cfg, checkpoint: str | None = None, zero_embedding: bool = False) -> dict:
    """Box / mask AP of ``checkpoint`` (default: the run's ``model_final.pth``) on the run's test set;
    ``zero_embedding`` sets the token embedding to zero first (how much the detector relies on it)."""
    import torch

    from winpos.d2.checkpoint import WinposCheckpointer, load_init_checkpoint
    from winpos.d2.engine import build_model
    from winpos.d2.evaluate import evaluate

    model = build_model(cfg)
    load_init_checkpoint(WinposCheckpointer(model), checkpoint or os.path.join(cfg.train.output_dir, "model_final.pth"))
    if zero_embedding:
        zeroed = [p for n, p in model.backbone.bottom_up.net.named_parameters() if n.startswith("pos_embed.")]
        if not zeroed:
            raise WinposError("zero_embedding asks to zero the token embedding, but this model has none")
        with torch.no_grad():
            for param in zeroed:
                param.zero_()
        logger.info(f"token embedding set to zero ({sum(p.numel() for p in zeroed)} values)")
    model.eval()
    return evaluate(cfg, model, os.path.join(cfg.train.output_dir, "inference"), progress=False)


# ------------------------------------------------------------------------------------------------ orchestration
def stage1_spec(p: Protocol, encoding: str) -> dict:
    root = Path(p.stage1_dir or Path(p.output_dir) / "stage1")
    spec = dict(name=f"stage1/{encoding}", config=p.config, encoding=encoding, size=PRETRAIN_SIZE,
                shapes=dict(PRETRAIN_SHAPES), iters=p.pretrain_iters, seed=0, lr=p.pretrain_lr,
                out=str(root / encoding), warmup=50, mim_iters=p.mim_iters)
    if p.pretrain_init:  # a continuation: starts from that detector (no periodic start, no masked stage)
        spec.update(init=str(p.pretrain_init), mim_iters=0)
    return spec


def stage2_spec(p: Protocol, row: str, k: int, condition: str, seed: int) -> dict:
    r = ROWS[row]
    init = str(Path(stage1_spec(p, r.pretrained)["out"]) / "model_final.pth")
    if r.convert:
        init = str(Path(p.output_dir) / "stage2" / f"{r.pretrained}2win_init.pth")
    return dict(name=f"{row}/{condition}/{label(k)}/seed{seed}", config=p.config, encoding=r.pretrained,
                converted=r.convert, size=check_multiplier(k), shapes=dataset_params(k, condition),
                iters=p.finetune_iters, seed=seed, lr=p.finetune_lr, init=init, warmup=20,
                out=str(Path(p.output_dir) / "stage2" / row / condition / label(k) / f"seed{seed}"))


def zero_shot_spec(p: Protocol, row: str, k, condition: str) -> dict:
    """The stage-2 start of ``row`` evaluated at ``k`` times the grid without finetuning (one run: no seed)."""
    spec = stage2_spec(p, row, k, condition, 0)
    spec.update(name=f"{row}/{condition}/{label(k)}/zero-shot", iters=0,
                out=str(Path(p.output_dir) / "stage2" / row / condition / label(k) / "zero-shot"))
    return spec


def no_embedding_spec(p: Protocol, encoding: str) -> dict:
    """The stage-1 detector of ``encoding`` at 64 px with its token embedding set to zero: how much it relies on it."""
    spec = stage1_spec(p, encoding)
    return dict(spec, name=f"stage1/{encoding}/no-embedding", iters=0, zero_embedding=True,
                init=str(Path(spec["out"]) / "model_final.pth"), out=str(Path(spec["out"]) / "no-embedding"))


def run_protocol(p: Protocol, log=print, report_only: bool = False, after_stage1=None) -> dict:
    """Stage 1 for every encoding the rows need, the abs -> abs-win conversion, then every stage-2 run.

    ``report_only``: run nothing; summarize the runs of this protocol that have finished (the summary lists the
    missing ones under ``"missing"``). ``after_stage1``: called with no argument once every stage-1 checkpoint
    exists, before stage 2 (e.g. to export one)."""
    p.validate()
    out_dir = Path(p.output_dir)
    encodings = sorted({ROWS[r].pretrained for r in p.rows})
    t0 = time.time()
    if report_only:
        return _report(p, encodings, log)
    from winpos.outputs import check_output_dir

    check_output_dir(out_dir)  # a re-run resumes in it: its finished runs are kept
    (out_dir / "stage2").mkdir(parents=True, exist_ok=True)
    log(f"stage 1: pretraining {', '.join(encodings)} at {PRETRAIN_SIZE} px, {p.pretrain_iters} iterations each")
    _pool([stage1_spec(p, e) for e in encodings if not (Path(stage1_spec(p, e)["out"]) / "model_final.pth").is_file()
           or not (Path(stage1_spec(p, e)["out"]) / "result.json").is_file()], p.workers, log)
    stage1 = _stage1_info(p, encodings)
    if after_stage1 is not None:
        after_stage1()
    from winpos.d2.reproduce_checkpoints import convert_abs_to_abswin

    for enc in sorted({ROWS[r].pretrained for r in p.rows if ROWS[r].convert}):
        dst = out_dir / "stage2" / f"{enc}2win_init.pth"
        if not dst.is_file():
            convert_abs_to_abswin(stage1[enc]["checkpoint"], str(dst))
    if p.zero_shot:
        diag = [no_embedding_spec(p, e) for e in encodings if stage1[e]["window_structure"] is not None]
        diag += [zero_shot_spec(p, r, k, c) for k in p.multipliers for c in p.conditions for r in p.rows]
        log(f"diagnostics: {len(diag)} evaluations without finetuning (stage 1 without its embedding, every "
            "stage-2 start at its new size)")
        _pool(diag, p.workers, log)
    specs = [stage2_spec(p, r, k, c, s) for k in p.multipliers for c in p.conditions for s in p.seeds for r in p.rows]
    log(f"stage 2: {len(specs)} finetuning runs ({len(p.rows)} rows x {len(p.conditions)} conditions x "
        f"{len(p.multipliers)} grid multipliers x {len(p.seeds)} seeds), {p.finetune_iters} iterations each")
    runs = _pool(specs, p.workers, log)
    if p.zero_shot:
        runs += [json.loads((Path(s["out"]) / "result.json").read_text()) for s in diag if s["iters"] == 0
                 and "zero-shot" in s["name"]]
    return _write_summary(p, stage1, runs, [], time.time() - t0)


def _stage1_info(p: Protocol, encodings, strict: bool = True) -> dict:
    from winpos.d2.reproduce_checkpoints import window_structure

    stage1 = {}
    for e in encodings:
        spec = stage1_spec(p, e)
        final = Path(spec["out"]) / "model_final.pth"
        if not final.is_file() and not strict:  # a report while stage 1 of this encoding has not finished
            stage1[e] = {"checkpoint": None, "window_structure": None, "box_AP_64px": None, "mask_AP_64px": None}
            continue
        if not final.is_file():
            raise WinposError(f"stage-1 checkpoint {final} is missing; delete {spec['out']} and re-run to pretrain it")
        res = Path(spec["out"]) / "result.json"
        ap = json.loads(res.read_text()) if res.is_file() else None
        stage1[e] = {"checkpoint": str(final), "window_structure": window_structure(str(final)),
                     "box_AP_64px": ap["bbox"]["AP"] if ap else None, "mask_AP_64px": ap["segm"]["AP"] if ap else None}
        ablated = Path(no_embedding_spec(p, e)["out"]) / "result.json"
        if ablated.is_file():
            ab = json.loads(ablated.read_text())
            stage1[e]["box_AP_64px_no_embedding"] = ab["bbox"]["AP"]
            stage1[e]["mask_AP_64px_no_embedding"] = ab["segm"]["AP"]
    return stage1


def _report(p: Protocol, encodings, log) -> dict:
    specs = [stage2_spec(p, r, k, c, s) for k in p.multipliers for c in p.conditions for s in p.seeds for r in p.rows]
    if p.zero_shot:
        specs += [zero_shot_spec(p, r, k, c) for k in p.multipliers for c in p.conditions for r in p.rows]
    done = [Path(s["out"]) / "result.json" for s in specs]
    runs = [json.loads(f.read_text()) for f in done if f.is_file()]
    missing = [s["name"] for s, f in zip(specs, done) if not f.is_file()]
    if not runs:
        raise WinposError(f"no finished stage-2 run under {p.output_dir}; run without --report-only first")
    log(f"report of {len(runs)} finished runs ({len(missing)} of the protocol's {len(specs)} not run)")
    return _write_summary(p, _stage1_info(p, encodings, strict=False), runs, missing, None)


def _write_summary(p: Protocol, stage1: dict, runs: list, missing: list, seconds) -> dict:
    from winpos.d2.reproduce_report import compare_pairs, summarize
    from winpos.outputs import atomic_write

    summary = summarize(p, stage1, runs)
    summary["pairs"] = compare_pairs(summary)
    summary["missing"] = missing
    if seconds is not None:
        summary["minutes"] = seconds / 60
    atomic_write(str(Path(p.output_dir) / "results.json"), lambda f: json.dump(summary, f, indent=1), "w")
    return summary
