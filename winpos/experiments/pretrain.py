"""Stage 0 of the reproduction: self-supervised pretraining of the detector's backbone with its own position
encoding, from a random start, so that an absolute embedding's window pattern is *learned*, not planted.

The main objective is a **unit-layout autoencoder** (mask ratio 0, loss on every unit: nothing is masked). It was
built so that a window-periodic embedding is the best answer, which is the premise the reproduction needs to test
the bug on a learned embedding. A masked stage-0 variant (``hiera_mae``: half the units masked, loss on the masked
units only, ``loss_on="masked"``) is kept as a labelled variant; at 800 iterations it learns no window pattern.
Neither is Hiera's MAE: here a masked unit's tokens stay in the encoder as a learned mask token and a LayerNorm plus
one linear layer decodes, where Hiera's MAE drops the masked units after the embedding and decodes with transformer
blocks.

The objective needs the layout inside each attention window while the weights of that window's computation are
shared by every window. At the scale of the shapes data (64 px images, a 16x16 token grid at stride 4, 4x4-token
windows in stage 1):

* **Units are the stage-1 windows** (4x4 tokens = 16x16 px), as Hiera's mask units. With ``mask_ratio`` > 0 a
  fraction of them is blanked in the image (so the overlapping 7x7 patch embedding of a visible neighbour cannot
  see it) and its tokens are replaced by one learned mask token before the position embedding is added.
* **Targets are per unit**: the mean RGB of each of the unit's 4x4 tokens (48 values), normalised over the unit
  (mean 0, variance 1), so the target *is* the layout inside the unit, not its brightness or colour.
* **Predicted from coarse tokens**: a linear decoder reads the stage-3 token (stride 16: one token per unit)
  and predicts that unit's 48 values. Between the stage-1 windows and that token lie two 2x2 max-pools, which
  lose where inside the unit a feature was, unless the tokens carry it: the position embedding is the only
  source of within-unit position, and since every window runs the same weights, the most useful embedding
  repeats with the window period. A backbone without a token embedding (RoPE, LookHere) gets within-unit position
  from its attention terms instead; stage 0 trains those with the same objective and budget.
* The loss is taken over the masked units only (``loss_on="masked"``, the ``hiera_mae`` variant) or over every unit
  (``"all"``: the masked ones are inpainted, the visible ones autoencoded; with ``mask_ratio`` 0 plain unit
  autoencoding).

Readouts (for a backbone with an absolute embedding; None for one without): WS@window (window similarity,
centred) of the embedding every ``log_every`` iterations, and the *reliance* of the trained backbone on it: the
held-out loss with the embedding as learned, set to zero, rolled by one token (the pattern misaligned with the
windows, which is what a naive resize does) and rolled by one window (aligned again). The result is a whole
detector checkpoint (heads untrained) that stage 1 starts from.
"""
from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F

from winpos.errors import WinposError

logger = logging.getLogger(__name__)

UNIT = 4  # mask unit = stage-1 window, in tokens
PATCH = 4  # stride of the patch embedding in px


@dataclass(frozen=True)
class PretrainSpec:
    """Everything that makes a stage-0 run (its identity: see ``winpos.experiments.runs``)."""

    iters: int = 1500
    batch: int = 32
    lr: float = 1.5e-3
    mask_ratio: float = 0.5
    loss_on: str = "all"  # "masked": the masked units only (the hiera_mae variant); "all": every unit
    global_blocks: bool = True  # False: no global attention anywhere (stage-3/4 windows of 2 and 1 tokens)
    seed: int = 0
    images: int = 4000
    image_size: int = 64
    log_every: int = 100

    def validate(self) -> None:
        if not isinstance(self.iters, int) or self.iters < 1:
            raise WinposError(f"stage-0 iters={self.iters!r} must be a positive int")
        if not 0 <= self.mask_ratio < 1:
            raise WinposError(f"mask_ratio={self.mask_ratio!r} must be in [0, 1): the share of units masked")
        if self.loss_on not in ("masked", "all"):
            raise WinposError(f"loss_on={self.loss_on!r} must be 'masked' (the masked units only) or 'all' "
                              "(every unit)")
        if self.loss_on == "masked" and self.mask_ratio == 0:
            raise WinposError("loss_on='masked' needs mask_ratio > 0: with no masked unit there is no loss")
        if self.image_size % (UNIT * PATCH):
            raise WinposError(f"image_size={self.image_size} must be a multiple of {UNIT * PATCH} px (one unit)")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise WinposError(f"seed={self.seed!r} must be an int >= 0")


class UnitDecoder(torch.nn.Module):
    """Stage-3 tokens ``(B, h, w, C)`` (one per unit) -> the unit's ``UNIT x UNIT x 3`` normalised token colours."""

    def __init__(self, channels: int):
        super().__init__()
        self.norm = torch.nn.LayerNorm(channels)
        self.proj = torch.nn.Linear(channels, UNIT * UNIT * 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


def unit_targets(images: torch.Tensor) -> torch.Tensor:
    """``(B, 3, H, W)`` normalised images -> ``(B, H/16, W/16, 48)``: per unit, its 4x4 token-mean colours
    (row-major tokens, RGB last), normalised over the unit's 48 values."""
    B, _, H, W = images.shape
    tok = F.avg_pool2d(images, PATCH)  # (B, 3, H/4, W/4): one colour per token
    h, w = H // (PATCH * UNIT), W // (PATCH * UNIT)
    t = tok.reshape(B, 3, h, UNIT, w, UNIT).permute(0, 2, 4, 3, 5, 1).reshape(B, h, w, UNIT * UNIT * 3)
    return (t - t.mean(-1, keepdim=True)) / (t.var(-1, keepdim=True) + 1e-6).sqrt()


def model_embedding_grid(net) -> torch.Tensor:
    """The learned absolute embedding of ``net`` as a ``(C, g, g)`` tensor (a view of the parameter's data)."""
    pe = getattr(net.pos_embed, "pos_embed", None)
    if pe is None or net.pos_embed_kind != "abs":
        raise WinposError("the window similarity of stage 0 needs a backbone with pos_embed='abs' (a learned "
                          "absolute embedding); this one has none")
    g = math.isqrt(pe.shape[1])
    return pe.detach()[0].reshape(g, g, -1).permute(2, 0, 1)


def has_abs_embedding(net) -> bool:
    return net.pos_embed is not None and net.pos_embed_kind == "abs"


def window_ws(net) -> float | None:
    """WS@window of ``net``'s absolute embedding, None for a backbone without one."""
    if not has_abs_embedding(net):
        return None
    from winpos.diagnostics.metrics import window_similarity

    return float(window_similarity(model_embedding_grid(net), UNIT, centred=True))


class Stage0:
    """The backbone, mask token and decoder of one stage-0 run, and its loss."""

    def __init__(self, net, spec: PretrainSpec):
        self.net, self.spec = net, spec
        self.mask_token = torch.nn.Parameter(torch.zeros(net.channels[0]))
        self.decoder = UnitDecoder(net.channels[2])

    def parameters(self):
        return list(self.net.parameters()) + [self.mask_token] + list(self.decoder.parameters())

    def loss(self, images: torch.Tensor, unit_mask: torch.Tensor) -> torch.Tensor:
        """``images (B, 3, H, W)`` normalised, ``unit_mask (B, h, w)`` True where a unit is masked."""
        net = self.net
        tok_mask = unit_mask.repeat_interleave(UNIT, 1).repeat_interleave(UNIT, 2)  # (B, H/4, W/4)
        px_mask = tok_mask.repeat_interleave(PATCH, 1).repeat_interleave(PATCH, 2)  # (B, H, W)
        target = unit_targets(images)
        x = net.patch_embed(images * ~px_mask[:, None])  # (B, H/4, W/4, C)
        x = torch.where(tok_mask[..., None], self.mask_token.to(x.dtype), x)
        if net.pos_embed is not None:  # RoPE / LookHere: position enters in the attention of every block
            x = x + net.pos_embed(tuple(x.shape[1:3]))
        for i, blk in enumerate(net.blocks):
            x = net.run_block(blk, x)
            if i == net.stage_ends[2]:
                break
        err = ((self.decoder(x) - target) ** 2).mean(-1)  # (B, h, w)
        return err[unit_mask].mean() if self.spec.loss_on == "masked" else err.mean()


def make_images(spec: PretrainSpec, cache: str | None = None) -> torch.Tensor:
    """``spec.images`` shapes scenes of ``spec.image_size`` px as a uint8 tensor ``(N, H, W, 3)``, drawn from the
    embedded generator with a seed of their own (the same for every stage-0 run); cached in ``cache`` (.npy)."""
    import os

    from winpos.data.scenes import random_scene

    if cache and os.path.isfile(cache):
        arr = np.load(cache)
        if arr.shape == (spec.images, spec.image_size, spec.image_size, 3):
            return torch.from_numpy(arr)
    rng = np.random.default_rng(12345)
    arr = np.stack([random_scene(rng, spec.image_size, spec.image_size, int(rng.integers(1, 7)))[0]
                    for _ in range(spec.images)])
    if cache:
        from winpos.utils.outputs import atomic_write

        atomic_write(cache, lambda f: np.save(f, arr), "wb")
    return torch.from_numpy(arr)


def _batch(imgs, idx, mean, std, flip):
    x = imgs[idx].permute(0, 3, 1, 2).float()  # (B, 3, H, W)
    x[flip] = x[flip].flip(-1)
    return (x - mean) / std


def _masks(gen, B, h, w, ratio):
    """``(B, h, w)`` unit masks with exactly ``round(ratio * h * w)`` masked units per image."""
    n = round(ratio * h * w)
    order = torch.rand(B, h * w, generator=gen).argsort(1)
    return (order < n).reshape(B, h, w)


@torch.no_grad()
def reliance(stage: Stage0, imgs, mean, std, n: int = 256) -> dict:
    """Held-out loss of the trained backbone with its embedding as learned, zeroed, rolled by one token and rolled
    by one window (``UNIT`` tokens) along both axes; fixed images and masks for every variant. A backbone without
    an absolute embedding gets its held-out loss only (``{"learned": loss}``)."""
    gen = torch.Generator().manual_seed(999)
    idx = torch.arange(len(imgs) - n, len(imgs))  # the last n images are never trained on
    x = _batch(imgs, idx, mean, std, torch.zeros(n, dtype=torch.bool))
    h = x.shape[-1] // (PATCH * UNIT)
    ratio = stage.spec.mask_ratio
    masks = _masks(gen, n, h, h, ratio) if ratio > 0 else torch.zeros(n, h, h, dtype=torch.bool)

    def held_out() -> float:
        return float(sum(stage.loss(x[i:i + 64], masks[i:i + 64]) * len(x[i:i + 64]) for i in range(0, n, 64)) / n)

    if not has_abs_embedding(stage.net):
        stage.net.eval()
        try:
            return {"learned": held_out()}
        finally:
            stage.net.train()
    pe = stage.net.pos_embed.pos_embed
    g = math.isqrt(pe.shape[1])
    saved = pe.data.clone()
    grid = saved[0].reshape(g, g, -1)
    variants = {"learned": saved, "zeroed": torch.zeros_like(saved),
                "rolled_1_token": torch.roll(grid, (1, 1), (0, 1)).reshape_as(saved),
                "rolled_1_window": torch.roll(grid, (UNIT, UNIT), (0, 1)).reshape_as(saved)}
    out = {}
    stage.net.eval()
    try:
        for name, value in variants.items():
            pe.data.copy_(value)
            out[name] = held_out()
    finally:
        pe.data.copy_(saved)
        stage.net.train()
    return out


def param_groups(net, extra: list) -> list[dict]:
    """The stage-0 optimizer groups: position parameters (the absolute embedding, relpos tables; RoPE and LookHere
    have none) without weight decay, every other parameter of ``net`` and ``extra`` with the optimizer's."""
    named = list(net.named_parameters())
    is_pos = [n.startswith("pos_embed.") or ".rel_pos_" in n for n, _ in named]
    return [{"params": [p for (_, p), flag in zip(named, is_pos) if not flag] + list(extra)},
            {"params": [p for (_, p), flag in zip(named, is_pos) if flag], "weight_decay": 0.0}]


def pretrain(net, spec: PretrainSpec, pixel_mean, pixel_std, image_cache: str | None = None,
             progress=None) -> dict:
    """Train ``net`` (a HieraDet with any position encoding) with the stage-0 objective in place; returns the
    history (WS@window, loss per ``log_every``), the reliance numbers and the time. ``progress(it, iters, line)`` is
    called every ``log_every`` iterations."""
    spec.validate()
    torch.manual_seed(spec.seed)
    imgs = make_images(spec, image_cache)
    mean = torch.tensor(pixel_mean, dtype=torch.float32).view(1, 3, 1, 1)
    std = torch.tensor(pixel_std, dtype=torch.float32).view(1, 3, 1, 1)
    stage = Stage0(net, spec)
    opt = torch.optim.AdamW(param_groups(net, [stage.mask_token] + list(stage.decoder.parameters())),
                            lr=spec.lr, weight_decay=0.05, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(spec.seed)
    train_n = len(imgs) - 256
    h = spec.image_size // (PATCH * UNIT)
    history = [{"iter": 0, "ws": window_ws(net), "loss": None}]
    losses, t0 = [], time.time()
    warm = min(100, spec.iters // 10 + 1)
    for it in range(spec.iters):
        scale = min(1.0, (it + 1) / warm) * 0.5 * (1 + math.cos(math.pi * it / spec.iters))
        for g in opt.param_groups:
            g["lr"] = spec.lr * scale
        idx = torch.randint(train_n, (spec.batch,), generator=gen)
        flip = torch.rand(spec.batch, generator=gen) < 0.5
        x = _batch(imgs, idx, mean, std, flip)
        if spec.mask_ratio > 0:
            masks = _masks(gen, spec.batch, h, h, spec.mask_ratio)
        else:
            masks = torch.zeros(spec.batch, h, h, dtype=torch.bool)
        loss = stage.loss(x, masks)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if (it + 1) % spec.log_every == 0 or it + 1 == spec.iters:
            row = {"iter": it + 1, "ws": window_ws(net), "loss": float(np.mean(losses[-spec.log_every:]))}
            history.append(row)
            if progress is not None:
                ws = "" if row["ws"] is None else f", WS@{UNIT} {row['ws']:.3f}"
                progress(it + 1, spec.iters, f"stage 0 {it + 1}/{spec.iters}: loss {row['loss']:.3f}{ws} "
                         f"({time.time() - t0:.0f} s)")
    seconds = time.time() - t0
    return {"spec": asdict(spec), "history": history, "reliance": reliance(stage, imgs, mean, std),
            "seconds": seconds, "iters_per_s": spec.iters / seconds}


def dumps(result: dict) -> str:
    return json.dumps(result, indent=1)
