"""The one attention entry point of winpos: window or global attention on a token grid, with position terms.

Callers pass q, k, v on the (padded) token grid and a *description* of the position terms (a RoPE provider,
relpos tables, a LookHere provider), never a materialized N x N bias. Two backends give the same answer:

- ``reference``: PyTorch SDPA on partitioned windows. Relpos stays fused either way: when autograd needs the
  backward, through the augmented-QK identity (no N x N tensor in forward or backward); in inference, as SDPA's
  float mask built for a block of queries at a time (narrower matmuls, bounded memory). LookHere through a cached
  per-grid mask.
- ``triton``: the fused kernels of ``winpos.kernels`` (CUDA only), which compute every term per tile.

``backend="auto"`` picks Triton on CUDA when it is importable and the reference elsewhere;
``WINPOS_ATTENTION_BACKEND=reference|triton`` forces either globally.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from winpos.errors import check_choice
from winpos.posemb.relpos import key_codes, rel_bias_dense, rel_terms
from winpos.windows import PAD_MODES, valid_key_mask, window_partition, window_unpartition

BACKENDS = ("auto", "reference", "triton")


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


@dataclass(frozen=True)
class Geometry:
    """How q and k grids split into attention groups (windows, or one global group)."""

    q_window: tuple[int, int]  # tokens per window side for queries
    k_window: tuple[int, int]
    windowed: bool


def _geometry(q_hw, k_hw, window) -> Geometry:
    (Hq, Wq), (Hk, Wk) = q_hw, k_hw
    if Hk % Hq or Wk % Wq or Hk // Hq != Wk // Wq:
        raise ValueError(
            f"query grid {Hq}x{Wq} must be the key grid {Hk}x{Wk} pooled by one integer stride (Hiera q-pooling)"
        )
    stride = Hk // Hq
    if window is None or window == 0:
        return Geometry((Hq, Wq), (Hk, Wk), False)
    if window % stride:
        raise ValueError(f"window {window} is not divisible by the query pooling stride {stride}")
    if Hk % window or Wk % window:
        raise ValueError(
            f"window_size={window} does not tile the {Hk}x{Wk} token grid; pad the grid with "
            "winpos.windows.pad_to_window first (the backbones do) or choose a window that divides it"
        )
    qw = window // stride
    return Geometry((qw, qw), (window, window), True)


def _check_inputs(q, k, v):
    if q.dim() != 5 or k.dim() != 5 or v.dim() != 5:
        raise ValueError(
            "attention expects q, k, v on the token grid as (B, H, W, heads, head_dim); got shapes "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if k.shape != v.shape[:-1] + (k.shape[-1],) or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q, k, v disagree on batch, heads or key grid: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k head dims differ ({q.shape[-1]} vs {k.shape[-1]}); they must match for q.k")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v are on different devices ({q.device}, {k.device}, {v.device}); move them together")


def _to_groups(x: torch.Tensor, geo: Geometry, which: str) -> torch.Tensor:
    """``(B, H, W, heads, D) -> (B * groups, heads, n, D)``."""
    win = geo.q_window if which == "q" else geo.k_window
    if geo.windowed:
        x = window_partition(x, win[0])
    else:
        x = x.flatten(1, 2)
    return x.transpose(1, 2)


def _from_groups(x: torch.Tensor, geo: Geometry, q_hw) -> torch.Tensor:
    x = x.transpose(1, 2)
    if geo.windowed:
        return window_unpartition(x, geo.q_window[0], q_hw)
    return x.reshape(x.shape[0], q_hw[0], q_hw[1], *x.shape[2:])


def _padding_mask(geo, q_hw, k_hw, valid_hw, device) -> torch.Tensor | None:
    """``(groups, 1, Nq, Nk)`` bool, True = attend: valid queries do not see padded keys; padded queries (cropped
    later) see everything, so no row is ever fully masked."""
    (Hk, Wk) = k_hw
    H, W = valid_hw
    if (H, W) == (Hk, Wk):
        return None
    stride = Hk // q_hw[0]
    k_valid = valid_key_mask(k_hw, (H, W), geo.k_window[0] if geo.windowed else Hk, device) if geo.windowed else (
        ((torch.arange(Hk, device=device)[:, None] < H) & (torch.arange(Wk, device=device)[None, :] < W)).reshape(1, -1)
    )
    qH, qW = -(-H // stride), -(-W // stride)
    if geo.windowed:
        q_valid = valid_key_mask(q_hw, (qH, qW), geo.q_window[0], device)
    else:
        q_valid = ((torch.arange(q_hw[0], device=device)[:, None] < qH) & (torch.arange(q_hw[1], device=device)[None, :] < qW)).reshape(1, -1)
    return ~(q_valid[:, :, None] & ~k_valid[:, None, :])[:, None]


def _grid_table(table: torch.Tensor, win_hw, grid_hw) -> torch.Tensor:
    """Spread a per-window table ``(N, R/2)`` or ``(heads, N, R/2)`` over a grid whose windows it tiles:
    ``(H, W, 1 | heads, R/2)``. Fixed tables carry their spread copies with them (an attribute of the table
    tensor, so a freed table can never alias a new one); learned tables are gathered differentiably each call."""
    key = (table._version, tuple(win_hw), tuple(grid_hw))
    cache = None if table.requires_grad else table.__dict__.setdefault("_winpos_grid_tables", {})
    if cache is not None and key in cache:
        return cache[key]
    (wh, ww), (H, W) = win_hw, grid_hw
    ys = torch.arange(H, device=table.device) % wh
    xs = torch.arange(W, device=table.device) % ww
    idx = ys[:, None] * ww + xs[None, :]
    out = table[idx][:, :, None] if table.dim() == 2 else table[:, idx].permute(1, 2, 0, 3)
    if cache is not None:
        cache.clear()
        cache[key] = out
    return out


def _rotate_grid(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rot_dims: int, pairing: str) -> torch.Tensor:
    """RoPE on grid tensors ``(B, H, W, heads, D)`` with ``(H, W, 1|heads, R/2)`` tables; only the first R dims
    are touched, in fp32, written into one fresh tensor (cheaper than rotating partitioned copies)."""
    half = rot_dims // 2
    compute = torch.promote_types(x.dtype, torch.float32)
    if pairing == "half":
        pick = (slice(0, half), slice(half, rot_dims))
    else:
        pick = (slice(0, rot_dims, 2), slice(1, rot_dims, 2))
    a, b = x[..., pick[0]].to(compute), x[..., pick[1]].to(compute)
    c, s = cos.to(compute), sin.to(compute)
    if compute == x.dtype and not (torch.is_grad_enabled() and (x.requires_grad or c.requires_grad or s.requires_grad)):
        # Inference in fp32: write each rotated half in place (a multiply and a fused multiply-add), no temporaries.
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        if rot_dims < x.shape[-1]:
            out[..., rot_dims:] = x[..., rot_dims:]
        out_a, out_b = out[..., pick[0]], out[..., pick[1]]
        torch.mul(a, c, out=out_a).addcmul_(b, s, value=-1)
        torch.mul(b, c, out=out_b).addcmul_(a, s)
        return out
    out = x.clone(memory_format=torch.contiguous_format)
    out[..., pick[0]] = a * c - b * s
    out[..., pick[1]] = b * c + a * s
    return out


def rope_on_grid(q, k, rope, geo: "Geometry"):
    """Rotate q and k on their grids with the provider's window-local (or global) tables."""
    t = rope.tables(geo.q_window, geo.k_window)
    q_hw, k_hw = tuple(q.shape[1:3]), tuple(k.shape[1:3])
    q = _rotate_grid(q, _grid_table(t.cos_q, geo.q_window, q_hw), _grid_table(t.sin_q, geo.q_window, q_hw),
                     t.rot_dims, t.pairing)
    k = _rotate_grid(k, _grid_table(t.cos_k, geo.k_window, k_hw), _grid_table(t.sin_k, geo.k_window, k_hw),
                     t.rot_dims, t.pairing)
    return q, k


# LookHere's dense (heads, Nq, Nk) bias is cached per block up to this size (a 1024^2 ViTDet-B global block needs
# 805 MB); larger grids build it a block of queries at a time, every call, and keep none of it.
LOOKHERE_CACHE_BYTES = 1024 * 2 ** 20


def _position_inputs(q, k, pos: PositionTerms, geo: Geometry):
    """Return (q, k, lookhere bias or None) for grouped q, k (RoPE is applied on the grid, before grouping).
    The bias is None also when it is too large to cache; ``_blockwise`` then builds it by query blocks."""
    bias = None
    if pos.lookhere is not None:
        heads = getattr(pos.lookhere, "num_heads", q.shape[1])
        if heads != q.shape[1]:
            raise ValueError(f"LookHere was built for {heads} heads but attention has {q.shape[1]}")
        if not _lookhere_by_blocks(pos, geo):
            bias = pos.lookhere.bias(geo.q_window, geo.k_window)
    return q, k, bias


def _lookhere_by_blocks(pos: PositionTerms, geo: Geometry) -> bool:
    return pos.lookhere is not None and pos.lookhere.dense_bytes(geo.q_window, geo.k_window) > LOOKHERE_CACHE_BYTES


def _merge_masks(bias, pad, B, dtype):
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


def _prepare(q, k, v, window, pos, valid_hw, pad_mode, scale):
    """Shared front of both paths: geometry, RoPE on the grid, grouping, LookHere bias, padding mask."""
    q_hw, k_hw = tuple(q.shape[1:3]), tuple(k.shape[1:3])
    geo = _geometry(q_hw, k_hw, window)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if pos.rope is not None:
        q, k = rope_on_grid(q, k, pos.rope, geo)
    qg, kg, vg = _to_groups(q, geo, "q"), _to_groups(k, geo, "k"), _to_groups(v, geo, "k")
    qg, kg, bias = _position_inputs(qg, kg, pos, geo)
    pad = _padding_mask(geo, q_hw, k_hw, valid_hw, q.device) if pad_mode == "mask" and valid_hw else None
    return qg, kg, vg, geo, bias, pad, scale


def reference_attention(q, k, v, *, window=None, pos=None, valid_hw=None, pad_mode="zeros", scale=None):
    """SDPA reference path; see ``attention`` for arguments."""
    pos = pos or PositionTerms()
    qg, kg, vg, geo, bias, pad, scale = _prepare(q, k, v, window, pos, valid_hw, pad_mode, scale)
    B, q_hw = q.shape[0], tuple(q.shape[1:3])
    mask = _merge_masks(bias, pad, B, qg.dtype)
    lookhere_rows = pos.lookhere if pos.lookhere is not None and bias is None else None  # too large to cache
    rel = rel_terms(qg, *pos.rel_pos, geo.q_window, geo.k_window) if pos.rel_pos is not None else None
    if rel is not None and lookhere_rows is None and _lean_backward(qg, kg, vg, *pos.rel_pos):
        out = _relpos_augmented(qg, kg, vg, *rel, geo, mask, scale)
    elif rel is not None or lookhere_rows is not None:
        out = _blockwise(qg, kg, vg, rel, lookhere_rows, geo, mask, scale)
    else:
        out = _sdpa(qg, kg, vg, mask, scale)
    return _from_groups(out, geo, q_hw)


# Largest relpos bias block (bytes) materialized at once by the inference path.
RELPOS_CHUNK_BYTES = 256 * 2 ** 20


def _lean_backward(*tensors) -> bool:
    """True when autograd will need this attention's backward: then relpos takes the augmented-QK path, whose
    backward keeps no (Nq, Nk) tensor alive."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _sdpa(qg, kg, vg, mask, scale):
    d_v = vg.shape[-1]
    if qg.shape[-1] != d_v:
        # SDPA's fused CPU/GPU kernels need one head dim for q, k and v; zero-padding v keeps them (else: math path).
        vg = F.pad(vg, (0, qg.shape[-1] - d_v))
    return F.scaled_dot_product_attention(qg, kg, vg, attn_mask=mask, scale=scale)[..., :d_v]


def _relpos_augmented(qg, kg, vg, rel_h, rel_w, geo, mask, scale):
    """Augmented-QK identity: [scale*q, rel_h, rel_w] . [k, onehot(row), onehot(col)] = scale*q.k + relpos bias.
    No (Nq, Nk) tensor in forward or backward, at the price of a wider q.k (and v padded to match)."""
    codes = key_codes(geo.k_window, kg.dtype, kg.device).expand(*kg.shape[:2], -1, -1)
    return _sdpa(torch.cat([qg * scale, rel_h, rel_w], dim=-1), torch.cat([kg, codes], dim=-1), vg, mask, 1.0)


def _blockwise(qg, kg, vg, rel, lookhere, geo, mask, scale):
    """Inference path (and LookHere on grids too large to cache): the decomposed relpos bias and/or LookHere's bias,
    built for a block of queries at a time (at most RELPOS_CHUNK_BYTES), go to SDPA as its float mask, so q.k and
    p.v keep their plain head dim (faster than the augmented product, whose q.k and p.v are up to 3x wider for
    global blocks) and no (Nq, Nk) tensor outlives its block. Without autograd every block is written into one
    reused buffer (``_mask_buffer``)."""
    groups, heads, n_q, n_k = *qg.shape[:3], kg.shape[2]
    row_bytes = groups * heads * n_k * qg.element_size()
    step = max(1, min(n_q, RELPOS_CHUNK_BYTES // row_bytes))
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (qg, kg, vg, *(rel or ())))  # LookHere is fixed
    buf = None if grad else _mask_buffer(groups * heads * step * n_k, qg.dtype, qg.device)
    outs = []
    for s in range(0, n_q, step):
        e = min(n_q, s + step)
        out = None if buf is None else buf[: groups * heads * (e - s) * n_k].view(groups, heads, e - s, n_k)
        block = _bias_rows(rel, lookhere, mask, geo, s, e, qg.dtype, out)
        outs.append(F.scaled_dot_product_attention(qg[:, :, s:e], kg, vg, attn_mask=block, scale=scale))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


def _bias_rows(rel, lookhere, mask, geo, s, e, dtype, out=None):
    """Relpos bias + LookHere bias + padding mask for query rows ``[s, e)``: a new tensor (differentiable) when
    ``out`` is None, else written in place into ``out`` ``(groups, heads, e - s, Nk)``."""
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


# One mask buffer per thread, per dtype, for CPU inference (at most RELPOS_CHUNK_BYTES each; ``release_workspace``
# frees them). A fresh allocation this large is mmap'ed and page-faulted on every call: building the 805 MB bias of
# a ViTDet-B global block at 1024^2 took 0.28 s fresh and 0.09 s into a reused buffer (2 threads).
_WORKSPACE = threading.local()


def _mask_buffer(numel: int, dtype, device) -> torch.Tensor:
    if device.type != "cpu":  # the CUDA caching allocator already reuses memory
        return torch.empty(numel, dtype=dtype, device=device)
    buffers = _WORKSPACE.__dict__.setdefault("buffers", {})
    buf = buffers.get(dtype)
    if buf is None or buf.numel() < numel:
        buffers[dtype] = None  # free the old buffer before allocating the larger one
        buf = buffers[dtype] = torch.empty(numel, dtype=dtype, device=device)
    return buf[:numel]


def release_workspace() -> None:
    """Free this thread's reused CPU mask buffers (they hold at most RELPOS_CHUNK_BYTES per dtype)."""
    _WORKSPACE.__dict__.pop("buffers", None)


def dense_attention(q, k, v, *, window=None, pos=None, valid_hw=None, pad_mode="zeros", scale=None):
    """Materialized softmax(scale*q.k + bias) @ v. The plain specification; used only by tests."""
    pos = pos or PositionTerms()
    qg, kg, vg, geo, bias, pad, scale = _prepare(q, k, v, window, pos, valid_hw, pad_mode, scale)
    B, q_hw = q.shape[0], tuple(q.shape[1:3])
    if bias is None and pos.lookhere is not None:  # the spec materializes whatever the fast path builds by blocks
        bias = pos.lookhere.bias(geo.q_window, geo.k_window)
    logits = (qg * scale) @ kg.transpose(-1, -2)
    if pos.rel_pos is not None:
        logits = logits + rel_bias_dense(qg, *pos.rel_pos, geo.q_window, geo.k_window)
    mask = _merge_masks(bias, pad, B, logits.dtype)
    if mask is not None:
        logits = logits + mask
    out = logits.softmax(dim=-1) @ vg
    return _from_groups(out, geo, q_hw)


def _triton_available() -> bool:
    try:
        from winpos.kernels import window_attention as _  # noqa: F401
    except Exception:
        return False
    return True


def resolve_backend(backend: str, device: torch.device) -> str:
    backend = os.environ.get("WINPOS_ATTENTION_BACKEND", backend) if backend == "auto" else backend
    check_choice("attention backend", backend, BACKENDS)
    if backend == "auto":
        return "triton" if device.type == "cuda" and _triton_available() else "reference"
    if backend == "triton" and not _triton_available():
        raise ValueError("backend='triton' was forced but winpos.kernels could not be imported; install triton")
    return backend


def attention(q, k, v, *, window=None, pos: PositionTerms | None = None, valid_hw=None, pad_mode="zeros",
              scale=None, backend="auto"):
    """Window or global attention on a token grid.

    Args:
        q: ``(B, Hq, Wq, heads, head_dim)`` queries; ``Hq = Hk / s`` for pooled queries (Hiera q-pool, stride s).
        k, v: ``(B, Hk, Wk, heads, head_dim)`` keys and values; the grid must already be padded to multiples of
            ``window`` (``winpos.windows.pad_to_window``).
        window: key window size, or None/0 for global attention. The query window is ``window / s``.
        pos: position terms (RoPE provider, relpos tables, LookHere provider).
        valid_hw: the unpadded key grid ``(H, W)``; used by ``pad_mode="mask"``.
        pad_mode: ``"zeros"`` (detectron2/SAM: padded tokens are unmasked keys) or ``"mask"``.
        scale: logit scale, default ``head_dim ** -0.5``.
        backend: ``"auto"``, ``"reference"`` or ``"triton"``.
    Returns:
        ``(B, Hq, Wq, heads, head_dim)``.
    """
    _check_inputs(q, k, v)
    check_choice("pad_mode", pad_mode, PAD_MODES)
    backend = resolve_backend(backend, q.device)
    if backend == "triton":
        from winpos.kernels import window_attention as triton_attention

        return triton_attention(q, k, v, window=window, pos=pos, valid_hw=valid_hw, pad_mode=pad_mode, scale=scale)
    return reference_attention(q, k, v, window=window, pos=pos, valid_hw=valid_hw, pad_mode=pad_mode, scale=scale)
