"""What the attention op takes: q, k, v on the token grid and a description of the position terms, validated."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from winpos.errors import WinposError

__all__ = ["PositionTerms", "check_inputs"]


@dataclass
class PositionTerms:
    """What the attention op needs to know about position, for one block.

    rope: an object with ``tables(q_hw, k_hw) -> RopeTables`` (``winpos.posemb.rope.RoPE``).
    rel_pos: ``(rel_pos_h, rel_pos_w)`` learned tables ``(2S-1, head_dim)``; resampled to the window extent.
    lookhere: an object with ``bias(q_hw, k_hw) -> (heads, Nq, Nk)`` and ``fov``/``slopes`` buffers
        (``winpos.posemb.lookhere.LookHere``).
    """

    rope: Any = None
    rel_pos: tuple[torch.Tensor, torch.Tensor] | None = None
    lookhere: Any = None

    @property
    def empty(self) -> bool:
        return self.rope is None and self.rel_pos is None and self.lookhere is None


def check_inputs(q, k, v) -> None:
    """q ``(B, Hq, Wq, heads, D)``, k and v ``(B, Hk, Wk, heads, D | Dv)`` on one device."""
    if q.dim() != 5 or k.dim() != 5 or v.dim() != 5:
        raise WinposError(
            "attention expects q, k, v on the token grid as (B, H, W, heads, head_dim); got shapes "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if k.shape != v.shape[:-1] + (k.shape[-1],) or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise WinposError(f"q, k, v disagree on batch, heads or key grid: {tuple(q.shape)}, {tuple(k.shape)}, "
                          f"{tuple(v.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise WinposError(f"q and k head dims differ ({q.shape[-1]} vs {k.shape[-1]}); they must match for q.k")
    if not (q.device == k.device == v.device):
        raise WinposError(f"q, k, v are on different devices ({q.device}, {k.device}, {v.device}); move them "
                          "together")
