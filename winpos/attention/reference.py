"""The reference backend: PyTorch SDPA on partitioned windows (the specification the Triton kernels are tested
against; itself tested against detectron2, SAM and the dense specification in ``winpos.attention.spec``).

Relpos stays fused either way: when autograd needs the backward, through ``winpos.attention.relpos_train`` (query
blocks, backward by recomputation: no N x N tensor kept between forward and backward, and q.k and p.v keep the
plain head dim); in inference, as SDPA's float mask built for a block of queries at a time (bounded memory). LookHere through its cached per-grid bias, or by query blocks when that bias is
too large to cache.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from winpos.attention.bias import bias_rows, lookhere_bias, merge_masks
from winpos.attention.geometry import Geometry, from_groups, geometry, padding_mask, to_groups
from winpos.attention.relpos_train import relpos_attention
from winpos.attention.terms import PositionTerms
from winpos.attention.workspace import mask_buffer
from winpos.posemb.relpos import rel_terms
from winpos.posemb.rope import rope_on_grid

__all__ = ["RELPOS_CHUNK_BYTES", "Grouped", "group", "reference_attention"]

# Largest relpos bias block (bytes) materialized at once by the inference path.
RELPOS_CHUNK_BYTES = 256 * 2 ** 20


class Grouped(NamedTuple):
    """q, k, v as ``(B * groups, heads, n, D)`` with RoPE applied, and what else attention needs to know."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    geo: Geometry
    lookhere_bias: torch.Tensor | None  # the cached dense bias; None when absent or built by query blocks
    pad: torch.Tensor | None  # (groups, 1, Nq, Nk) bool padding mask (pad_mode="mask")
    scale: float


def group(q, k, v, window, pos: PositionTerms, valid_hw, pad_mode, scale) -> Grouped:
    """The front shared by the reference and the specification: geometry, RoPE on the grid, grouping, LookHere's
    dense bias, the padding mask."""
    q_hw, k_hw = tuple(q.shape[1:3]), tuple(k.shape[1:3])
    geo = geometry(q_hw, k_hw, window)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if pos.rope is not None:
        q, k = rope_on_grid(q, k, pos.rope, geo.q_window, geo.k_window)
    qg, kg, vg = to_groups(q, geo, "q"), to_groups(k, geo, "k"), to_groups(v, geo, "k")
    bias = lookhere_bias(pos.lookhere, geo, qg.shape[1])
    pad = padding_mask(geo, q_hw, k_hw, valid_hw, q.device) if pad_mode == "mask" and valid_hw else None
    return Grouped(qg, kg, vg, geo, bias, pad, scale)


def _needs_backward(*tensors) -> bool:
    """True when autograd will need this attention's backward."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def reference_attention(q, k, v, *, window=None, pos=None, valid_hw=None, pad_mode="zeros", scale=None):
    """SDPA reference path; see ``winpos.attention.attention`` for arguments."""
    pos = pos or PositionTerms()
    g = group(q, k, v, window, pos, valid_hw, pad_mode, scale)
    B, q_hw = q.shape[0], tuple(q.shape[1:3])
    mask = merge_masks(g.lookhere_bias, g.pad, B, g.q.dtype)
    lookhere_rows = pos.lookhere if pos.lookhere is not None and g.lookhere_bias is None else None  # too large
    rel = rel_terms(g.q, *pos.rel_pos, g.geo.q_window, g.geo.k_window) if pos.rel_pos is not None else None
    if rel is not None and lookhere_rows is None and _needs_backward(g.q, g.k, g.v, *pos.rel_pos):
        out = relpos_attention(g.q, g.k, g.v, *rel, mask=mask, scale=g.scale)
    elif rel is not None or lookhere_rows is not None:
        out = _blockwise(g.q, g.k, g.v, rel, lookhere_rows, g.geo, mask, g.scale)
    else:
        out = _sdpa(g.q, g.k, g.v, mask, g.scale)
    return from_groups(out, g.geo, q_hw)


def _sdpa(qg, kg, vg, mask, scale):
    d_v = vg.shape[-1]
    if qg.shape[-1] != d_v:
        # SDPA's fused CPU/GPU kernels need one head dim for q, k and v; zero-padding v keeps them (else: math path).
        vg = F.pad(vg, (0, qg.shape[-1] - d_v))
    return F.scaled_dot_product_attention(qg, kg, vg, attn_mask=mask, scale=scale)[..., :d_v]


def _blockwise(qg, kg, vg, rel, lookhere, geo, mask, scale):
    """Inference path (and LookHere on grids too large to cache): the decomposed relpos bias and/or LookHere's bias,
    built for a block of queries at a time (at most RELPOS_CHUNK_BYTES), go to SDPA as its float mask, so q.k and
    p.v keep their plain head dim and no (Nq, Nk) tensor outlives its block. Without autograd every block is written into the
    reused workspace buffer."""
    groups, heads, n_q, n_k = *qg.shape[:3], kg.shape[2]
    row_bytes = groups * heads * n_k * qg.element_size()
    step = max(1, min(n_q, RELPOS_CHUNK_BYTES // row_bytes))
    grad = _needs_backward(qg, kg, vg, *(rel or ()))  # LookHere is fixed
    buf = None if grad else mask_buffer(groups * heads * step * n_k, qg.dtype, qg.device)
    outs = []
    for s in range(0, n_q, step):
        e = min(n_q, s + step)
        out = None if buf is None else buf[: groups * heads * (e - s) * n_k].view(groups, heads, e - s, n_k)
        block = bias_rows(rel, lookhere, mask, geo, s, e, qg.dtype, out)
        outs.append(F.scaled_dot_product_attention(qg[:, :, s:e], kg, vg, attn_mask=block, scale=scale))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
