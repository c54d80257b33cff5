"""How q and k grids split into attention groups (windows, or one global group), and the padding mask.

The rules (an integer query pooling stride, a window that the stride divides and that tiles the grid) are
``winpos.windows.attention_groups``, which the Triton kernels' dispatch uses too, so the reference and the Triton
path can never disagree on which inputs they accept.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from winpos.windows import attention_groups, ceil_div, valid_key_mask, window_partition, window_unpartition

__all__ = ["Geometry", "from_groups", "geometry", "padding_mask", "to_groups"]


@dataclass(frozen=True)
class Geometry:
    """Tokens per attention group side for queries and keys (the whole grid when not ``windowed``)."""

    q_window: tuple[int, int]
    k_window: tuple[int, int]
    windowed: bool


def geometry(q_hw, k_hw, window) -> Geometry:
    """The groups of a ``q_hw`` query grid attending to a ``k_hw`` key grid in ``window`` windows (None/0: global)."""
    _, _, q_win, k_win, _ = attention_groups(tuple(q_hw), tuple(k_hw), window)
    return Geometry(q_win, k_win, bool(window))


def to_groups(x: torch.Tensor, geo: Geometry, which: str) -> torch.Tensor:
    """``(B, H, W, heads, D) -> (B * groups, heads, n, D)``; ``which``: ``"q"`` or ``"k"`` (keys and values)."""
    win = geo.q_window if which == "q" else geo.k_window
    x = window_partition(x, win[0]) if geo.windowed else x.flatten(1, 2)
    return x.transpose(1, 2)


def from_groups(x: torch.Tensor, geo: Geometry, q_hw) -> torch.Tensor:
    """Inverse of ``to_groups`` for the queries: ``(B * groups, heads, n, D) -> (B, Hq, Wq, heads, D)``."""
    x = x.transpose(1, 2)
    if geo.windowed:
        return window_unpartition(x, geo.q_window[0], q_hw)
    return x.reshape(x.shape[0], q_hw[0], q_hw[1], *x.shape[2:])


def _inside(hw, valid_hw, device) -> torch.Tensor:
    """``(1, H*W)`` bool: True where a token of the ``hw`` grid lies inside the ``valid_hw`` corner."""
    (H, W), (h, w) = hw, valid_hw
    return ((torch.arange(H, device=device)[:, None] < h) & (torch.arange(W, device=device)[None, :] < w)).reshape(1, -1)


def padding_mask(geo: Geometry, q_hw, k_hw, valid_hw, device) -> torch.Tensor | None:
    """``(groups, 1, Nq, Nk)`` bool, True = attend: valid queries do not see padded keys; padded queries (cropped
    later) see everything, so no row is ever fully masked. None when nothing is padded."""
    if tuple(valid_hw) == tuple(k_hw):
        return None
    stride = k_hw[0] // q_hw[0]
    q_valid_hw = (ceil_div(valid_hw[0], stride), ceil_div(valid_hw[1], stride))
    if geo.windowed:
        k_valid = valid_key_mask(k_hw, valid_hw, geo.k_window[0], device)
        q_valid = valid_key_mask(q_hw, q_valid_hw, geo.q_window[0], device)
    else:
        k_valid, q_valid = _inside(k_hw, valid_hw, device), _inside(q_hw, q_valid_hw, device)
    return ~(q_valid[:, :, None] & ~k_valid[:, None, :])[:, None]
