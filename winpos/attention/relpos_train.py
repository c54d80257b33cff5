"""Decomposed relpos attention for training on the reference (SDPA) backend: queries in blocks, backward by
recomputation, no ``(Nq, Nk)`` tensor kept between forward and backward.

The logit of query n and key (h', w') is ``scale * q_n . k + rel_h[n, h'] + rel_w[n, w']`` (plus an optional float
mask). Autograd through a materialized bias keeps the ``(groups, heads, Nq, Nk)`` bias, the probabilities and the
bias's gradient alive (about 2.4 GB for one ViTDet-B global block at 1024 px); the augmented-QK identity avoids
them but widens q.k and p.v from the head dim to head dim + kh + kw (3x for a 64x64 grid: SDPA's fused CPU kernel
needs one head dim for q, k and v, so v is zero-padded). This ``autograd.Function`` keeps the plain head dim:

* **forward**: for each block of queries (at most ``BLOCK_BYTES`` of logits), the block's bias goes to SDPA as
  its float mask; only q, k, v, rel_h, rel_w and the output are saved;
* **backward**: per block, the logits and probabilities are recomputed and the flash-attention backward written
  out (``dS = P * (dP - rowsum(dO * O))``); the gradients of ``rel_h`` and ``rel_w`` are ``dS`` summed over the key
  columns and rows, which is the relpos backward's reduction done one block at a time. dK and dV accumulate in
  float32 whatever the input dtype (bf16 autocast).

It is tested against autograd through the dense specification (values and every gradient, float64, several
blocks) and with ``torch.autograd.gradcheck``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["BLOCK_BYTES", "relpos_attention"]

# Largest block of logits (bytes) held at once, forward and backward.
BLOCK_BYTES = 64 * 2 ** 20


def _step(q: torch.Tensor, n_k: int) -> int:
    groups, heads, n_q = q.shape[:3]
    return max(1, min(n_q, BLOCK_BYTES // max(1, groups * heads * n_k * q.element_size())))


def _bias(rel_h, rel_w, mask, s: int, e: int, n_k: int) -> torch.Tensor:
    g, h = rel_h.shape[:2]
    bias = (rel_h[:, :, s:e, :, None] + rel_w[:, :, s:e, None, :]).reshape(g, h, e - s, n_k)
    return bias if mask is None else bias + mask[:, :, s:e]


class _RelposAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, rel_h, rel_w, mask, scale):
        n_k, step = k.shape[2], _step(q, k.shape[2])
        out = q.new_empty(*q.shape[:3], v.shape[-1])
        for s in range(0, q.shape[2], step):
            e = min(q.shape[2], s + step)
            out[:, :, s:e] = F.scaled_dot_product_attention(q[:, :, s:e], k, v, scale=scale,
                                                            attn_mask=_bias(rel_h, rel_w, mask, s, e, n_k))
        ctx.save_for_backward(q, k, v, rel_h, rel_w, mask, out)
        ctx.scale, ctx.step = scale, step
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, rel_h, rel_w, mask, out = ctx.saved_tensors
        scale, step = ctx.scale, ctx.step
        kh, kw = rel_h.shape[-1], rel_w.shape[-1]
        acc = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        d_q, d_rh, d_rw = torch.empty_like(q), torch.empty_like(rel_h), torch.empty_like(rel_w)
        d_k = torch.zeros(k.shape, dtype=acc, device=k.device)
        d_v = torch.zeros(v.shape, dtype=acc, device=v.device)
        d_out = d_out.to(q.dtype)
        delta = (d_out * out).sum(-1, keepdim=True)
        k_t, v_t = k.transpose(-2, -1), v.transpose(-2, -1)
        groups, heads, n_q, n_k = *q.shape[:3], k.shape[2]
        for s in range(0, n_q, step):
            e = min(n_q, s + step)
            logits = torch.matmul(q[:, :, s:e], k_t).mul_(scale).add_(_bias(rel_h, rel_w, mask, s, e, n_k))
            p = torch.softmax(logits, dim=-1)
            del logits
            do = d_out[:, :, s:e]
            d_v.add_(torch.matmul(p.transpose(-2, -1), do))
            d_s = torch.matmul(do, v_t).sub_(delta[:, :, s:e]).mul_(p)
            del p
            grid = d_s.view(groups, heads, e - s, kh, kw)
            d_rh[:, :, s:e] = grid.sum(-1)
            d_rw[:, :, s:e] = grid.sum(-2)
            d_q[:, :, s:e] = torch.matmul(d_s, k).mul_(scale)
            d_k.add_(torch.matmul(d_s.transpose(-2, -1), q[:, :, s:e]), alpha=scale)
        return d_q, d_k.to(k.dtype), d_v.to(v.dtype), d_rh, d_rw, None, None


def relpos_attention(q, k, v, rel_h, rel_w, mask=None, scale: float | None = None) -> torch.Tensor:
    """``softmax(scale * q k^T + bias) v`` for grouped ``q, k, v (G, heads, N, D)``; key n = (h', w') of a
    row-major ``kh x kw`` grid gets ``rel_h[..., h'] + rel_w[..., w']`` (``rel_h (G, heads, Nq, kh)``, ``rel_w
    (G, heads, Nq, kw)``), plus ``mask`` (a float ``(1 | G, 1 | heads, Nq, Nk)`` tensor, not differentiated)."""
    kh, kw = rel_h.shape[-1], rel_w.shape[-1]
    if kh * kw != k.shape[2]:
        raise ValueError(f"rel_h / rel_w describe a {kh}x{kw} key grid but k has {k.shape[2]} keys")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if mask is not None:
        mask = mask.detach().to(q.dtype).expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    rel_h, rel_w = rel_h.to(q.dtype), rel_w.to(q.dtype)
    return _RelposAttention.apply(q, k, v, rel_h, rel_w, mask, scale)
