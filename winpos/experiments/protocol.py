"""The definitions of the reproduction of "Window Attention is Bugged" at CPU scale: sizes, encodings, rows,
conditions, the ``Protocol`` and the spec of every run. Every other module of ``winpos.experiments`` imports this
one; it imports none of them.

Stages (``tools/reproduce.py``):

* **Stage 0** (``winpos.experiments.pretrain``): a unit-layout autoencoder (nothing masked; the masked variant is
  labelled ``hiera_mae``, and neither is Hiera's MAE) pretraining the backbone at 64 px from a
  random-start absolute embedding, mask units = the 4x4-token stage-1 windows. Its embedding *learns* a window
  pattern (``abs_learned``).
* **Stage 1** trains a small HieraDet Mask R-CNN at 64 px (a 16x16 token grid at stride 4, 4x4-token windows in
  stage 1, 2x2 in stage 2, global attention in stages 3 and 4) per pretrained encoding, from the stage-0 backbone
  where there is one.
* **Stage 2** evaluates each stage-1 detector at ``k`` times its token grid without finetuning (zero-shot) and
  finetunes it there for ``seeds`` seeds. Conditions: ``canvas`` (the primary one: a ``k`` times larger image
  holding objects of the 64 px size at the same density, so only the grid grows) and ``upscaled`` (the 64 px
  images resized by ``k``: objects grow with the grid). The windows stay 4x4 tokens; the global stages stay
  global at every size (``window_spec`` 0), so the position embedding is the only thing that can misalign.

Rows (``ROWS``), all from one stage-1 detector per pretrained encoding:
(a) ``naive``: the learned absolute embedding, bicubic-interpolated (the bug); (b) ``abs2win``: the same weights
converted exactly to abs-win on import (window part = mean of the window tiles, tiled at any size; residual
interpolated); (c) ``control``: naive plus a zero-initialised tiled window parameter, the extra parameter (b) has
after finetuning without the conversion; (d) ``recursive``: the paper's HieraDet form, the whole 16x16 embedding
tiled with its own period; (e) ``rope``, (f) ``lookhere``, (g) ``relpos`` (abs + relpos in every block,
naively interpolated: ViTDet's original), each trained with its encoding in stage 1 from the same stage-0 trunk;
(p) / (p') ``planted`` / ``planted2win``: an embedding whose window pattern was *planted* at the start of
stage 1 (no stage 0), naive and converted: the labelled positive control.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from winpos.errors import WinposError

PRETRAIN_SIZE = 64
WINDOW = 4  # stage-1 window in tokens (configs/shapes/reproduce_hieradet.py: window_spec[0])
GRID = PRETRAIN_SIZE // 4  # 16x16 tokens at stride 4
PRETRAIN_SHAPES = dict(image_size=PRETRAIN_SIZE, train_images=2000, val_images=200, min_objects=1, max_objects=6)
CONDITIONS = ("canvas", "upscaled")
MULTIPLIERS = (1.25, 1.5, 2, 4)
EMBED_KEY = "backbone.bottom_up.net.pos_embed."

# backbone fields of each stage-1 encoding; ``stage0``: whether stage 1 starts from the stage-0 trunk
ENCODINGS = {
    "abs_learned": dict(pos_embed="abs", window_pos="none", global_pos="none"),
    "abs_planted": dict(pos_embed="abs", window_pos="none", global_pos="none"),
    "rope": dict(pos_embed="none", window_pos="rope", global_pos="rope"),
    "lookhere": dict(pos_embed="none", window_pos="lookhere", global_pos="lookhere"),
    "relpos": dict(pos_embed="abs", window_pos="relpos", global_pos="relpos"),
}
STAGE0_TRUNK = {"abs_learned", "rope", "lookhere", "relpos"}  # start from the stage-0 backbone (not its embedding
# for rope / lookhere, which have none; relpos keeps it and learns its tables in stage 1)
PLANTED_START = (0.5, 0.25)  # (window_std, global_std) of the planted window-periodic start (the positive control)

# How a row's stage-2 model is made from its stage-1 checkpoint: ``None`` (as trained) or a conversion of the
# absolute embedding (``winpos.experiments.checkpoints.CONVERSIONS``).
@dataclass(frozen=True)
class Row:
    label: str
    pretrained: str  # key of ENCODINGS
    convert: str | None = None  # "abswin", "control" or "recursive"


ROWS = {
    "naive": Row("(a) abs, naive interpolation", "abs_learned"),
    "abs2win": Row("(b) abs -> abs-win on import", "abs_learned", "abswin"),
    "control": Row("(c) naive + zero-init tiled window", "abs_learned", "control"),
    "recursive": Row("(d) abs -> recursive abs-win", "abs_learned", "recursive"),
    "rope": Row("(e) RoPE", "rope"),
    "lookhere": Row("(f) LookHere", "lookhere"),
    "relpos": Row("(g) abs + relpos, naive", "relpos"),
    "planted": Row("(p) planted pattern, naive [positive control]", "abs_planted"),
    "planted2win": Row("(p') planted pattern -> abs-win [positive control]", "abs_planted", "abswin"),
}
# the pairs the report tests, (treatment, baseline): the headline pair first
PAIRS = (("abs2win", "naive"), ("abs2win", "control"), ("recursive", "naive"), ("planted2win", "planted"))


def _no_duplicates(name: str, values) -> tuple:
    values = tuple(values)
    seen = [v for i, v in enumerate(values) if v in values[:i]]
    if seen:
        raise WinposError(f"{name} lists {sorted(set(map(str, seen)))} more than once; each must appear once "
                          "(a repeated seed or condition is not another independent run)")
    return values


@dataclass
class Protocol:
    """One reproduction: what runs and with which budgets (``*_iters`` at batch 8 for detection, 32 for stage 0)."""

    config: str
    output_dir: str = "output/reproduce"
    rows: tuple = tuple(ROWS)
    multipliers: tuple = MULTIPLIERS
    conditions: tuple = CONDITIONS
    seeds: tuple = (0, 1, 2, 3, 4)
    stage0_iters: int = 800  # the documented run (docs/reproduce.md)
    stage0_mask_ratio: float = 0.0  # the unit-layout autoencoder: nothing masked
    pretrain_iters: int = 2000
    finetune_iters: int = 150
    pretrain_lr: float = 1e-3
    finetune_lr: float = 2e-4
    stage1_seed: int = 0
    zero_shot: bool = True
    finetune: bool = True
    workers: int = 2
    threads: int = 1  # torch threads of every run, fixed from its start to its end
    stage1_dir: str | None = None
    extra: dict = field(default_factory=dict)

    def validate(self) -> None:
        for name in ("rows", "multipliers", "conditions", "seeds"):
            values = _no_duplicates(name, getattr(self, name))
            if not values:
                raise WinposError(f"{name} is empty: the protocol would run nothing; pass at least one")
        bad = [r for r in self.rows if r not in ROWS]
        if bad:
            raise WinposError(f"unknown row(s) {bad}; choose from {', '.join(ROWS)}")
        bad = [c for c in self.conditions if c not in CONDITIONS]
        if bad:
            raise WinposError(f"unknown condition(s) {bad}; choose from {', '.join(CONDITIONS)}")
        for k in self.multipliers:
            check_multiplier(k)
        for s in self.seeds:
            if isinstance(s, bool) or not isinstance(s, int) or s < 0:
                raise WinposError(f"seed {s!r} must be an int >= 0")
        for name in ("stage0_iters", "pretrain_iters", "finetune_iters", "workers", "threads"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise WinposError(f"{name}={v!r} must be a positive int")
        for name in ("pretrain_lr", "finetune_lr"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not 0 < v < 1:
                raise WinposError(f"{name}={v!r} must be a learning rate in (0, 1), e.g. 1e-3")
        if not 0 <= self.stage0_mask_ratio < 1:
            raise WinposError(f"stage0_mask_ratio={self.stage0_mask_ratio!r} must be in [0, 1)")
        if not os.path.isfile(self.config):
            raise WinposError(f"config {self.config!r} does not exist; pass configs/shapes/reproduce_hieradet.py "
                              "from a winpos checkout")

    @property
    def encodings(self) -> list[str]:
        return sorted({ROWS[r].pretrained for r in self.rows})


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


# -------------------------------------------------------------------------------------------------- run specs
def stage0_spec(p: Protocol) -> dict:
    root = Path(p.stage1_dir or Path(p.output_dir) / "stage1")
    return dict(name="stage0", kind="stage0", config=p.config, iters=p.stage0_iters,
                mask_ratio=p.stage0_mask_ratio, seed=p.stage1_seed, threads=p.threads, out=str(root / "stage0"))


# Stage-0 variants that say what makes the window pattern emerge (tools/reproduce.py --stage0-variants); the main
# stage 0 autoencodes every unit (mask ratio 0) with the config's global stages.
STAGE0_VARIANTS = {
    # the masked variant: loss on masked units, masked tokens kept in the encoder, a linear decoder; not Hiera's MAE
    "hiera_mae": dict(mask_ratio=0.5, loss_on="masked", global_blocks=True),
    "masked_all": dict(mask_ratio=0.5, loss_on="all", global_blocks=True),  # half masked, loss on every unit
    "no_global": dict(mask_ratio=0.0, loss_on="all", global_blocks=False),  # mask ratio 0, windows everywhere
}


def stage0_variant_spec(p: Protocol, name: str) -> dict:
    if name not in STAGE0_VARIANTS:
        raise WinposError(f"unknown stage-0 variant {name!r}; choose from {', '.join(STAGE0_VARIANTS)}")
    spec = stage0_spec(p)
    return dict(spec, name=f"stage0/{name}", **STAGE0_VARIANTS[name],
                out=str(Path(spec["out"]).parent / "stage0_variants" / name))


def stage1_spec(p: Protocol, encoding: str) -> dict:
    root = Path(p.stage1_dir or Path(p.output_dir) / "stage1")
    spec = dict(name=f"stage1/{encoding}", kind="detect", config=p.config, encoding=encoding, size=PRETRAIN_SIZE,
                shapes=dict(PRETRAIN_SHAPES), iters=p.pretrain_iters, seed=p.stage1_seed, lr=p.pretrain_lr,
                out=str(root / encoding), warmup=50, threads=p.threads, init="")
    if encoding in STAGE0_TRUNK:
        spec["init"] = str(Path(stage0_spec(p)["out"]) / "backbone.pth")
    return spec


def converted_init(p: Protocol, row: str) -> str:
    r = ROWS[row]
    return str(Path(p.output_dir) / "stage2" / f"{r.pretrained}_{r.convert}_init.pth")


def stage2_spec(p: Protocol, row: str, k, condition: str, seed: int) -> dict:
    r = ROWS[row]
    init = str(Path(stage1_spec(p, r.pretrained)["out"]) / "model_final.pth")
    if r.convert:
        init = converted_init(p, row)
    return dict(name=f"{row}/{condition}/{label(k)}/seed{seed}", kind="detect", config=p.config,
                encoding=r.pretrained, convert=r.convert, size=check_multiplier(k),
                shapes=dataset_params(k, condition), iters=p.finetune_iters, seed=seed, lr=p.finetune_lr, init=init,
                warmup=20, threads=p.threads, keep_weights=False,  # nothing starts from a finetuned detector
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


# ------------------------------------------------------------------------------------------------- the config
# backbone fields of a converted row (the stage-2 model that loads the converted weights)
CONVERTED_FIELDS = {
    "abswin": dict(pos_embed="abswin", pos_global_size=GRID),  # residual at 16x16 + tiled 4x4 window part
    "control": dict(pos_embed="abswin", pos_global_size=GRID),  # the whole embedding + a zero window part
    "recursive": dict(pos_embed="abswin_recursive", pos_global_size=GRID, pos_base_hw=GRID),
}


def build_cfg(spec: dict):
    """The LazyConfig of one detection run from its spec (encoding, conversion, size, dataset, init, iterations,
    lr, seed, output folder; optional ``classes`` "shapes" for the four-class data and ``freeze``, the
    ``train.freeze`` prefixes)."""
    from winpos.d2.config import load_config

    cfg = load_config(spec["config"], [])
    net = cfg.model.backbone.bottom_up
    for key, value in ENCODINGS[spec["encoding"]].items():
        setattr(net, key, value)
    for key, value in CONVERTED_FIELDS.get(spec.get("convert"), {}).items():
        setattr(net, key, value)
    size = spec["size"]
    cfg.model.backbone.square_pad = size
    for part in (cfg.dataloader.train, cfg.dataloader.test):
        part.dataset.shapes = dict(spec["shapes"])
        part.mapper.image_size = size
    if spec.get("classes") == "shapes":  # the four-class view (the small-data study's new task); default one class
        from winpos.data.scenes import SHAPE_CLASSES

        cfg.dataloader.train.dataset.names, cfg.dataloader.test.dataset.names = "shapes_train", "shapes_val"
        cfg.model.roi_heads.num_classes = len(SHAPE_CLASSES)
    elif spec.get("classes") not in (None, "shapes1"):
        raise WinposError(f"unknown classes {spec['classes']!r} in run {spec.get('name')}; use 'shapes1' (one class, "
                          "the default) or 'shapes' (four)")
    if spec.get("freeze"):  # only the small-data study sets it, so every other run's identity is as before
        cfg.train.freeze = list(spec["freeze"])
    return set_run_fields(cfg, spec, checkpoints=4, warmup=spec.get("warmup", 50))


def set_run_fields(cfg, spec: dict, checkpoints: int, warmup: int):
    """The fields every run of the reproduction sets from its spec: iterations, seed, output folder, init, lr and
    its schedule (``warmup`` iterations, x0.1 for the last 15%), ``checkpoints`` saves per run, CPU, no evaluation
    during training; with ``amp`` (``"bf16"`` or ``"fp16"``) training in that autocast precision (fp16 with a
    GradScaler), and with ``amp_eval`` the evaluation too. Returns ``cfg``."""
    cfg.train.max_iter = max(spec["iters"], 1)
    cfg.train.seed = spec["seed"]
    cfg.train.output_dir = spec["out"]
    cfg.train.init_checkpoint = spec.get("init", "")
    cfg.train.checkpointer.period = max(spec["iters"] // checkpoints, 50)
    cfg.train.eval_period = 0
    cfg.train.device = "cpu"
    cfg.optimizer.lr = spec["lr"]
    if spec.get("amp"):  # only the precision study sets it, so every other run's identity is as before
        cfg.train.amp = dict(enabled=True, precision=spec["amp"], eval=bool(spec.get("amp_eval", False)))
    if spec["iters"] > 0:
        from winpos.d2.hooks import warmup_step_schedule

        cfg.lr_multiplier = warmup_step_schedule(spec["iters"], warmup)
    return cfg
