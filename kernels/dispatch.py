"""``window_attention``: the fused-kernel twin of ``winpos.attention.reference_attention`` (same arguments, same
semantics, same ``(B, Hq, Wq, heads, D)`` result).

Position terms arrive as a ``PositionTerms``-like object (duck-typed: ``rope``, ``rel_pos``, ``lookhere``
attributes) and are turned into small kernel inputs here:

* RoPE: ``rope.tables(q_window, k_window)`` -> fp32 cos/sin, rotated in-kernel on load (backward rotates dq, dk
  by -theta). When a table requires grad (learnable mixed RoPE) or relpos is also present (its per-query terms
  need the rotated q), q and k are rotated *outside* the kernel with the differentiable PyTorch grid op and the
  kernel runs without RoPE: the kernel returns gradients for the rotated q, k and autograd carries them to the
  frequencies.
* Relpos: ``rel_h = q . Rh``, ``rel_w = q . Rw`` by an einsum on the grid (no partition), packed as
  ``(B, Hq, Wq, heads, KH_P + KW_P)`` (each part zero-padded to a power of two); the bias tile is built in-kernel and its gradient reduced in the dQ pass.
* LookHere: ``fov``/``slopes`` buffers plus ``tile_classes(q_window, k_window, block_m, block_n)`` (cached by the
  module per grid) so empty key tiles are skipped.
"""
from __future__ import annotations

import functools

import torch

from . import self_check
from .attention_fwd_bwd import Plan, attention
from .launch_config import default_blocks, default_pack, pow2
from .rope import rotate_on_grid
from winpos.cache import GridCache
from winpos.windows import PAD_MODES, attention_groups

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 128


def fast_inputs(dtype: torch.dtype, head_dim: int, v_like_k: bool) -> bool:
    """Whether the compiled kernels take such inputs on their fast path: float16/bfloat16 (fp32 runs exact-fp32
    FMA dots, 10-100x slower than the reference's SDPA; fp64 is refused), head_dim in 16..128, v shaped like k."""
    return dtype in (torch.float16, torch.bfloat16) and MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM and v_like_k


def prefers_kernels(q, k, v) -> bool:
    """For ``backend="auto"``: on CUDA, route to the kernels only inputs they take fast (``fast_inputs``); fp32,
    fp64 or unsupported head dims go to the reference instead of a slow path or an error. Off CUDA (the
    interpreter, chosen explicitly) always True."""
    if q.device.type != "cuda":
        return True
    return q.dtype == k.dtype == v.dtype and fast_inputs(q.dtype, q.shape[-1], v.shape == k.shape)


def _check_qkv(q, k, v) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 5:
            raise ValueError(f"window_attention expects {name} on the token grid as (B, H, W, heads, head_dim), got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    if k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[3:] != k.shape[3:]:
        raise ValueError(f"q, k, v disagree on batch, heads or head_dim (or k and v on the grid): {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}; v must have k's shape")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v are on different devices ({q.device}, {k.device}, {v.device}); move them together")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in DTYPES:
        raise ValueError(f"q, k, v must share one dtype among float16, bfloat16, float32; got {q.dtype}, {k.dtype}, "
                         f"{v.dtype} (use backend='reference' for float64)")
    head_dim = q.shape[-1]
    if not MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim={head_dim} is not supported by the Triton kernels ({MIN_HEAD_DIM}..{MAX_HEAD_DIM}, "
                         "padded to a power of two inside); use backend='reference'")
    if min(q.shape) == 0 or min(k.shape) == 0:
        raise ValueError(f"empty input: q {tuple(q.shape)}, k {tuple(k.shape)}")


def _padding(pad_mode, valid_hw, k_hw, pool):
    """(pad_mask, qvh, qvw, kvh, kvw)."""
    if pad_mode not in PAD_MODES:
        raise ValueError(f"unknown pad_mode={pad_mode!r}; choose 'zeros' or 'mask'")
    Hk, Wk = k_hw
    if pad_mode != "mask" or not valid_hw:
        return 0, Hk // pool, Wk // pool, Hk, Wk
    H, W = (int(valid_hw[0]), int(valid_hw[1]))
    if not (0 < H <= Hk and 0 < W <= Wk):
        raise ValueError(f"valid_hw={tuple(valid_hw)} must lie inside the padded {Hk}x{Wk} key grid")
    if (H, W) == (Hk, Wk):
        return 0, Hk // pool, Wk // pool, Hk, Wk
    return 1, -(-H // pool), -(-W // pool), H, W


# Kernel inputs prepared from position modules (validated, converted tables), a third of a call's host time when
# rebuilt on every call; the one grid cache of winpos, keyed by the source tensors' fingerprints. Each entry also
# holds its sources, so a storage pointer in a fingerprint cannot be reused by another tensor while it lives.
_PREPARED = GridCache(size=64)


def _derived(sources: tuple, extra: tuple, build):
    """``build()``, cached while the ``sources`` tensors are unmodified (``winpos.cache`` rules: not while
    torch.compile traces or autograd records through them)."""
    return _PREPARED.get(extra, lambda: (sources, build()), *sources)[1]


def _rope_inputs(rope, q_win, k_win, q, k, heads, rotate_outside):
    """Fused tables (cos_q, sin_q, cos_k, sin_k, rot_dims, half) or rotated (q, k) when rotating outside."""
    t = rope.tables(q_win, k_win)
    learnable = torch.is_grad_enabled() and any(x.requires_grad for x in (t.cos_q, t.sin_q, t.cos_k, t.sin_k))
    if not (rotate_outside or learnable):
        sources = (t.cos_q, t.sin_q, t.cos_k, t.sin_k)
        extra = (t.rot_dims, t.pairing, q_win, k_win, heads, q.shape[-1], q.device)
        return _derived(sources, extra, lambda: _fused_rope_tables(t, q_win, k_win, q, heads)), q, k
    _check_rope_tables(t, q_win, k_win, q, heads)
    q = rotate_on_grid(q, t.cos_q, t.sin_q, t.rot_dims, t.pairing, q_win)
    k = rotate_on_grid(k, t.cos_k, t.sin_k, t.rot_dims, t.pairing, k_win)
    return None, q, k


def _fused_rope_tables(t, q_win, k_win, q, heads):
    """Validated fp32 contiguous tables for the kernels: (cos_q, sin_q, cos_k, sin_k, rot_dims, half)."""
    _check_rope_tables(t, q_win, k_win, q, heads)
    tabs = tuple(x.detach().float().contiguous() for x in (t.cos_q, t.sin_q, t.cos_k, t.sin_k))
    return (*tabs, t.rot_dims, t.pairing == "half")


def _check_rope_tables(t, q_win, k_win, q, heads):
    head_dim = q.shape[-1]
    if t.pairing not in ("half", "interleaved"):
        raise ValueError(f"RoPE pairing {t.pairing!r} is not supported; use 'half' or 'interleaved'")
    for name, tab, n in (("q", t.cos_q, q_win[0] * q_win[1]), ("k", t.cos_k, k_win[0] * k_win[1])):
        good = tab.shape[-2:] == (n, t.rot_dims // 2) and (tab.dim() == 2 or tab.shape[0] in (1, heads))
        if not good or t.rot_dims % 2 or t.rot_dims > head_dim:
            raise ValueError(f"RoPE {name} table {tuple(tab.shape)} does not fit {n} window tokens, {heads} heads, "
                             f"rot_dims={t.rot_dims} <= head_dim={head_dim}; build the RoPE for this attention")
        if tab.device != q.device:
            raise ValueError(f"RoPE tables are on {tab.device} but q is on {q.device}; move the RoPE module too")


def _rel_inputs(rel_pos, q, q_win, k_win):
    """Packed ``[rel_h | 0 | rel_w | 0]`` ``(B, Hq, Wq, heads, KH_P + KW_P)`` from the grid queries (no partition
    copy): each part zero-padded to the kernels' power-of-two extent, so rows are 16-byte aligned."""
    from winpos.posemb.relpos import rel_lookup  # lower layer (pure posemb helpers); imported lazily

    rel_pos_h, rel_pos_w = rel_pos
    D = q.shape[-1]
    for name, table in (("rel_pos_h", rel_pos_h), ("rel_pos_w", rel_pos_w)):
        if table.dim() != 2 or table.shape[-1] != D:
            raise ValueError(f"{name} has shape {tuple(table.shape)}; expected (2*extent-1, head_dim={D})")
        if table.device != q.device:
            raise ValueError(f"{name} is on {table.device} but q is on {q.device}; move the model to one device")
    Rh = rel_lookup(rel_pos_h, q_win[0], k_win[0]).to(q.dtype)  # (qwh, kwh, D)
    Rw = rel_lookup(rel_pos_w, q_win[1], k_win[1]).to(q.dtype)  # (qww, kww, D)
    B, Hq, Wq, heads, _ = q.shape
    qv = q.reshape(B, Hq // q_win[0], q_win[0], Wq // q_win[1], q_win[1], heads, D)
    rel_h = torch.einsum("bYyXxnc,yac->bYyXxna", qv, Rh)
    rel_w = torch.einsum("bYyXxnc,xac->bYyXxna", qv, Rw)
    kh_p, kw_p = pow2(k_win[0]), pow2(k_win[1])
    zeros = rel_h.new_zeros(()).expand
    parts = [rel_h, zeros(*rel_h.shape[:-1], kh_p - k_win[0]), rel_w, zeros(*rel_w.shape[:-1], kw_p - k_win[1])]
    return torch.cat(parts, dim=-1).reshape(B, Hq, Wq, heads, kh_p + kw_p)


def _lookhere_inputs(lh, q_win, k_win, heads, blocks, device):
    """``_lookhere_tables`` behind ``torch.compiler.disable``, wrapped on first use (importing torch's compiler
    at ``import winpos.kernels`` would import triton)."""
    global _LOOKHERE_EAGER
    if _LOOKHERE_EAGER is None:
        _LOOKHERE_EAGER = torch.compiler.disable(_lookhere_tables)
    return _LOOKHERE_EAGER(lh, q_win, k_win, heads, blocks, device)


_LOOKHERE_EAGER = None


def _lookhere_tables(lh, q_win, k_win, heads, blocks, device):
    """(fov int32 (heads, 4), slopes fp32, compacted tile lists), cached while the module's buffers are unchanged.

    Never traced: the tile classes take a ``nonzero`` (a host sync), and ``winpos.cache`` does not cache while
    ``torch.compile`` traces, so a traced copy would recompute them in every compiled forward (and fail inside a
    CUDA-graph capture); eagerly they are built once per grid and looked up afterwards."""
    fov, slopes = lh.fov, lh.slopes
    cls = lh.tile_classes(q_win, k_win, blocks[0], blocks[1]) if hasattr(lh, "tile_classes") else None
    sources = (fov, slopes) if cls is None else (fov, slopes, cls)
    return _derived(sources, (q_win, k_win, heads, blocks, device),
                    lambda: _lookhere_tensors(fov, slopes, cls, q_win, k_win, heads, blocks, device))


def _lookhere_tensors(fov, slopes, cls, q_win, k_win, heads, blocks, device):
    if fov.shape != (heads, 2, 2) or slopes.shape != (heads,):
        raise ValueError(f"LookHere was built for {fov.shape[0]} heads (fov {tuple(fov.shape)}, slopes "
                         f"{tuple(slopes.shape)}) but attention has {heads}; build it with num_heads={heads}")
    if fov.device != device:
        raise ValueError(f"LookHere buffers are on {fov.device} but q is on {device}; move the module with the model")
    n_qt, n_kt = -(-q_win[0] * q_win[1] // blocks[0]), -(-k_win[0] * k_win[1] // blocks[1])
    if cls is not None:
        if cls.shape != (heads, n_qt, n_kt):
            raise ValueError(f"LookHere tile classes have shape {tuple(cls.shape)}, expected {(heads, n_qt, n_kt)}")
    else:  # no exact classes available: visit every tile (correct, just no skipping)
        cls = torch.full((heads, n_qt, n_kt), 2, dtype=torch.int8, device=device)
    return (fov.to(torch.int32).reshape(heads, 4).contiguous(), slopes.float().contiguous(),
            lookhere_tile_lists(cls.to(device=device)))


def lookhere_tile_lists(cls: torch.Tensor) -> torch.Tensor:
    """Compacted tile lists of a ``(heads, n_qt, n_kt)`` class table (0 = empty), packed in one int32 tensor:
    ``[heads, n_qt, n_kt]`` visited key tiles of each query tile first (ascending), ``[heads, n_qt]`` their counts,
    ``[heads, n_kt, n_qt]`` visited query tiles of each key tile, ``[heads, n_kt]`` their counts. The kernels loop
    over the counts with uniform loops (a branch around the dots would turn the software pipeliner off). Cached
    with the other LookHere inputs (``_lookhere_inputs``)."""
    visited = cls != 0
    # stable sort of "empty" puts the visited tiles first, in ascending order
    by_q = torch.sort(~visited, dim=-1, stable=True).indices.to(torch.int32)
    by_k = torch.sort(~visited.transpose(1, 2), dim=-1, stable=True).indices.to(torch.int32)
    return torch.cat([by_q.flatten(), visited.sum(-1, dtype=torch.int32).flatten(), by_k.flatten(),
                      visited.sum(1, dtype=torch.int32).flatten()])


@functools.lru_cache(maxsize=256, typed=True)
def _geometry(q_shape, k_shape, window, valid_hw, pad_mode, blocks, pack, relpos):
    """Windows, padding, tiles and windows per program of a call, validated; memoized per call signature (a pure
    function of hashable arguments: shapes, window, padding, tiles)."""
    q_hw, k_hw = tuple(q_shape[1:3]), tuple(k_shape[1:3])
    n_wh, n_ww, q_win, k_win, pool = attention_groups(q_hw, k_hw, window)
    padding = _padding(pad_mode, valid_hw, k_hw, pool)
    D = q_shape[4]
    if blocks is None:
        blocks = default_blocks(D, q_win[0] * q_win[1], k_win[0] * k_win[1], relpos)
    blocks = tuple(blocks)
    if len(blocks) != 2 or any(b < 16 or b & (b - 1) for b in blocks):
        raise ValueError(f"blocks={blocks} must be two powers of two >= 16 (tl.dot needs tiles of at least 16)")
    q_tokens, k_tokens = q_win[0] * q_win[1], k_win[0] * k_win[1]
    if pack is None:
        pack = default_pack(D, blocks, q_tokens, k_tokens, n_wh * n_ww)
    elif not (isinstance(pack, int) and pack >= 1 and pack & (pack - 1) == 0):
        raise ValueError(f"pack={pack!r} must be a power of two >= 1 (windows per program)")
    # (whether the windows fit one block each is checked with the launch: attention_fwd_bwd.check_pack)
    return n_wh, n_ww, q_win, k_win, pool, padding, blocks, pack


def window_attention(q, k, v, *, window=None, pos=None, valid_hw=None, pad_mode="zeros", scale=None, blocks=None,
                     pack=None):
    """Fused window/global attention on the token grid (Triton), forward and backward.

    Args:
        q: ``(B, Hq, Wq, heads, D)`` queries (``Hq = Hk / s`` for pooled queries); any strides with the head dim
            contiguous (otherwise a contiguous copy is made).
        k, v: ``(B, Hk, Wk, heads, D)``; the grid must be padded to multiples of ``window``.
        window: key window size, or None/0 for global attention (query window ``window / s``).
        pos: ``PositionTerms``-like object with ``rope``, ``rel_pos``, ``lookhere`` (any may be None).
        valid_hw: unpadded key grid ``(H, W)`` for ``pad_mode="mask"``.
        pad_mode: ``"zeros"`` (padded tokens are ordinary keys) or ``"mask"`` (valid queries do not see padded keys;
            padded queries see every key).
        scale: logit scale, default ``D ** -0.5``.
        blocks: ``(block_m, block_n)`` tile sizes (powers of two >= 16), default ``default_blocks`` for D and the
            query / key window (tiles no larger than a window).
        pack: windows per program, a power of two; default ``default_pack`` (several windows side by side in one
            tile when each fits one block, e.g. four 4x4 windows in a 64 x 64 tile), 1 for one window per program.
    Returns:
        ``(B, Hq, Wq, heads, D)`` in q's dtype.

    D may be any size in 16..128; float16/bfloat16/float32 (no bfloat16 under the CPU interpreter). The first
    eager call of each launch signature checks the kernels against the reference (``winpos.kernels.self_check``).
    """
    return _fused(q, k, v, window, pos, valid_hw, pad_mode, scale, blocks, pack, True)


def _unchecked(q, k, v, *, window=None, pos=None, valid_hw=None, pad_mode="zeros", scale=None, blocks=None,
               pack=None):
    """``window_attention`` without the first-use self-check (the check's own kernel run)."""
    return _fused(q, k, v, window, pos, valid_hw, pad_mode, scale, blocks, pack, False)


def _fused(q, k, v, window, pos, valid_hw, pad_mode, scale, blocks, pack, check):
    _check_qkv(q, k, v)
    q_in, k_in = q, k
    rope = getattr(pos, "rope", None)
    rel_pos = getattr(pos, "rel_pos", None)
    lookhere = getattr(pos, "lookhere", None)
    heads, D = q.shape[3], q.shape[4]
    scale = D ** -0.5 if scale is None else float(scale)
    args = (q.shape, k.shape, window, valid_hw, pad_mode, blocks, pack, rel_pos is not None)
    try:
        geometry = _geometry(*args)
    except TypeError:  # unhashable arguments (lists): the same checks, without the memo
        geometry = _geometry.__wrapped__(*args)
    n_wh, n_ww, q_win, k_win, pool, (pad_mask, qvh, qvw, kvh, kvw), blocks, pack = geometry

    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    tabs = None
    if rope is not None:
        tabs, q, k = _rope_inputs(rope, q_win, k_win, q, k, heads, rotate_outside=rel_pos is not None)
    cos_q = sin_q = cos_k = sin_k = None
    rot_dims, half = 0, 0
    if tabs is not None:
        cos_q, sin_q, cos_k, sin_k, rot_dims, half = tabs
    rel = _rel_inputs(rel_pos, q, q_win, k_win).contiguous() if rel_pos is not None else None
    fov = slopes = cls = None
    if lookhere is not None:
        fov, slopes, cls = _lookhere_inputs(lookhere, q_win, k_win, heads, blocks, q.device)

    if check and self_check.enabled(q):
        sig = self_check.Signature(q.device.type, str(q.dtype).replace("torch.", ""), D, q_win, k_win, not window,
                                   pool, pack, bool(pad_mask), f"rot{rot_dims}/{'half' if half else 'interleaved'}"
                                   if rot_dims else "", rel is not None, fov is not None, blocks)
        verdict = self_check.RESULTS.get(sig)
        if verdict is None and self_check.should_check(q):
            verdict = self_check.run(sig, q, k, window, pos, valid_hw, pad_mode, scale, geometry, _unchecked)
        if verdict is not None and not verdict.ok:  # the caller's q and k (RoPE may have rotated ours)
            return self_check.reference()(q_in, k_in, v, window=window, pos=pos, valid_hw=valid_hw, pad_mode=pad_mode,
                                          scale=scale)
    plan = Plan(n_wh, n_ww, *q_win, *k_win, pool, qvh, qvw, kvh, kvw, pad_mask, rot_dims, int(half), *blocks, pack)
    return attention(q, k, v, rel, cos_q, sin_q, cos_k, sin_k, fov, slopes, cls, list(plan), scale)  # all ints
