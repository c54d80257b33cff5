"""Token coordinates on a query grid and a key grid: the one rule for where pooled queries sit (RoPE's angles and
LookHere's distances both read it).

Tokens are row-major, coordinates ``(y, x)`` in key-grid token units. Keys sit at integer positions. Queries pooled
by an integer stride ``s`` per axis (``k = s * q``, Hiera q-pooling) sit at the centre of their ``s x s`` key cell,
``s * i + (s - 1) / 2``, so q and k share one frame.
"""
from __future__ import annotations

import torch
from torch import Tensor

from winpos.errors import WinposError, as_hw

__all__ = ["query_key_coords"]


def query_key_coords(q_hw, k_hw, ref_hw=None, device=None) -> tuple[Tensor, Tensor]:
    """Token coordinates ``(Nq, 2)`` and ``(Nk, 2)`` as (y, x) in float32, row-major.

    Keys sit at integer (y, x) on the ``k_hw`` grid. Queries on a grid pooled by an integer stride s per axis
    (``k = s * q``, Hiera q-pooling) sit at the centre of their s x s key cell, ``s * i + (s - 1) / 2``, so q and k
    share one frame. With ``ref_hw`` both are rescaled by ``ref / k_size`` per axis (EVA / timm
    ``ref_feat_shape`` position interpolation).
    """
    (qh, qw), (kh, kw) = as_hw(q_hw, "q_hw"), as_hw(k_hw, "k_hw")
    if qh > kh or qw > kw:
        raise WinposError(
            f"query grid {qh}x{qw} is larger than the key grid {kh}x{kw}; attention takes equal grids or pooled "
            "queries (key grid = integer stride x query grid): swap q_hw and k_hw or pool the queries"
        )
    if kh % qh or kw % qw:
        raise WinposError(
            f"query grid {qh}x{qw} does not pool the key grid {kh}x{kw} by an integer stride; pooled queries sit "
            "at key-cell centres, so pad the key grid to a multiple of the query stride"
        )
    axes_q, axes_k = [], []
    for q_size, k_size, ref in zip((qh, qw), (kh, kw), ref_hw if ref_hw is not None else (None, None)):
        stride = k_size // q_size
        k_t = torch.arange(k_size, device=device, dtype=torch.int64).to(torch.float32)
        q_t = torch.arange(q_size, device=device, dtype=torch.int64).to(torch.float32) * stride + (stride - 1) / 2
        if ref is not None:
            # Divide then multiply, in this order, to match timm's ref_feat_shape rounding bit for bit.
            k_t, q_t = k_t / k_size * ref, q_t / k_size * ref
        axes_q.append(q_t)
        axes_k.append(k_t)
    grid_q = torch.stack(torch.meshgrid(*axes_q, indexing="ij"), dim=-1).reshape(-1, 2)
    grid_k = torch.stack(torch.meshgrid(*axes_k, indexing="ij"), dim=-1).reshape(-1, 2)
    return grid_q, grid_k
