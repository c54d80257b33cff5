"""Standalone RoPE on the token grid: a Triton kernel (forward = rotate by theta, backward = by -theta) and the
differentiable PyTorch version used when the tables themselves need gradients (learnable mixed RoPE).

Both read x in the ``(B, H, W, heads, D)`` grid layout and index the cos/sin tables by each token's row-major
index inside its ``window_hw`` window (the whole grid for global attention), so no partition copy is made. The
tables follow ``winpos.posemb.rope.RopeTables``: fp32 ``(N, R/2)`` shared or ``(heads, N, R/2)`` per head, N the
tokens of one window; pairing ``"half"`` (j, j + R/2) or ``"interleaved"`` (2j, 2j + 1); dims >= R pass through.

The Triton op (``winpos::rope_grid``) gives gradients for x only. ``rope_grid`` picks the PyTorch path when a
table requires grad, so learnable frequencies get exact gradients through autograd (cos/sin -> angles -> freqs).
"""
from typing import Optional

import torch
from torch import Tensor

from . import _jit

PAIRINGS = ("half", "interleaved")


def _window(x: Tensor, window_hw) -> tuple[int, int]:
    H, W = x.shape[1:3]
    wh, ww = (H, W) if window_hw is None else (int(window_hw[0]), int(window_hw[1]))
    if wh <= 0 or ww <= 0 or H % wh or W % ww:
        raise ValueError(f"window {wh}x{ww} does not tile the {H}x{W} grid; pad the grid or pass the window size "
                         "the tables were built for")
    return wh, ww


def check_rope_inputs(x: Tensor, cos: Tensor, sin: Tensor, rot_dims: int, pairing: str, window_hw) -> tuple[int, int]:
    """Validate a grid tensor against its RoPE tables; returns the window ``(wh, ww)``."""
    if pairing not in PAIRINGS:
        raise ValueError(f"unknown pairing={pairing!r}; choose 'half' or 'interleaved'")
    if x.dim() != 5:
        raise ValueError(f"RoPE on the grid expects x of shape (B, H, W, heads, head_dim), got {tuple(x.shape)}")
    heads, head_dim = x.shape[3:]
    if not isinstance(rot_dims, int) or rot_dims <= 0 or rot_dims % 2 or rot_dims > head_dim:
        raise ValueError(f"rot_dims={rot_dims!r} must be a positive even int <= head_dim={head_dim}")
    wh, ww = _window(x, window_hw)
    want = (wh * ww, rot_dims // 2)
    ok_shape = cos.shape == sin.shape and (
        tuple(cos.shape) == want or (cos.dim() == 3 and cos.shape[0] in (1, heads) and tuple(cos.shape[1:]) == want))
    if not ok_shape:
        raise ValueError(f"RoPE tables {tuple(cos.shape)}/{tuple(sin.shape)} do not fit a {wh}x{ww} window with "
                         f"rot_dims={rot_dims} and {heads} heads: expected {want} or ({heads}, *{want}); build them "
                         "with RoPE.tables(window, window)")
    if cos.device != x.device or sin.device != x.device:
        raise ValueError(f"RoPE tables are on {cos.device} but x is on {x.device}; move the RoPE module with the model")
    return wh, ww


def rope_grid_reference(x: Tensor, cos: Tensor, sin: Tensor, rot_dims: int, pairing: str,
                        window_hw=None) -> Tensor:
    """Differentiable PyTorch RoPE on the grid; same arithmetic as ``winpos.posemb.rope.apply_rope`` (rotation in
    at least fp32, one rounding to x's dtype). Returns ``(B, H, W, heads, D)``."""
    wh, ww = check_rope_inputs(x, cos, sin, rot_dims, pairing, window_hw)
    B, H, W, heads, D = x.shape
    compute = torch.promote_types(torch.promote_types(x.dtype, cos.dtype), torch.float32)
    half = rot_dims // 2

    def on_grid(t: Tensor) -> Tensor:  # table -> broadcastable (1, 1, wh, 1, ww, heads|1, R/2)
        t = t.to(compute)
        t = t.reshape(wh, ww, 1, half) if t.dim() == 2 else t.reshape(t.shape[0], wh, ww, half).permute(1, 2, 0, 3)
        return t[None, None, :, None]

    c, s = on_grid(cos), on_grid(sin)
    xr = x[..., :rot_dims].reshape(B, H // wh, wh, W // ww, ww, heads, rot_dims).to(compute)
    a, b = (xr[..., 0::2], xr[..., 1::2]) if pairing == "interleaved" else (xr[..., :half], xr[..., half:])
    ra, rb = a * c - b * s, b * c + a * s
    rot = torch.stack([ra, rb], dim=-1).flatten(-2) if pairing == "interleaved" else torch.cat([ra, rb], dim=-1)
    rot = rot.reshape(B, H, W, heads, rot_dims).to(x.dtype)
    return rot if rot_dims == D else torch.cat([rot, x[..., rot_dims:]], dim=-1)


def _launch(x: Tensor, cos: Tensor, sin: Tensor, rot_dims: int, half: bool, window_h: int, window_w: int,
            conjugate: bool) -> Tensor:
    _jit.check_launchable(x)
    kern = _jit.load("tl_rope")
    if x.stride(-1) != 1:
        x = x.contiguous()
    B, H, W, heads, D = x.shape
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    cos = cos.float().contiguous()
    sin = sin.float().contiguous()
    c_n = cos.stride(0) if cos.dim() == 3 and cos.shape[0] > 1 else 0
    c_t = cos.stride(-2)
    block_t = 32
    n_tokens = B * H * W
    grid = (-(-n_tokens // block_t), heads)
    sx, sy = x.stride(), y.stride()
    _jit.launch(
        kern.rope_grid_kernel, grid, X=x, Y=y, COS=cos, SIN=sin, sx_b=sx[0], sx_h=sx[1], sx_w=sx[2], sx_n=sx[3],
        sy_b=sy[0], sy_h=sy[1], sy_w=sy[2], sy_n=sy[3], c_n=c_n, c_t=c_t, n_tokens=n_tokens, H=H, W=W,
        WH=window_h, WW=window_w, HEAD_DIM=D, BLOCK_D=max(16, 1 << (D - 1).bit_length()), BLOCK_T=block_t,
        ROT=rot_dims, HALF=half, CONJUGATE=conjugate, num_warps=4)
    return y


@torch.library.custom_op("winpos::rope_grid", mutates_args=())
def rope_grid_op(x: Tensor, cos: Tensor, sin: Tensor, rot_dims: int, half: bool, window_h: int, window_w: int,
                 conjugate: bool) -> Tensor:
    """Triton RoPE on the grid; ``conjugate=True`` rotates by -theta (the transpose, i.e. the backward)."""
    return _launch(x, cos, sin, rot_dims, half, window_h, window_w, conjugate)


@rope_grid_op.register_fake
def _(x, cos, sin, rot_dims, half, window_h, window_w, conjugate):
    return x.new_empty(x.shape)


def _setup_rope_op(ctx, inputs, output):
    x, cos, sin, rot_dims, half, window_h, window_w, conjugate = inputs
    ctx.save_for_backward(cos, sin)
    ctx.args = (rot_dims, half, window_h, window_w, conjugate)


def _backward_rope_op(ctx, dy):
    cos, sin = ctx.saved_tensors
    rot_dims, half, window_h, window_w, conjugate = ctx.args
    dx = torch.ops.winpos.rope_grid(dy, cos, sin, rot_dims, half, window_h, window_w, not conjugate)
    return dx, None, None, None, None, None, None, None


# Differentiable in x (the transpose of a rotation is the opposite rotation); the tables get no gradient.
rope_grid_op.register_autograd(_backward_rope_op, setup_context=_setup_rope_op)


class RopeGridFunction(torch.autograd.Function):
    """``apply(x, cos, sin, rot_dims, half, window_h, window_w)``; gradient for x only (tables are constants)."""

    @staticmethod
    def forward(ctx, x, cos, sin, rot_dims, half, window_h, window_w):
        ctx.save_for_backward(cos, sin)
        ctx.args = (rot_dims, half, window_h, window_w)
        with torch.no_grad():
            return torch.ops.winpos.rope_grid(x, cos, sin, rot_dims, half, window_h, window_w, False)

    @staticmethod
    def backward(ctx, dy):
        cos, sin = ctx.saved_tensors
        dx = torch.ops.winpos.rope_grid(dy, cos, sin, *ctx.args, True)
        return dx, None, None, None, None, None, None


def rope_grid(x: Tensor, cos: Tensor, sin: Tensor, rot_dims: int, pairing: str, window_hw=None,
              backend: Optional[str] = None) -> Tensor:
    """Rotate the first ``rot_dims`` dims of grid tokens ``x (B, H, W, heads, D)`` by window-local RoPE angles.

    Args:
        cos, sin: ``(N, R/2)`` or ``(heads, N, R/2)`` tables with ``N = window_hw[0] * window_hw[1]``.
        window_hw: the window the tables were built for; None = the whole grid (global attention).
        backend: ``"triton"``, ``"torch"`` or None (Triton unless a table requires grad, which needs the
            differentiable PyTorch path).
    Returns:
        ``(B, H, W, heads, D)`` in x's dtype.
    """
    wh, ww = check_rope_inputs(x, cos, sin, rot_dims, pairing, window_hw)
    learnable = torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad)
    backend = backend or ("torch" if learnable else "triton")
    if backend == "torch":
        return rope_grid_reference(x, cos, sin, rot_dims, pairing, (wh, ww))
    if backend != "triton":
        raise ValueError(f"unknown backend={backend!r}; choose 'triton', 'torch' or None")
    if learnable:
        raise ValueError("the Triton RoPE kernel gives no gradient for the tables; use backend='torch' (or None) "
                         "for learnable frequencies")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"the Triton RoPE kernel supports float16, bfloat16 and float32, got {x.dtype}")
    return RopeGridFunction.apply(x, cos.detach(), sin.detach(), rot_dims, pairing == "half", wh, ww)
