"""Absolute-win position embeddings (Bolya et al., ICLR 2024): a tiled window embedding plus an interpolated global one.

    E(H, W) = Bicubic(G -> H x W) + Tile(Wn, ceil(H/w) x ceil(W/w))[:H, :W]

Tiles are anchored at (0, 0), the origin of ``window_partition``, which pads bottom/right; tiling with ceil and
cropping keeps every window aligned for any grid (SAM2 and timm tile with floor division and fail when the grid is
not a multiple of the window). Resolution changes resize only G; Wn is never resized, so every window always sees
the same window embedding.

Two modes:
- ``single`` (SAM2): interpolate G to the full grid and tile Wn over it.
- ``recursive`` (the paper's HieraDet): build E at a base grid (56x56 = one 224 px pretraining image at stride 4),
  then tile *that* with period ``base_hw``, which is aligned with every window of every stage.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from winpos.cache import GridCache
from winpos.errors import WinposError, as_hw, check_choice, check_finite
from winpos.posemb.interp import interpolate_abs, resize_grid
from winpos.windows import ceil_div

__all__ = ["AbsPosEmbed", "AbsWinPosEmbed", "abs_to_abswin", "abswin_embedding", "abswin_recursive", "tile_to_grid"]


def tile_to_grid(window_embed: torch.Tensor, hw) -> torch.Tensor:
    """Tile an NCHW ``(1, C, wh, ww)`` embedding from (0, 0) over an ``(H, W)`` grid, with ceil and crop."""
    H, W = as_hw(hw, "token grid")
    wh, ww = window_embed.shape[-2:]
    reps = (ceil_div(H, wh), ceil_div(W, ww))
    return window_embed.repeat(1, 1, *reps)[..., :H, :W]


def abswin_embedding(global_embed: torch.Tensor, window_embed: torch.Tensor, hw, antialias: bool = False) -> torch.Tensor:
    """SAM2's ``_get_pos_embed`` generalized to any grid: ``(1, C, gh, gw)`` + ``(1, C, w, w)`` -> ``(1, C, H, W)``."""
    return resize_grid(global_embed, hw, antialias=antialias) + tile_to_grid(window_embed, hw)


def abswin_recursive(global_embed, window_embed, hw, base_hw=(56, 56), antialias: bool = False) -> torch.Tensor:
    """Build the abs-win embedding at ``base_hw`` and tile it with that period over ``hw`` (paper's HieraDet)."""
    return tile_to_grid(abswin_embedding(global_embed, window_embed, base_hw, antialias), hw)


def abs_to_abswin(pos_grid: torch.Tensor, window) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact projection of a learned absolute embedding onto abs-win form.

    Args:
        pos_grid: ``(1, C, H, W)`` NCHW embedding at its pretraining grid (e.g. Hiera's 56x56).
        window: window size (int or pair); at least one full window must fit.
    Returns:
        ``(global_embed, window_embed)`` where ``window_embed`` (1, C, w, w) is the mean of the full window-aligned
        tiles (the orthogonal projection onto w-periodic maps) and ``global_embed`` (1, C, H, W) is the residual.
        ``abswin_embedding(global_embed, window_embed, (H, W))`` reproduces ``pos_grid`` exactly, because bicubic
        resampling to the same size is the identity.
    """
    check_finite("pos_embed", pos_grid)
    wh, ww = as_hw(window, "window")
    H, W = pos_grid.shape[-2:]
    nh, nw = H // wh, W // ww
    if nh == 0 or nw == 0:
        raise WinposError(
            f"window {wh}x{ww} is larger than the {H}x{W} embedding grid; no full window exists to average. "
            "Choose a window no larger than the grid."
        )
    full = pos_grid[..., : nh * wh, : nw * ww]
    full = full.to(torch.promote_types(full.dtype, torch.float32))  # average in >= fp32
    tiles = full.reshape(1, -1, nh, wh, nw, ww)
    window_embed = tiles.mean(dim=(2, 4)).to(pos_grid.dtype)
    global_embed = pos_grid - tile_to_grid(window_embed, (H, W))
    return global_embed, window_embed


class AbsWinPosEmbed(nn.Module):
    """Learned abs-win embedding added to the tokens once after patch embedding.

    Args:
        dim: channels C.
        window_size: window embedding size (int or pair), e.g. 8 (Hiera stage 1) or 14 (ViTDet).
        global_size: global embedding grid, e.g. 7, 14 (SAM2 B+) or 16 (timm abswin 256).
        mode: ``"single"`` or ``"recursive"``.
        base_hw: the period of the recursive mode (56x56 tokens = 224 px at stride 4).
        antialias: bicubic flavour of the global resize (False: SAM2; True: timm ``hiera_*_abswin``).
        init_std: 0 gives SAM2's zero init; timm uses trunc-normal 0.02.
    Forward: ``hw -> (1, H, W, C)`` (NHWC, ready to add to ``(B, H, W, C)`` tokens). Cached for the last grid
    (``winpos.cache``: while the parameters are unchanged and no gradient is recorded through them).
    """

    def __init__(self, dim, window_size, global_size=14, mode="single", base_hw=(56, 56), antialias=False, init_std=0.0):
        super().__init__()
        self.mode = check_choice("abswin mode", mode, ("single", "recursive"))
        self.base_hw = as_hw(base_hw, "base_hw")
        self.antialias = antialias
        wh, ww = as_hw(window_size, "window_size")
        gh, gw = as_hw(global_size, "global_size")
        if mode == "recursive" and (self.base_hw[0] % wh or self.base_hw[1] % ww):
            raise WinposError(f"recursive abs-win needs base_hw={self.base_hw} to be a multiple of the window {wh}x{ww}")
        self.global_embed = nn.Parameter(torch.zeros(1, dim, gh, gw))
        self.window_embed = nn.Parameter(torch.zeros(1, dim, wh, ww))
        if init_std > 0:
            nn.init.trunc_normal_(self.global_embed, std=init_std)
            nn.init.trunc_normal_(self.window_embed, std=init_std)
        self._cache = GridCache(1)  # one grid at a time: inference sweeps move on, old sizes are not reused

    def forward(self, hw) -> torch.Tensor:
        hw = as_hw(hw, "token grid")

        def build():
            if self.mode == "single":
                grid = abswin_embedding(self.global_embed, self.window_embed, hw, self.antialias)
            else:
                grid = abswin_recursive(self.global_embed, self.window_embed, hw, self.base_hw, self.antialias)
            return grid.permute(0, 2, 3, 1)

        # Cached values are detached (winpos.cache): at the stored grid the result can be a view of the parameter,
        # which would otherwise carry requires_grad into inference code (and into a later jit trace).
        return self._cache.get(hw, build, self.global_embed, self.window_embed)

    def extra_repr(self) -> str:
        return f"mode={self.mode}, global={tuple(self.global_embed.shape[-2:])}, window={tuple(self.window_embed.shape[-2:])}"


class AbsPosEmbed(nn.Module):
    """A plain absolute embedding stored at its pretraining grid and naively interpolated (the buggy baseline).

    Stored flat as ``(1, [1+]h*w, C)`` like detectron2/MAE so their checkpoints load unchanged. Forward:
    ``hw -> (1, H, W, C)``.
    """

    def __init__(self, dim, pretrain_hw=(14, 14), has_cls=False, antialias=False, init_std=0.02):
        super().__init__()
        self.pretrain_hw = as_hw(pretrain_hw, "pretrain_hw")
        self.has_cls = has_cls
        self.antialias = antialias
        n = self.pretrain_hw[0] * self.pretrain_hw[1] + int(has_cls)
        self.pos_embed = nn.Parameter(torch.zeros(1, n, dim))
        if init_std > 0:
            nn.init.trunc_normal_(self.pos_embed, std=init_std)
        self._cache = GridCache(1)

    def forward(self, hw) -> torch.Tensor:
        hw = as_hw(hw, "token grid")

        def build():
            return interpolate_abs(self.pos_embed, hw, has_cls=self.has_cls, antialias=self.antialias,
                                   src_hw=self.pretrain_hw)

        return self._cache.get(hw, build, self.pos_embed)
