"""The specification: materialized ``softmax(scale * q.k + bias) @ v``, every position term built whole.

Slow and memory-hungry by design; the reference backend is tested against it (and the benchmark times it as the
naive baseline). Never used by the models."""
from __future__ import annotations

from winpos.attention.bias import merge_masks
from winpos.attention.reference import group
from winpos.attention.geometry import from_groups
from winpos.attention.terms import PositionTerms
from winpos.posemb.relpos import rel_bias_dense

__all__ = ["dense_attention"]


def dense_attention(q, k, v, *, window=None, pos=None, valid_hw=None, pad_mode="zeros", scale=None):
    """Materialized attention with the arguments of ``winpos.attention.attention``."""
    pos = pos or PositionTerms()
    g = group(q, k, v, window, pos, valid_hw, pad_mode, scale)
    B, q_hw = q.shape[0], tuple(q.shape[1:3])
    bias = g.lookhere_bias
    if bias is None and pos.lookhere is not None:  # materialize whatever the fast path builds by blocks
        bias = pos.lookhere.bias(g.geo.q_window, g.geo.k_window)
    logits = (g.q * g.scale) @ g.k.transpose(-1, -2)
    if pos.rel_pos is not None:
        logits = logits + rel_bias_dense(g.q, *pos.rel_pos, g.geo.q_window, g.geo.k_window)
    mask = merge_masks(bias, g.pad, B, logits.dtype)
    if mask is not None:
        logits = logits + mask
    out = logits.softmax(dim=-1) @ g.v
    return from_groups(out, g.geo, q_hw)
