"""Standalone Triton RoPE kernel on the token grid (the unfused baseline; imported through ``winpos.kernels._jit``)."""
import triton
import triton.language as tl

from .tl_common import rope_coeffs


@triton.jit
def rope_grid_kernel(
    X, Y, COS, SIN,
    sx_b, sx_h, sx_w, sx_n, sy_b, sy_h, sy_w, sy_n, c_n, c_t,
    n_tokens, H, W, WH, WW,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr,
    ROT: tl.constexpr, HALF: tl.constexpr, CONJUGATE: tl.constexpr,
):
    """``Y = R(theta) X`` (or ``R(-theta) X`` with ``CONJUGATE``, the backward) for ``BLOCK_T`` grid tokens of one
    head. Tokens are taken in grid raster order; the table row is the token's index inside its ``WH x WW`` window
    (the whole grid for global attention). Dims beyond ``ROT`` are copied."""
    pid = tl.program_id(0)
    head = tl.program_id(1)
    t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    valid = t < n_tokens
    b = t // (H * W)
    r = t % (H * W)
    y = r // W
    x = r % W
    local = (y % WH) * WW + (x % WW)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < HEAD_DIM
    m = valid[:, None] & dmask[None, :]
    x_rows = b.to(tl.int64) * sx_b + y.to(tl.int64) * sx_h + x.to(tl.int64) * sx_w + head * sx_n
    c, s, partner = rope_coeffs(COS, SIN, local * c_t + head * c_n, valid, offs_d, ROT, HALF)
    if CONJUGATE:
        s = -s
    xv = tl.load(X + x_rows[:, None] + offs_d[None, :], mask=m, other=0.0)
    xp = tl.load(X + x_rows[:, None] + partner[None, :], mask=m, other=0.0)
    out = xv.to(tl.float32) * c + xp.to(tl.float32) * s
    y_rows = b.to(tl.int64) * sy_b + y.to(tl.int64) * sy_h + x.to(tl.int64) * sy_w + head * sy_n
    tl.store(Y + y_rows[:, None] + offs_d[None, :], out.to(Y.dtype.element_ty), mask=m)
