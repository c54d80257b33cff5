"""Naive absolute position-embedding interpolation: the behaviour that shows the window bug.

One function reproduces the resampling of detectron2 (``get_abs_pos``), MAE (``interpolate_pos_embed``), SAM2 and
timm (``resample_abs_pos_embed``): bicubic, ``align_corners=False``, computed in fp32 and cast back. The families
differ only in ``antialias`` (PyTorch uses the a=-0.75 Keys cubic without it and the a=-0.5 PIL cubic with it, so
the two settings differ even when upsampling) and in whether a cls token is stored in front.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from winpos.errors import WinposError, as_hw, check_finite

__all__ = ["flat_to_grid", "interpolate_abs", "resample_flat", "resize_grid", "split_cls", "split_flat_embedding"]


def resize_grid(grid: torch.Tensor, hw, antialias: bool = False) -> torch.Tensor:
    """Bicubically resample an NCHW grid ``(N, C, h, w) -> (N, C, H, W)`` in fp32; identity when sizes match."""
    H, W = as_hw(hw, "target grid")
    if grid.dim() != 4:
        raise WinposError(f"expected an NCHW grid of 4 dims, got shape {tuple(grid.shape)}")
    if tuple(grid.shape[-2:]) == (H, W):
        return grid
    out = F.interpolate(grid.to(torch.promote_types(grid.dtype, torch.float32)), size=(H, W), mode="bicubic", align_corners=False, antialias=antialias)
    return out.to(grid.dtype)


def split_cls(pos_embed: torch.Tensor, has_cls: bool) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Split a flat ``(1, [1+]N, C)`` embedding into its cls row (or None) and its N patch rows."""
    if pos_embed.dim() != 3:
        raise WinposError(f"expected a flat (1, N, C) position embedding, got shape {tuple(pos_embed.shape)}")
    if has_cls:
        return pos_embed[:, :1], pos_embed[:, 1:]
    return None, pos_embed


def flat_to_grid(tokens: torch.Tensor, src_hw=None) -> torch.Tensor:
    """``(1, N, C) -> (1, C, h, w)``; ``src_hw`` defaults to a square grid, which N must then be."""
    n = tokens.shape[1]
    if src_hw is None:
        side = math.isqrt(n)
        if side * side != n:
            raise WinposError(
                f"a flat embedding of {n} tokens is not a square grid; pass src_hw=(h, w) (did you forget "
                "has_cls=True for a checkpoint with a cls token?)"
            )
        src_hw = (side, side)
    h, w = as_hw(src_hw, "src_hw")
    if h * w != n:
        raise WinposError(f"src_hw={src_hw} holds {h * w} tokens but the embedding has {n}")
    return tokens.transpose(1, 2).reshape(tokens.shape[0], -1, h, w)


def split_flat_embedding(tokens: torch.Tensor, key: str = "pos_embed", has_cls: bool | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A stored flat embedding ``(1, [1+]N, C)`` -> ``(grid (1, C, s, s), cls row (1, 1, C) or None)``.

    The one parser of flat checkpoint embeddings (importers and diagnostics). ``has_cls=None`` tells the cls row
    from the count: ``N`` square without it, ``N - 1`` square with it (a square count is taken as no cls row).
    Errors name ``key`` and the shape.
    """
    if tokens.dim() != 3 or tokens.shape[0] != 1:
        raise WinposError(f"'{key}' has shape {tuple(tokens.shape)}; expected a flat (1, [1+]h*w, C) embedding")
    n = tokens.shape[1]
    choices = (False, True) if has_cls is None else (has_cls,)
    for cls in choices:
        side = math.isqrt(max(n - cls, 0))
        if side > 0 and side * side == n - cls:
            return tokens[:, int(cls):].transpose(1, 2).reshape(1, -1, side, side), tokens[:, :1] if cls else None
    what = {None: "with or without a cls row", True: "after its cls row", False: "without a cls row"}[has_cls]
    raise WinposError(f"'{key}' holds {n} tokens, which is not a square grid {what}; reshape it to (1, C, H, W) "
                      "yourself or name the checkpoint's format")


def interpolate_abs(
    pos_embed: torch.Tensor, hw, *, has_cls: bool = False, antialias: bool = False, src_hw=None, layout: str = "nhwc"
) -> torch.Tensor:
    """Naively resample an absolute position embedding to a token grid (the buggy behaviour, kept to show it).

    Args:
        pos_embed: ``(1, [1+]N, C)`` flat (detectron2, MAE, timm, official Hiera), ``(1, h, w, C)`` NHWC (SAM v1)
            or ``(1, C, h, w)`` NCHW (SAM2); the layout is told by ``layout`` for 4-dim inputs.
        hw: target token grid ``(H, W)``.
        has_cls: the flat embedding carries a cls row in front; it is dropped (detectron2's ``get_abs_pos``).
        antialias: False for detectron2 / MAE / SAM2, True for timm's ``resample_abs_pos_embed`` default.
        src_hw: grid of a flat embedding when it is not square.
        layout: ``"nhwc"`` or ``"nchw"`` for 4-dim inputs (ignored for flat ones).
    Returns:
        ``(1, H, W, C)`` embedding in the input dtype.
    """
    if not (torch.compiler.is_compiling() or torch.jit.is_tracing()):
        # a data-dependent check: eager only, a compiled or traced graph cannot branch on it
        check_finite("pos_embed", pos_embed)
    if pos_embed.dim() == 3:
        grid = flat_to_grid(split_cls(pos_embed, has_cls)[1], src_hw)
    elif pos_embed.dim() == 4:
        grid = pos_embed.permute(0, 3, 1, 2) if layout == "nhwc" else pos_embed
    else:
        raise WinposError(f"position embedding must have 3 or 4 dims, got shape {tuple(pos_embed.shape)}")
    return resize_grid(grid, hw, antialias=antialias).permute(0, 2, 3, 1)


def resample_flat(pos_embed: torch.Tensor, hw, *, num_prefix: int = 1, antialias: bool = True, src_hw=None):
    """timm-style resampling of a flat embedding that keeps its prefix (cls) rows: ``(1, P+n, C) -> (1, P+H*W, C)``."""
    prefix, tokens = pos_embed[:, :num_prefix], pos_embed[:, num_prefix:]
    grid = resize_grid(flat_to_grid(tokens, src_hw), hw, antialias=antialias)
    return torch.cat([prefix, grid.flatten(2).transpose(1, 2)], dim=1)
