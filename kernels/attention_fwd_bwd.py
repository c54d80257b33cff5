"""Host side of fused window attention: launch plans, ``torch.library`` custom ops and the autograd Function.

Ops (namespace ``winpos``; each has a fake/meta implementation so ``torch.compile`` can trace through them):

* ``winpos::window_attention_fwd(q, k, v, cos_q, sin_q, cos_k, sin_k, rel, fov, slopes, tile_cls, geom, scale)
  -> (out, lse)``
* ``winpos::window_attention_bwd(do, q, k, v, out, lse, cos_q, ..., tile_cls, geom, scale)
  -> (dq, dk, dv, drel)``

``geom`` is :class:`Plan` as a list of ints. ``WindowAttentionFunction`` is the one differentiable entry: it
launches the kernels directly in eager mode and calls the ops under tracing, which therefore have no autograd of
their own. The user entry point with validation and position-term preparation is
``winpos.kernels.window_attention``.
"""
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from . import _jit
from .launch_config import STATIC, launch_options, pow2, remember

LOG2E = 1.4426950408889634


class Plan(NamedTuple):
    """Geometry and switches of one attention call (all ints, so it travels through custom ops as a list).

    Windows: ``n_wh x n_ww`` per image; query window ``qwh x qww``, key window ``kwh x kww`` (global attention:
    one window = the grid); ``pool``: query pooling stride. Padding mask (``pad_mask=1``): queries inside
    ``qvh x qvw`` and keys inside ``kvh x kvw`` (grid tokens) are valid. RoPE: ``rot_dims`` (0 = off), ``half``
    pairing flag. Tiles: ``block_m`` queries x ``block_n`` keys of one window (LookHere tile classes are per these
    blocks); ``pack`` windows per program (1, or with windows that fit one block each, several side by side: the
    kernels then run ``pack * block_m`` x ``pack * block_n`` tiles with a block-diagonal mask).
    A named tuple: built and unpacked on every call, it costs a fraction of a dataclass.
    """

    n_wh: int
    n_ww: int
    qwh: int
    qww: int
    kwh: int
    kww: int
    pool: int
    qvh: int
    qvw: int
    kvh: int
    kvw: int
    pad_mask: int
    rot_dims: int
    half: int
    block_m: int
    block_n: int
    pack: int = 1

    def as_list(self) -> list[int]:
        return [int(x) for x in self]

    @property
    def n_qt(self) -> int:
        return -(-self.qwh * self.qww // self.block_m)

    @property
    def n_kt(self) -> int:
        return -(-self.kwh * self.kww // self.block_n)

    @property
    def n_programs(self) -> int:
        """Programs per image along grid axis 0: one per window, or one per ``pack`` windows."""
        return -(-self.n_wh * self.n_ww // self.pack)


def _table_strides(t: Optional[Tensor]) -> tuple[int, int]:
    """(head stride, row stride) of a ``(N, R/2)`` or ``(heads|1, N, R/2)`` table; 0 head stride when shared."""
    if t is None:
        return 0, 0
    if t.dim() == 2:
        return 0, t.stride(0)
    return (t.stride(0) if t.shape[0] > 1 else 0), t.stride(1)


def check_window_offsets(name: str, t: Tensor, window: tuple) -> None:
    """The kernels address tokens inside a window with int32 offsets from the window's corner (the corner itself
    is int64): refuse tensors whose window spans 2**31 elements or more."""
    st, sh = t.stride(), t.shape
    span = (window[0] - 1) * st[1] + (window[1] - 1) * st[2] + st[3] * (sh[3] - 1) + sh[4]
    if span >= 2**31:
        raise ValueError(f"{name} {tuple(t.shape)} with strides {t.stride()} spans {span} elements inside one "
                         f"{window[0]}x{window[1]} window, beyond the kernels' int32 in-window offsets; use "
                         "windows, a smaller global grid, or backend='reference'")


def check_pack(plan: Plan, *tensors: Tensor) -> None:
    """Several windows per program need every window in one block (one query and one key tile each) and, since
    packed rows are addressed from the image's corner with int32 offsets, an image spanning less than 2**31
    elements."""
    if plan.n_qt != 1 or plan.n_kt != 1:
        raise ValueError(f"pack={plan.pack} needs each {plan.qwh}x{plan.qww} query window and {plan.kwh}x{plan.kww} "
                         f"key window inside one {plan.block_m} x {plan.block_n} block; use pack=1 or larger blocks")
    for name, t in zip("qkv", tensors):
        check_window_offsets(f"{name} (one image, pack={plan.pack})", t, tuple(t.shape[1:3]))


def stride_unit(*tensors: Tensor) -> int:
    """16 bytes in elements when every stride of the first four dims of every tensor is a multiple of it (and
    fits int32), else 1. The kernels take strides divided by this unit and multiply by it as a constexpr, which
    tells the compiler that rows start on 16-byte boundaries: 16-byte vector accesses and cp.async for any head
    dim that is a multiple of 8 (Triton's own hint needs strides divisible by 16 elements: 56 or 72 get none)."""
    unit = 16 // tensors[0].element_size()
    for t in tensors:
        st = t.stride()
        if st[0] % unit or st[1] % unit or st[2] % unit or st[3] % unit or max(st) >= 2**31:
            return 1
    return unit


def _grid_strides(prefix: str, t: Tensor, unit: int) -> dict:
    s = t.stride()
    return {f"{prefix}_b": s[0] // unit, f"{prefix}_h": s[1] // unit, f"{prefix}_w": s[2] // unit,
            f"{prefix}_n": s[3] // unit}


def _check_rel(rel: Tensor, plan: Plan, columns: int) -> None:
    """The packed relpos terms as the kernels read them: contiguous rows of ``columns``, within the int32 offsets
    of one window (its gradient ``drel`` has the same layout), and 4-byte aligned when 16-bit (``rel_h`` columns
    are read as 4-byte words: a misaligned word faults on a GPU, never under the interpreter)."""
    if not rel.is_contiguous() or rel.shape[-1] != columns:
        raise ValueError(f"the packed relpos terms must be contiguous with {columns} columns ([rel_h | rel_w] "
                         f"zero-padded to powers of two), got {tuple(rel.shape)} with strides {rel.stride()}")
    extent = tuple(rel.shape[1:3]) if plan.pack > 1 else (plan.qwh, plan.qww)
    check_window_offsets("the packed relpos terms (and their gradient)", rel, extent)
    if rel.element_size() == 2 and rel.data_ptr() % 4:
        raise ValueError(f"the packed 16-bit relpos terms start at byte address {rel.data_ptr()}, not a multiple of "
                         "4 (the kernels read them as 4-byte words); pass a fresh tensor (rel.clone()), not a view "
                         "at an odd element offset")


def _check_tables(cos: Optional[Tensor], sin: Optional[Tensor], name: str) -> None:
    """The kernels read a sin table with its cos table's strides: both must have one shape and one layout."""
    if cos is None:
        return
    if sin is None or sin.shape != cos.shape or _table_strides(sin) != _table_strides(cos):
        got = None if sin is None else (tuple(sin.shape), sin.stride())
        raise ValueError(f"RoPE sin_{name} {got} must have cos_{name}'s shape and strides {tuple(cos.shape)} "
                         f"{cos.stride()} (the kernels read both with one set of strides); make both contiguous")


def _kernel_args(q, k, v, lse, cos_q, sin_q, cos_k, sin_k, rel, fov, slopes, tile_cls, plan: Plan, scale: float,
                 unit: int = 1):
    """Keyword arguments shared by the three attention kernels; q/k/v strides in units of ``unit`` elements."""
    for name, t, win in (("q", q, (plan.qwh, plan.qww)), ("k", k, (plan.kwh, plan.kww)),
                         ("v", v, (plan.kwh, plan.kww))):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous head dim (stride 1), got strides {t.stride()}; "
                             "window_attention makes that copy for you")
        check_window_offsets(name, t, win)
    if plan.pack > 1:
        check_pack(plan, q, k, v)
    # Without relpos the extents are irrelevant: one value keeps one compiled variant for every window size.
    kh_p, kw_p = (pow2(plan.kwh), pow2(plan.kww)) if rel is not None else (16, 16)
    if rel is not None:
        _check_rel(rel, plan, kh_p + kw_p)
    _check_tables(cos_q, sin_q, "q")
    _check_tables(cos_k, sin_k, "k")
    dummy = lse  # never dereferenced: the matching constexpr flag is off
    head_dim = q.shape[-1]
    fp32 = q.dtype == torch.float32
    cq_n, cq_t = _table_strides(cos_q)
    ck_n, ck_t = _table_strides(cos_k)
    rel_strides = rel.stride()[:4] if rel is not None else (0, 0, 0, 0)
    args = dict(
        Q=q, K=k, V=v, LSE=lse, **_grid_strides("sq", q, unit), **_grid_strides("sk", k, unit),
        **_grid_strides("sv", v, unit),
        sl_b=lse.stride(0), sl_h=lse.stride(1), sl_w=lse.stride(2),
        COSQ=cos_q if cos_q is not None else dummy, SINQ=sin_q if sin_q is not None else dummy,
        COSK=cos_k if cos_k is not None else dummy, SINK=sin_k if sin_k is not None else dummy,
        cq_n=cq_n, cq_t=cq_t, ck_n=ck_n, ck_t=ck_t,
        REL=rel if rel is not None else dummy,
        sr_b=rel_strides[0], sr_h=rel_strides[1], sr_w=rel_strides[2], sr_n=rel_strides[3],
        FOV=fov if fov is not None else dummy, SLOPE=slopes if slopes is not None else dummy,
        CLS=tile_cls if tile_cls is not None else dummy, n_qt=plan.n_qt, n_kt=plan.n_kt,
        n_win=plan.n_wh * plan.n_ww, n_ww=plan.n_ww, QWH=plan.qwh, QWW=plan.qww, KWH=plan.kwh, KWW=plan.kww,
        POOL=plan.pool, QVH=plan.qvh, QVW=plan.qvw, KVH=plan.kvh, KVW=plan.kvw,
        qk_scale=float(scale) * LOG2E,
        HEAD_DIM=head_dim, BLOCK_D=pow2(head_dim), BLOCK_M=plan.block_m * plan.pack,
        BLOCK_N=plan.block_n * plan.pack, PACK=plan.pack,
        ROT=plan.rot_dims, HALF=bool(plan.half), HAS_ROPE=cos_q is not None, HAS_REL=rel is not None,
        KH_P=kh_p, KW_P=kw_p, HAS_LH=fov is not None, PAD_MASK=bool(plan.pad_mask),
        KV_SAME=k.stride()[:4] == v.stride()[:4],  # v rows reuse k's offsets (qkv views, or both contiguous)
        # fp32 inputs: exact fp32 dots (the GPU default would be tf32, ~1e-3 relative error).
        PRECISION="ieee" if fp32 else "tf32", SV=unit,
        # Key tiles that are exactly one grid row of the key window (64-key tiles of a 64-wide global grid): the
        # relpos bias is read row by row and its gradient summed, no one-hot dots (tl_relpos).
        REL_ROWS=rel is not None and plan.kww == plan.block_n and plan.pack == 1,
    )
    return args


def _layout(t: Optional[Tensor]):
    return None if t is None else (t.shape, t.stride())


def _tensor_args(q, k, v, lse, cos_q, sin_q, cos_k, sin_k, rel, fov, slopes, tile_cls) -> dict:
    """The tensor arguments shared by the three kernels (absent ones point at ``lse``: never dereferenced, the
    matching constexpr flag is off)."""
    return dict(Q=q, K=k, V=v, LSE=lse, COSQ=lse if cos_q is None else cos_q, SINQ=lse if sin_q is None else sin_q,
                COSK=lse if cos_k is None else cos_k, SINK=lse if sin_k is None else sin_k,
                REL=lse if rel is None else rel, FOV=lse if fov is None else fov,
                SLOPE=lse if slopes is None else slopes, CLS=lse if tile_cls is None else tile_cls)


def _static(args: dict) -> dict:
    return {name: value for name, value in args.items() if not isinstance(value, Tensor)}


def _signature(q, k, v, cos_q, cos_k, rel, fov, tile_cls, geom, scale) -> tuple:
    """Everything the launches' non-tensor arguments depend on (the ``launch_config.STATIC`` key of a forward; a
    backward adds its gradient's layout)."""
    return (*geom, scale, q.dtype, q.shape, q.stride(), k.shape, k.stride(), v.stride(), _layout(cos_q),
            _layout(cos_k), _layout(rel), fov is None, _layout(tile_cls))


def _launch_fwd(q, k, v, cos_q, sin_q, cos_k, sin_k, rel, fov, slopes, tile_cls, geom, scale):
    return _launch_fwd_signed(q, k, v, cos_q, sin_q, cos_k, sin_k, rel, fov, slopes, tile_cls, geom, scale)[:2]


def _launch_fwd_signed(q, k, v, cos_q, sin_q, cos_k, sin_k, rel, fov, slopes, tile_cls, geom, scale):
    """The forward launch; returns ``(out, lse, signature)``, the signature for the backward's cache key."""
    _jit.check_launchable(q, k, v)
    kern = _jit.load("tl_attention")
    B, Hq, Wq, heads, _ = q.shape
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((B, Hq, Wq, heads), dtype=torch.float32, device=q.device)
    sig = _signature(q, k, v, cos_q, cos_k, rel, fov, tile_cls, geom, scale)
    key = ("fwd", sig)
    hit = STATIC.get(key)
    if hit is None:
        plan = Plan._make(geom)
        unit = stride_unit(q, k, v, out)
        args = _kernel_args(q, k, v, lse, cos_q, sin_q, cos_k, sin_k, rel, fov, slopes, tile_cls, plan, scale, unit)
        static = dict(_static(args), **_grid_strides("so", out, unit), **launch_options(args, backward=False))
        hit = remember(key, ((B * plan.n_programs, plan.n_qt, heads), static))
    grid, static = hit
    with _jit.on_device(q):  # Triton launches on the current device, not q's
        _jit.launch(kern.attn_fwd, grid, O=out, **_tensor_args(q, k, v, lse, cos_q, sin_q, cos_k, sin_k, rel, fov,
                                                               slopes, tile_cls), **static)
    _jit.fault("fwd", out)
    return out, lse, sig


def _launch_bwd(do, q, k, v, out, lse, cos_q, sin_q, cos_k, sin_k, rel, fov, slopes, tile_cls, geom, scale, sig=None):
    """The backward launches; ``sig``: the forward's signature when it is known (the eager autograd path), which
    spares rebuilding it (q, k, v, out and lse are the forward's own tensors)."""
    _jit.check_launchable(do, q, k, v)
    kern = _jit.load("tl_attention")
    if do.stride(-1) != 1:
        do = do.contiguous()
    if out.stride(-1) != 1:
        out = out.contiguous()
    delta = torch.empty_like(lse)  # rowsum(out * do) in fp32, written by the dQ kernel for the dK/dV kernel
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    drel = torch.empty_like(rel, memory_format=torch.contiguous_format) if rel is not None else q.new_empty(0)
    if sig is None:
        sig = _signature(q, k, v, cos_q, cos_k, rel, fov, tile_cls, geom, scale)
    key = ("bwd", sig, do.shape, do.stride(), out.stride(), lse.stride())
    hit = STATIC.get(key)
    if hit is None:
        plan = Plan._make(geom)
        check_window_offsets("grad_output", do, (plan.qwh, plan.qww))
        unit = stride_unit(q, k, v, out, do, dq, dk)  # dv has dk's strides
        args = _kernel_args(q, k, v, lse, cos_q, sin_q, cos_k, sin_k, rel, fov, slopes, tile_cls, plan, scale, unit)
        common = dict(_static(args), **_grid_strides("sdo", do, unit), scale=float(scale),
                      **launch_options(args, True))
        groups = q.shape[0] * plan.n_programs
        static_dq = dict(common, **_grid_strides("so", out, unit), **_grid_strides("sdq", dq, unit),
                         REL_PRECISION="ieee" if q.dtype == torch.float32 else "tf32")
        static_kv = dict(common, **_grid_strides("sdk", dk, unit))
        heads = q.shape[3]
        hit = remember(key, ((groups, plan.n_qt, heads), static_dq, (groups, plan.n_kt, heads), static_kv))
    grid_dq, static_dq, grid_kv, static_kv = hit
    tensors = _tensor_args(q, k, v, lse, cos_q, sin_q, cos_k, sin_k, rel, fov, slopes, tile_cls)
    with _jit.on_device(q):
        _jit.launch(kern.attn_bwd_dq, grid_dq, O=out, DO=do, DELTA=delta, DQ=dq, DREL=lse if rel is None else drel,
                    **tensors, **static_dq)
        _jit.launch(kern.attn_bwd_dkdv, grid_kv, DO=do, DELTA=delta, DK=dk, DV=dv, **tensors, **static_kv)
    _jit.fault("dq", dq)
    _jit.fault("dkdv", dk)
    return dq, dk, dv, drel


@torch.library.custom_op("winpos::window_attention_fwd", mutates_args=())
def window_attention_fwd(
    q: Tensor, k: Tensor, v: Tensor, cos_q: Optional[Tensor], sin_q: Optional[Tensor], cos_k: Optional[Tensor],
    sin_k: Optional[Tensor], rel: Optional[Tensor], fov: Optional[Tensor], slopes: Optional[Tensor],
    tile_cls: Optional[Tensor], geom: list[int], scale: float,
) -> tuple[Tensor, Tensor]:
    """Forward kernel: ``out (B, Hq, Wq, heads, D)`` in q's dtype and base-2 ``lse (B, Hq, Wq, heads)`` fp32."""
    return _launch_fwd(q, k, v, cos_q, sin_q, cos_k, sin_k, rel, fov, slopes, tile_cls, geom, scale)


@window_attention_fwd.register_fake
def _(q, k, v, cos_q, sin_q, cos_k, sin_k, rel, fov, slopes, tile_cls, geom, scale):
    return q.new_empty(q.shape), q.new_empty(q.shape[:4], dtype=torch.float32)


@torch.library.custom_op("winpos::window_attention_bwd", mutates_args=())
def window_attention_bwd(
    do: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, cos_q: Optional[Tensor],
    sin_q: Optional[Tensor], cos_k: Optional[Tensor], sin_k: Optional[Tensor], rel: Optional[Tensor],
    fov: Optional[Tensor], slopes: Optional[Tensor], tile_cls: Optional[Tensor], geom: list[int], scale: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Backward kernels: ``dq, dk, dv`` (unrotated when RoPE is fused) and ``drel`` (empty without relpos)."""
    return _launch_bwd(do, q, k, v, out, lse, cos_q, sin_q, cos_k, sin_k, rel, fov, slopes, tile_cls, geom, scale)


@window_attention_bwd.register_fake
def _(do, q, k, v, out, lse, cos_q, sin_q, cos_k, sin_k, rel, fov, slopes, tile_cls, geom, scale):
    drel = rel.new_empty(rel.shape) if rel is not None else q.new_empty(0)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), drel


def _attention_backward(saved, geom, scale, do, rel_needs_grad, sig=None):
    q, k, v, out, lse, rel, cos_q, sin_q, cos_k, sin_k, fov, slopes, tile_cls = saved
    if _jit.eager(do):
        dq, dk, dv, drel = _launch_bwd(do, q, k, v, out, lse, cos_q, sin_q, cos_k, sin_k, rel, fov, slopes, tile_cls,
                                       geom, scale, sig)
    else:
        dq, dk, dv, drel = torch.ops.winpos.window_attention_bwd(do, q, k, v, out, lse, cos_q, sin_q, cos_k, sin_k,
                                                                 rel, fov, slopes, tile_cls, geom, scale)
    return dq, dk, dv, (drel if rel is not None and rel_needs_grad else None)


class WindowAttentionFunction(torch.autograd.Function):
    """Differentiable fused window attention over prepared inputs (the eager entry used by ``window_attention``).

    ``apply(q, k, v, rel, cos_q, sin_q, cos_k, sin_k, fov, slopes, tile_cls, geom, scale) -> out``: gradients
    flow to q, k, v and to the packed relpos terms ``rel``; the RoPE tables, LookHere buffers and tile classes are
    constants here (learnable RoPE is rotated outside, see ``winpos.kernels.window_attention``).
    """

    @staticmethod
    def forward(ctx, q, k, v, rel, cos_q, sin_q, cos_k, sin_k, fov, slopes, tile_cls, geom, scale):
        # (autograd.Function.forward runs without grad.) Eager: a direct launch (see _jit.eager).
        sig = None
        if _jit.eager(q):
            out, lse, sig = _launch_fwd_signed(q, k, v, cos_q, sin_q, cos_k, sin_k, rel, fov, slopes, tile_cls, geom,
                                               scale)
        else:
            out, lse = torch.ops.winpos.window_attention_fwd(q, k, v, cos_q, sin_q, cos_k, sin_k, rel, fov, slopes,
                                                             tile_cls, geom, scale)
        ctx.save_for_backward(q, k, v, out, lse, rel, cos_q, sin_q, cos_k, sin_k, fov, slopes, tile_cls)
        ctx.geom, ctx.scale, ctx.sig = geom, scale, sig
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable  # the backward kernels have no derivative of their own
    def backward(ctx, do):
        dq, dk, dv, drel = _attention_backward(ctx.saved_tensors, ctx.geom, ctx.scale, do, ctx.needs_input_grad[3],
                                               ctx.sig)
        return dq, dk, dv, drel, *([None] * 9)


def attention(q, k, v, rel, cos_q, sin_q, cos_k, sin_k, fov, slopes, tile_cls, geom, scale):
    """``WindowAttentionFunction.apply`` with the same arguments, except that an eager call nothing will
    differentiate (grad mode off, or no input requiring grad) launches the forward directly: no autograd node,
    nothing saved (the Function's own overhead is a quarter of the host time of such a call)."""
    if _jit.eager(q) and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad
                                                           or (rel is not None and rel.requires_grad))):
        return _launch_fwd_signed(q, k, v, cos_q, sin_q, cos_k, sin_k, rel, fov, slopes, tile_cls, geom, scale)[0]
    return WindowAttentionFunction.apply(q, k, v, rel, cos_q, sin_q, cos_k, sin_k, fov, slopes, tile_cls, geom, scale)


def attention_flops(plan: Plan, batch: int, heads: int, head_dim: int, backward: bool = False) -> float:
    """Matmul FLOPs by the FlashAttention convention: ``2 * Nq * Nk * D`` per matmul, 2 matmuls forward and 5
    more backward (fwd+bwd = 7), every key of the window counted (skipped LookHere tiles are not subtracted)."""
    per = 2.0 * plan.qwh * plan.qww * plan.kwh * plan.kww * head_dim
    groups = batch * plan.n_wh * plan.n_ww * heads
    return groups * per * (7 if backward else 2)


__all__ = ["Plan", "WindowAttentionFunction", "attention", "attention_flops", "window_attention_bwd",
           "window_attention_fwd"]
