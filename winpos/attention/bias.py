"""Building the reference path's additive bias: LookHere's dense bias, the padding mask, and the rows of the relpos
+ LookHere + padding bias for a block of queries (what SDPA takes as its float ``attn_mask``)."""
from __future__ import annotations

import torch

from winpos.attention.geometry import Geometry
from winpos.errors import WinposError

__all__ = ["LOOKHERE_CACHE_BYTES", "bias_rows", "lookhere_bias", "lookhere_by_blocks", "merge_masks"]

# LookHere's dense (heads, Nq, Nk) bias is cached per block up to this size (a 1024^2 ViTDet-B global block needs
# 805 MB); larger grids build it a block of queries at a time, every call, and keep none of it.
LOOKHERE_CACHE_BYTES = 1024 * 2 ** 20


def lookhere_by_blocks(lookhere, geo: Geometry) -> bool:
    """Whether LookHere's dense bias for these groups is too large to cache (then it is built by query blocks)."""
    return lookhere is not None and lookhere.dense_bytes(geo.q_window, geo.k_window) > LOOKHERE_CACHE_BYTES


def lookhere_bias(lookhere, geo: Geometry, heads: int) -> torch.Tensor | None:
    """LookHere's dense ``(heads, Nq, Nk)`` bias (cached by the module), or None when there is no LookHere or its
    bias is built by query blocks instead (``lookhere_by_blocks``)."""
    if lookhere is None:
        return None
    built_for = getattr(lookhere, "num_heads", heads)
    if built_for != heads:
        raise WinposError(f"LookHere was built for {built_for} heads but attention has {heads}; build it with "
                          f"num_heads={heads}")
    return None if lookhere_by_blocks(lookhere, geo) else lookhere.bias(geo.q_window, geo.k_window)


def merge_masks(bias, pad, B, dtype):
    """Combine a (heads, Nq, Nk) float bias and a (groups, 1, Nq, Nk) bool mask into one 4-D float SDPA attn_mask.

    Always 4-D: PyTorch's fused CPU kernel takes a (1 | groups, 1 | heads, Nq, Nk) mask, but a 3-D one sends SDPA
    to its unfused math path (2x slower, N x N memory per head)."""
    if bias is not None and bias.dim() == 3:
        bias = bias.unsqueeze(0)
    if pad is not None:
        pad = pad.repeat(B, 1, 1, 1) if pad.shape[0] != 1 else pad
        pad_f = torch.zeros(pad.shape, dtype=dtype, device=pad.device).masked_fill_(~pad, float("-inf"))
        return pad_f if bias is None else pad_f + bias.to(dtype)
    return None if bias is None else bias.to(dtype)


def bias_rows(rel, lookhere, mask, geo: Geometry, s: int, e: int, dtype, out=None):
    """Relpos bias + LookHere bias + padding mask for query rows ``[s, e)``, ``(groups, heads, e - s, Nk)``.

    ``rel``: ``(rel_h, rel_w)`` per-query terms or None; ``lookhere``: a provider with ``bias_rows`` or None;
    ``mask``: the merged float mask or None. With ``out`` None the block is a new (differentiable) tensor; else it
    is written in place into ``out`` (inference, the reused workspace)."""
    if out is None:
        block = None
        if rel is not None:
            rel_h, rel_w = rel
            block = (rel_h[:, :, s:e, :, None] + rel_w[:, :, s:e, None, :]).flatten(-2)
        if lookhere is not None:
            lh = lookhere.bias_rows(geo.q_window, geo.k_window, s, e).to(dtype)[None]
            block = lh if block is None else block + lh
        if mask is not None:
            block = mask[..., s:e, :] if block is None else block + mask[..., s:e, :]
        return block
    if rel is not None:
        rel_h, rel_w = rel
        torch.add(rel_h[:, :, s:e, :, None], rel_w[:, :, s:e, None, :], out=out.view(*out.shape[:3], *geo.k_window))
        if lookhere is not None:
            out.add_(lookhere.bias_rows(geo.q_window, geo.k_window, s, e).to(dtype))
    elif out.shape[0] == 1 and dtype == torch.float32:
        lookhere.bias_rows(geo.q_window, geo.k_window, s, e, out=out[0])  # straight into the buffer
    else:
        out.copy_(lookhere.bias_rows(geo.q_window, geo.k_window, s, e).to(dtype))
    if mask is not None:
        out.add_(mask[..., s:e, :])
    return out
