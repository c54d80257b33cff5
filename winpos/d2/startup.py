"""What a training run is about to do, said once when it starts, and the batch arithmetic it rests on.

A COCO recipe fixes the total batch (64 images per optimizer step). Spread over ``world_size`` processes and
``train.grad_accum_steps`` micro-batches per step, each process sees ``total / (world_size x accum)`` images per
micro-batch; a total that this does not divide is refused before anything is built. ``start_up_block`` is the one
block ``tools/train_net.py`` logs at start: processes, images per GPU per micro-batch, accumulation steps, total
batch, iterations, epochs, AMP dtype, init checkpoint and recipe.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from omegaconf import OmegaConf

from winpos.errors import WinposError

__all__ = ["BatchPlan", "batch_plan", "plan_of", "start_up_block", "check_before_launch", "check_coco_present",
           "check_schedule", "COCO_EPOCH_IMAGES"]

COCO_EPOCH_IMAGES = 118000  # detectron2's epoch arithmetic for coco_2017_train: 184375 x 64 / 118000 = 100 epochs
RECIPE_KEYS = ("model.backbone.net", "model.backbone.bottom_up")  # ViTDet (SimpleFeaturePyramid) / HieraDet (FPN)


@dataclass(frozen=True)
class BatchPlan:
    """``total`` images per optimizer step = ``world_size`` processes x ``accum`` micro-batches x ``per_gpu``."""

    total: int
    world_size: int
    accum: int

    @property
    def per_gpu(self) -> int:
        return self.total // (self.world_size * self.accum)

    @property
    def micro_total(self) -> int:
        """Images per micro-batch over all processes (what the train loader is asked for)."""
        return self.total // self.accum


def batch_plan(total: int, world_size: int, accum: int = 1) -> BatchPlan:
    """Check that ``total`` images split evenly over ``world_size`` processes and ``accum`` micro-batches."""
    if not isinstance(accum, int) or accum < 1:
        raise WinposError(f"train.grad_accum_steps={accum!r} must be a positive integer (1: no accumulation)")
    if not isinstance(total, int) or total < 1:
        raise WinposError(f"dataloader.train.total_batch_size={total!r} must be a positive integer")
    if total % (world_size * accum):
        fits = [a for a in range(1, total + 1) if total % (world_size * a) == 0]
        fix = (f"choose train.grad_accum_steps in {fits}" if fits else
               f"choose a total batch that {world_size} processes divide")
        raise WinposError(f"dataloader.train.total_batch_size={total} cannot be made by {world_size} processes x "
                          f"{accum} accumulation steps ({total} / {world_size * accum} is not a whole number of "
                          f"images per GPU); {fix}")
    return BatchPlan(total, world_size, accum)


def plan_of(cfg, world_size: int) -> BatchPlan:
    """The ``BatchPlan`` of a loaded training config on ``world_size`` processes."""
    accum = OmegaConf.select(cfg, "train.grad_accum_steps", default=1)
    return batch_plan(cfg.dataloader.train.total_batch_size, world_size, accum)


def check_schedule(cfg) -> None:
    """Refuse, in one line each, schedule values that detectron2 and fvcore would meet with a ZeroDivisionError, a
    bare assertion or a torch traceback mid-run, or silently skip: ``train.max_iter``, ``train.checkpointer.period``
    and ``train.log_period`` below 1, ``train.checkpointer.max_to_keep`` below 1, ``train.eval_period`` below 0, and
    an ``optimizer.lr`` that is not a finite positive number."""
    import math

    def whole(key, low, meaning, optional=False):
        value = OmegaConf.select(cfg, key, default=None)
        if value is None and optional:
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise WinposError(f"{key}={value!r} must be an integer >= {low} ({meaning})")

    whole("train.max_iter", 1, "the number of iterations to train; --eval-only evaluates without training")
    whole("train.checkpointer.period", 1, "iterations between checkpoints; a period longer than the run saves only "
          "model_final.pth")
    whole("train.log_period", 1, "iterations between metrics lines")
    whole("train.checkpointer.max_to_keep", 1, "how many periodic checkpoints to keep; None keeps them all",
          optional=True)
    whole("train.eval_period", 0, "iterations between evaluations; 0 evaluates only after training", optional=True)
    lr = OmegaConf.select(cfg, "optimizer.lr", default=None)
    if lr is not None and (isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr)
                           or lr <= 0):
        raise WinposError(f"optimizer.lr={lr!r} must be a finite number > 0 (e.g. optimizer.lr=1e-4)")


def _amp(cfg) -> str:
    if not OmegaConf.select(cfg, "train.amp.enabled", default=False):
        return "off (fp32)"
    precision = OmegaConf.select(cfg, "train.amp.precision", default="bf16")
    return "fp16 with a GradScaler (detectron2's AMPTrainer)" if precision in ("fp16", "float16") else \
        f"{precision} (no grad scaling)"


def _recipe(cfg) -> str:
    for key in RECIPE_KEYS:
        node = OmegaConf.select(cfg, key, default=None)
        if node is not None and "recipe" in node:
            return f"{node.get('net')} recipe={node.recipe}"
    return "not a winpos backbone"


def _epochs(cfg, plan: BatchPlan, epoch_images: int | None) -> str:
    names = OmegaConf.select(cfg, "dataloader.train.dataset.names", default=None)
    if epoch_images is None and names == "coco_2017_train":
        epoch_images = COCO_EPOCH_IMAGES
    if not epoch_images:
        return "unknown here (dataset size is known once it is loaded)"
    return f"{cfg.train.max_iter * plan.total / epoch_images:.1f} of {epoch_images} images"


def _schedule(cfg) -> str:
    """The lr multiplier in this run's iterations. detectron2 reads the schedule as fractions of the run, so a
    ``train.max_iter`` override scales every step and the warm-up with it: a COCO recipe's 250-iteration warm-up
    becomes under one iteration of a 300-iteration finetune; this row says so before the run."""
    node = OmegaConf.select(cfg, "lr_multiplier", default=None)
    sched = OmegaConf.select(cfg, "lr_multiplier.scheduler", default=None)
    try:
        max_iter = int(cfg.train.max_iter)
        warm = float(node.warmup_length) * max_iter
        total = int(sched.num_updates)
        steps = [math.ceil(m * max_iter / total - 1e-9) for m in sched.milestones]  # first iteration at it
        values = [float(v) for v in sched["values"]]
    except (AttributeError, KeyError, TypeError, ValueError):
        target = getattr(node, "_target_", None) if node is not None else None
        return f"as configured ({getattr(target, '__name__', target)})"
    parts = [f"warm-up {warm:.3g} iterations" + (" (scaled with train.max_iter: set lr_multiplier.warmup_length "
                                                  "to lengthen it)" if 0 < warm < 10 else "")]
    parts += [f"x{v:g} from iteration {it}" for it, v in zip(steps, values[1:]) if it < max_iter]  # 0-based
    return ", ".join(parts)


def _frozen(cfg) -> tuple:
    from winpos.d2.freeze import freeze_prefixes

    return freeze_prefixes(OmegaConf.select(cfg, "train.freeze", default=None))


def start_up_block(cfg, world_size: int, device: str = "cuda", epoch_images: int | None = None) -> str:
    """The run's plan in one block (raises WinposError, as ``batch_plan``, for a batch that cannot be made)."""
    plan = plan_of(cfg, world_size)
    procs = f"{world_size} GPU{'s' if world_size > 1 else ''}" if str(device).startswith("cuda") else \
        f"{world_size} CPU process{'es' if world_size > 1 else ''}"
    rows = [
        ("processes", procs),
        ("images per GPU per micro-batch", plan.per_gpu),
        ("accumulation steps", plan.accum),
        ("total batch", f"{plan.total} = {world_size} x {plan.accum} x {plan.per_gpu}"),
        ("iterations", cfg.train.max_iter),
        ("lr schedule", _schedule(cfg)),
        ("epochs", _epochs(cfg, plan, epoch_images)),
        ("AMP", _amp(cfg)),
        ("init checkpoint", OmegaConf.select(cfg, "train.init_checkpoint", default="") or "none (random init)"),
        ("backbone", _recipe(cfg)),
        ("frozen", ", ".join(_frozen(cfg)) or "nothing (every parameter trains)"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(["training plan:"] + [f"  {k:<{width}}  {v}" for k, v in rows])


def check_coco_present(cfg) -> None:
    """Refuse in one line a config whose builtin COCO dataset (``coco_*`` names, registered by detectron2 under
    ``$DETECTRON2_DATASETS/coco``) is not on disk, naming the variable, instead of a file error from deep inside."""
    import os

    from detectron2.data import DatasetCatalog, MetadataCatalog

    for key in ("dataloader.train.dataset.names", "dataloader.test.dataset.names"):
        names = OmegaConf.select(cfg, key, default=None)
        for name in [names] if isinstance(names, str) else list(names or ()):
            if not str(name).startswith("coco_") or name not in DatasetCatalog.list():
                continue
            meta = MetadataCatalog.get(name)
            missing = [p for p in (meta.get("json_file", None), meta.get("image_root", None))
                       if p and not os.path.exists(p)]
            if missing:
                root = os.environ.get("DETECTRON2_DATASETS", "datasets (the default)")
                raise WinposError(f"dataset {name}: {missing[0]} does not exist; COCO is read from "
                                  f"$DETECTRON2_DATASETS/coco (DETECTRON2_DATASETS={root}): set DETECTRON2_DATASETS "
                                  "to the folder holding coco/annotations, coco/train2017 and coco/val2017")


def check_before_launch(args) -> None:
    """Refuse, before any process starts, a total batch that ``--num-gpus x --num-machines`` processes and the
    config's accumulation cannot make, schedule values that cannot run (``check_schedule``), and a COCO dataset
    that is not on disk (a refusal inside launched processes would be one traceback per rank)."""
    from winpos.d2.config import load_config

    cfg = load_config(args.config_file, args.opts)
    if not getattr(args, "eval_only", False):
        plan_of(cfg, args.num_gpus * args.num_machines)
        check_schedule(cfg)
    check_coco_present(cfg)


def console_logging(*names: str) -> None:
    """Send the named loggers (default: winpos's and detectron2's) to the console, as the command-line tools show
    them."""
    from detectron2.utils.logger import setup_logger

    for name in names or ("winpos", "detectron2"):
        setup_logger(name=name)
