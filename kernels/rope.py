"""Standalone RoPE on the token grid: a Triton kernel (forward = rotate by theta, backward = by -theta) and the
differentiable PyTorch version used when the tables themselves need gradients (learnable mixed RoPE).

Both read x in the ``(B, H, W, heads, D)`` grid layout and index the cos/sin tables by each token's row-major
index inside its ``window_hw`` window (the whole grid for global attention), so no partition copy is made. The
tables follow ``winpos.posemb.rope.RopeTables``: fp32 ``(N, R/2)`` shared or ``(heads, N, R/2)`` per head, N the
tokens of one window; pairing ``"half"`` (j, j + R/2) or ``"interleaved"`` (2j, 2j + 1); dims >= R pass through.

One differentiable entry, ``RopeGridFunction`` (gradient for x only: the transpose of a rotation is the opposite
rotation); in eager mode it launches the kernel directly, under tracing (torch.compile) through the custom op
``winpos::rope_grid``, which has a fake implementation and no autograd of its own. ``rope_grid`` picks the PyTorch
path of ``winpos.posemb.rope`` when a table requires grad, so learnable frequencies get exact gradients through
autograd (cos/sin -> angles -> freqs).
"""
from typing import Optional

import torch
from torch import Tensor

from winpos.posemb.rope import rotate_grid, spread_table

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


def rotate_on_grid(x: Tensor, cos: Tensor, sin: Tensor, rot_dims: int, pairing: str, window_hw) -> Tensor:
    """Differentiable PyTorch RoPE on the grid with per-window tables: ``winpos.posemb.rope``'s ``rotate_grid``
    (rotation in at least fp32, one rounding to x's dtype), the tables spread over the grid by ``spread_table``.
    Returns ``(B, H, W, heads, D)``; gradients reach x and the tables."""
    grid_hw = tuple(x.shape[1:3])
    return rotate_grid(x, spread_table(cos, window_hw, grid_hw), spread_table(sin, window_hw, grid_hw), rot_dims,
                       pairing)


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
    with _jit.on_device(x):  # Triton launches on the current device, not x's
        _jit.launch(
            kern.rope_grid_kernel, grid, X=x, Y=y, COS=cos, SIN=sin, sx_b=sx[0], sx_h=sx[1], sx_w=sx[2], sx_n=sx[3],
            sy_b=sy[0], sy_h=sy[1], sy_w=sy[2], sy_n=sy[3], c_n=c_n, c_t=c_t, n_tokens=n_tokens, H=H, W=W,
            WH=window_h, WW=window_w, HEAD_DIM=D, BLOCK_D=max(16, 1 << (D - 1).bit_length()), BLOCK_T=block_t,
            ROT=rot_dims, HALF=half, CONJUGATE=conjugate, num_warps=4)
    _jit.fault("rope", y)
    return y


@torch.library.custom_op("winpos::rope_grid", mutates_args=())
def rope_grid_op(x: Tensor, cos: Tensor, sin: Tensor, rot_dims: int, half: bool, window_h: int, window_w: int,
                 conjugate: bool) -> Tensor:
    """Triton RoPE on the grid; ``conjugate=True`` rotates by -theta (the transpose, i.e. the backward)."""
    return _launch(x, cos, sin, rot_dims, half, window_h, window_w, conjugate)


@rope_grid_op.register_fake
def _(x, cos, sin, rot_dims, half, window_h, window_w, conjugate):
    return x.new_empty(x.shape)


def _rope_op(t: Tensor):
    """The direct launch for plain tensors in eager mode, the custom op under tracing (see ``_jit.eager``)."""
    return _launch if _jit.eager(t) else torch.ops.winpos.rope_grid


class RopeGridFunction(torch.autograd.Function):
    """``apply(x, cos, sin, rot_dims, half, window_h, window_w)``; gradient for x only (tables are constants)."""

    @staticmethod
    def forward(ctx, x, cos, sin, rot_dims, half, window_h, window_w):
        ctx.save_for_backward(cos, sin)
        ctx.args = (rot_dims, half, window_h, window_w)
        return _rope_op(x)(x, cos, sin, rot_dims, half, window_h, window_w, False)

    @staticmethod
    @torch.autograd.function.once_differentiable  # the kernel has no derivative of its own
    def backward(ctx, dy):
        cos, sin = ctx.saved_tensors
        dx = _rope_op(dy)(dy, cos, sin, *ctx.args, True)
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
        return rotate_on_grid(x, cos, sin, rot_dims, pairing, (wh, ww))
    if backend != "triton":
        raise ValueError(f"unknown backend={backend!r}; choose 'triton', 'torch' or None")
    if learnable:
        raise ValueError("the Triton RoPE kernel gives no gradient for the tables; use backend='torch' (or None) "
                         "for learnable frequencies")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"the Triton RoPE kernel supports float16, bfloat16 and float32, got {x.dtype}")
    return RopeGridFunction.apply(x, cos.detach(), sin.detach(), rot_dims, pairing == "half", wh, ww)
