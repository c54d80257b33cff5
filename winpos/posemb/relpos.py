"""Decomposed relative position bias (MViTv2 / ViTDet / SAM semantics).

For a query at (h, w) and a key at (h', w'), the logit gains ``q . Rh[h, h'] + q . Rw[w, w']`` where q is the
*unscaled* query (the attention logits themselves use ``scale * q . k``). ``Rh`` and ``Rw`` are looked up from
learned tables of length ``2 * max(q_size, k_size) - 1``, linearly resampled when the stored length differs, with
coordinates scaled when the query and key grids differ (pooled queries).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from winpos.errors import WinposError, as_hw

__all__ = ["rel_bias_dense", "rel_index", "rel_lookup", "rel_pos_parameters", "rel_terms", "RelPosTables",
           "resample_rel_table"]


def resample_rel_table(table: torch.Tensor, length: int) -> torch.Tensor:
    """Linearly resample a ``(L, C)`` table to ``(length, C)`` (``align_corners=False``); identity when L matches."""
    if table.dim() != 2:
        raise WinposError(f"a relative position table must be (length, head_dim), got shape {tuple(table.shape)}")
    if table.shape[0] == length:
        return table
    out = F.interpolate(table.t()[None].to(torch.promote_types(table.dtype, torch.float32)), size=length, mode="linear")
    return out[0].t().to(table.dtype)


def rel_index(q_size: int, k_size: int, device=None) -> torch.Tensor:
    """Integer ``(q_size, k_size)`` index into a length ``2*max(q,k)-1`` table for each (query, key) pair."""
    q_scale = max(k_size / q_size, 1.0)
    k_scale = max(q_size / k_size, 1.0)
    q = torch.arange(q_size, device=device, dtype=torch.float64)[:, None] * q_scale
    k = torch.arange(k_size, device=device, dtype=torch.float64)[None, :] * k_scale
    return ((q - k) + (k_size - 1) * k_scale).long()


def rel_lookup(table: torch.Tensor, q_size: int, k_size: int) -> torch.Tensor:
    """``(L, C) -> (q_size, k_size, C)``: the table resampled to the extent and gathered per (query, key)."""
    length = int(2 * max(q_size, k_size) - 1)
    return resample_rel_table(table, length)[rel_index(q_size, k_size, table.device)]


def rel_terms(q: torch.Tensor, rel_pos_h, rel_pos_w, q_hw, k_hw) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-query bias terms of decomposed relpos.

    Args:
        q: unscaled queries ``(..., Nq, C)`` in row-major order of a ``q_hw`` grid.
        rel_pos_h, rel_pos_w: ``(Lh, C)``, ``(Lw, C)`` learned tables.
    Returns:
        ``rel_h (..., Nq, kh)`` and ``rel_w (..., Nq, kw)``: the logit of key (h', w') gains
        ``rel_h[..., n, h'] + rel_w[..., n, w']``.
    """
    (qh, qw), (kh, kw) = as_hw(q_hw, "q_hw"), as_hw(k_hw, "k_hw")
    if q.shape[-2] != qh * qw:
        raise WinposError(f"q has {q.shape[-2]} tokens but q_hw={q_hw} holds {qh * qw}")
    if rel_pos_h.shape[-1] != q.shape[-1] or rel_pos_w.shape[-1] != q.shape[-1]:
        raise WinposError(
            f"relpos tables have head_dim {rel_pos_h.shape[-1]}/{rel_pos_w.shape[-1]} but q has {q.shape[-1]}; "
            "the tables must be (2*window-1, head_dim) for this attention's heads"
        )
    Rh = rel_lookup(rel_pos_h, qh, kh).to(q.dtype)
    Rw = rel_lookup(rel_pos_w, qw, kw).to(q.dtype)
    r_q = q.reshape(*q.shape[:-2], qh, qw, q.shape[-1])
    rel_h = torch.einsum("...hwc,hkc->...hwk", r_q, Rh).flatten(-3, -2)
    rel_w = torch.einsum("...hwc,wkc->...hwk", r_q, Rw).flatten(-3, -2)
    return rel_h, rel_w


def rel_bias_dense(q: torch.Tensor, rel_pos_h, rel_pos_w, q_hw, k_hw) -> torch.Tensor:
    """Materialized ``(..., Nq, Nk)`` relpos bias (the slow path; used by the reference and by tests)."""
    rel_h, rel_w = rel_terms(q, rel_pos_h, rel_pos_w, q_hw, k_hw)
    kh, kw = as_hw(k_hw, "k_hw")
    return (rel_h[..., :, None] + rel_w[..., None, :]).flatten(-2)


def rel_pos_parameters(head_dim: int, extent, zero_init: bool = True,
                       init_std: float = 0.02) -> tuple[nn.Parameter, nn.Parameter]:
    """Learned decomposed relpos tables ``(rel_pos_h, rel_pos_w)``, each ``(2*extent-1, head_dim)``: zeros with
    ``zero_init`` (detectron2's ``rel_pos_zero_init``), else trunc-normal(``init_std``)."""
    eh, ew = as_hw(extent, "relpos extent")
    rel_pos_h = nn.Parameter(torch.zeros(2 * eh - 1, head_dim))
    rel_pos_w = nn.Parameter(torch.zeros(2 * ew - 1, head_dim))
    if not zero_init:
        nn.init.trunc_normal_(rel_pos_h, std=init_std)
        nn.init.trunc_normal_(rel_pos_w, std=init_std)
    return rel_pos_h, rel_pos_w


class RelPosTables(nn.Module):
    """A standalone holder of ``rel_pos_parameters`` (the attention module keeps them as its own ``rel_pos_h`` /
    ``rel_pos_w`` attributes, detectron2's checkpoint keys).

    ``extent`` is the attention extent (window size, or the global grid at the training resolution); tables are
    resampled when a different extent is used.
    """

    def __init__(self, head_dim: int, extent, zero_init: bool = True, init_std: float = 0.02):
        super().__init__()
        self.rel_pos_h, self.rel_pos_w = rel_pos_parameters(head_dim, extent, zero_init, init_std)

    def tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rel_pos_h, self.rel_pos_w
