"""Triton device helpers shared by the window-attention and RoPE kernels (imported through ``winpos.kernels._jit``).

Conventions used by every kernel:

* Tensors live on the token grid ``(B, H, W, heads, head_dim)`` with the head dim contiguous (stride 1); the
  other four strides are kernel arguments, so views (e.g. ``qkv.unbind``) are read in place.
* A *group* is one window of one image (or the whole grid for global attention). Program axis 0 enumerates
  ``batch * windows``; a window's tokens are numbered row-major inside it (``t = ly * window_w + lx``), which is
  also the row of the RoPE tables and the token order of LookHere's tile classes.
* Logits are kept in base 2 (``s2 = z * log2(e)``) so the online softmax uses ``exp2``; every additive bias is
  multiplied by ``log2(e)`` too (the segment-anything-fast bug was forgetting this).
* RoPE as a per-column linear map: ``y = x * C + x[partner] * S`` where ``partner`` swaps the two dims of a pair,
  ``C = cos`` and ``S = -sin`` on the first dim of a pair, ``+sin`` on the second (``C = 1, S = 0`` beyond R).
  Its transpose (the backward) is ``dx = dy * C + (dy * S)[partner]``.
"""
import triton
import triton.language as tl


@triton.jit
def window_origin(pid_g, n_win, n_ww, WH, WW):
    """Batch index and the grid (row, col) of the top-left token of window ``pid_g % n_win``."""
    b = pid_g // n_win
    w = pid_g % n_win
    return b, (w // n_ww) * WH, (w % n_ww) * WW


@triton.jit
def window_tokens(start, BLOCK: tl.constexpr, N, WW):
    """Window-local token ids ``start + [0, BLOCK)``, their local (row, col) and whether they exist (< N)."""
    t = start + tl.arange(0, BLOCK)
    return t, t // WW, t % WW, t < N


@triton.jit
def base_offset(b, y0, x0, head, s_b, s_h, s_w, s_n):
    """Element offset (int64 scalar: batch * stride can exceed 2**31) of a window's top-left token for one head."""
    return b.to(tl.int64) * s_b + y0.to(tl.int64) * s_h + x0.to(tl.int64) * s_w + head * s_n


@triton.jit
def token_rows(ly, lx, s_h, s_w):
    """int32 offsets of tokens at window-local (ly, lx) from their window's top-left token. Callers advance the
    base pointer by the int64 ``base_offset`` first (``X + base + rows``), so per-element address math stays
    32-bit (the host checks in-window offsets fit)."""
    return ly * s_h + lx * s_w


@triton.jit
def tile_mask(valid, offs_d, HEAD_DIM: tl.constexpr):
    """Load/store mask of a [rows, BLOCK_D] tile: rows that exist, and channels < HEAD_DIM when the head dim is
    padded (a row-only mask otherwise, which keeps per-element predicates out of the registers)."""
    if HEAD_DIM == offs_d.shape[0]:
        m = valid[:, None]
    else:
        m = valid[:, None] & (offs_d[None, :] < HEAD_DIM)
    return m


@triton.jit
def rope_columns(offs_d, ROT: tl.constexpr, HALF: tl.constexpr):
    """Per column of a [rows, BLOCK_D] tile: whether it is the first dim of its pair, its pair partner, its
    column in the ``(.., N, ROT/2)`` tables (0 beyond ``ROT``) and whether it is rotated at all (< ``ROT``)."""
    HR: tl.constexpr = ROT // 2
    if HALF:
        first = offs_d < HR
        partner = tl.where(first, offs_d + HR, offs_d - HR)
        col = tl.where(first, offs_d, offs_d - HR)
    else:
        first = (offs_d % 2) == 0
        partner = tl.where(first, offs_d + 1, offs_d - 1)
        col = offs_d // 2
    rotated = offs_d < ROT
    partner = tl.where(rotated, partner, offs_d)
    col = tl.where(rotated, col, 0)
    return first, partner, col, rotated


@triton.jit
def rope_coeffs(COS, SIN, tab_rows, valid, offs_d, ROT: tl.constexpr, HALF: tl.constexpr):
    """Per-element RoPE coefficients ``C, S`` ([rows, BLOCK_D] fp32) and the pair partner of each column, each
    table read at every column of the tile (each of its entries twice).

    ``tab_rows`` is each row's element offset into the ``(.., N, ROT/2)`` fp32 cos/sin tables.
    """
    first, partner, col, rotated = rope_columns(offs_d, ROT, HALF)
    m = valid[:, None] & rotated[None, :]
    c = tl.load(COS + tab_rows[:, None] + col[None, :], mask=m, other=1.0)
    s = tl.load(SIN + tab_rows[:, None] + col[None, :], mask=m, other=0.0)
    s = tl.where(first[None, :], -s, s)
    return c, s, partner


@triton.jit
def rope_coeffs_gathered(COS, SIN, tab_rows, valid, offs_d, ROT: tl.constexpr, HALF: tl.constexpr):
    """``rope_coeffs`` (the same values, bit for bit) from one half-width ``[rows, ROT/2]`` load of each table,
    spread to the tile's columns by a register gather along the head dim (both dims of a pair share cos and
    sin). The full-width loads of ``rope_coeffs`` are two [rows, BLOCK_D] fp32 tiles per rotated operand,
    which the pipeliner stages through shared memory next to the operand itself; sm_90a, fused-RoPE launches of
    ``tests/kernels/aot_compile.py``: with these the backward kernels stop spilling (Hiera-B+ 24 / 24 B, Hiera-L
    184 / 72 B -> 0) and ptxas keeps the forward's wgmma loop asynchronous (C7515 gone)."""
    HR: tl.constexpr = ROT // 2
    HRP: tl.constexpr = triton.next_power_of_2(max(HR, 1))
    first, partner, col, rotated = rope_columns(offs_d, ROT, HALF)
    offs_h = tl.arange(0, HRP)
    hm = valid[:, None] & (offs_h[None, :] < HR)
    ch = tl.load(COS + tab_rows[:, None] + offs_h[None, :], mask=hm, other=1.0)
    sh = tl.load(SIN + tab_rows[:, None] + offs_h[None, :], mask=hm, other=0.0)
    idx = tl.broadcast_to(col[None, :], (tab_rows.shape[0], offs_d.shape[0]))
    c = tl.where(rotated[None, :], tl.gather(ch, idx, axis=1), 1.0)
    s = tl.gather(sh, idx, axis=1)
    s = tl.where(rotated[None, :], tl.where(first[None, :], -s, s), 0.0)
    return c, s, partner


@triton.jit
def load_tile(PTR, rows, valid, offs_d, HEAD_DIM: tl.constexpr, COS, SIN, tab_rows,
              ROT: tl.constexpr, HALF: tl.constexpr, HAS_ROPE: tl.constexpr):
    """Load a [rows, BLOCK_D] tile (zeros outside), rotated by RoPE when ``HAS_ROPE``.

    The rotation runs in fp32 and rounds once to the input dtype, like ``winpos.posemb.rope.apply_rope``. The
    partner columns are a second load of the tile (a register gather instead holds fewer loads in flight but
    more registers in the forward: sm_90a, 4 warps, ViTDet-B / Hiera-B+ 168 / 235 registers with the load,
    224 / 252 with the gather).
    """
    m = tile_mask(valid, offs_d, HEAD_DIM)
    x = tl.load(PTR + rows[:, None] + offs_d[None, :], mask=m, other=0.0)
    if HAS_ROPE:
        c, s, partner = rope_coeffs_gathered(COS, SIN, tab_rows, valid, offs_d, ROT, HALF)
        xp = tl.load(PTR + rows[:, None] + partner[None, :], mask=m, other=0.0)
        x = (x.to(tl.float32) * c + xp.to(tl.float32) * s).to(x.dtype)
    return x


@triton.jit
def unrotate(g, COS, SIN, tab_rows, valid, offs_d, ROT: tl.constexpr, HALF: tl.constexpr):
    """Pull an fp32 gradient tile back through the RoPE rotation (rotation by -theta).

    The partner column of each row of the register tile is a gather along the head dim (exact, no arithmetic;
    an fp32 dot with a one-hot permutation would cost a BLOCK_D-cubed FMA product per program). The coefficients
    are full-width loads here: runs once per program, after the loop, and the half-width gather of
    ``rope_coeffs_gathered`` measured more registers (Hiera-L dK/dV 255 registers and 24 B of spills).
    """
    c, s, partner = rope_coeffs(COS, SIN, tab_rows, valid, offs_d, ROT, HALF)
    gs = g * s
    return g * c + tl.gather(gs, tl.broadcast_to(partner[None, :], gs.shape), axis=1)


@triton.jit
def logits_tile(q, k, qk_scale, bias, kly, klx, k_valid, qy, qx, q_gvalid, k_gvalid,
                a0, b0, a1, b1, slope2,
                HAS_REL: tl.constexpr, HAS_LH: tl.constexpr, PAD_MASK: tl.constexpr, PRECISION: tl.constexpr):
    """Base-2 logits ``[BLOCK_M, BLOCK_N]`` of one (query tile, key tile): ``log2(e) * (scale q.k + bias)`` with
    ``-inf`` where a key is absent, outside the head's field of view, or padded (``PAD_MASK``, valid queries only).

    Relpos: ``bias`` is the tile's ``rel_h[:, row(key)] + rel_w[:, col(key)]`` in natural units (``tl_relpos``).
    LookHere: ``-slope * |k - q|`` and the half-planes ``a dx + b dy >= 0`` with
    ``dx = x_k - x_q``, ``dy = y_k - y_q`` (query coordinates may be half-integers under q-pooling).
    """
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
    if HAS_REL:
        s += bias * 1.4426950408889634
    keep = k_valid[None, :]
    if HAS_LH:
        dx = klx.to(tl.float32)[None, :] - qx[:, None]
        dy = kly.to(tl.float32)[None, :] - qy[:, None]
        s -= slope2 * tl.sqrt(dx * dx + dy * dy)
        keep = keep & ((a0 * dx + b0 * dy) >= 0) & ((a1 * dx + b1 * dy) >= 0)
    if PAD_MASK:
        keep = keep & (k_gvalid[None, :] | (q_gvalid[:, None] == 0))
    return tl.where(keep, s, float("-inf"))


@triton.jit
def logits_tile_t(q, k, qk_scale, kly, klx, k_valid, qy, qx, q_gvalid, k_gvalid, a0, b0, a1, b1, slope2,
                  HAS_LH: tl.constexpr, PAD_MASK: tl.constexpr, PRECISION: tl.constexpr):
    """``logits_tile`` transposed, ``[BLOCK_N, BLOCK_M]`` (keys x queries), with the LookHere and padding terms
    (the transposed dK/dV pass adds a row-aligned relpos bias itself)."""
    s = tl.dot(k, tl.trans(q), input_precision=PRECISION) * qk_scale
    keep = k_valid[:, None]
    if HAS_LH:
        kx = klx.to(tl.float32)
        ky = kly.to(tl.float32)
        dx = kx[:, None] - qx[None, :]
        dy = ky[:, None] - qy[None, :]
        s -= slope2 * tl.sqrt(dx * dx + dy * dy)
        # a dx + b dy >= 0 as a x_k + b y_k >= a x_q + b y_q: the same test exactly (a, b in {-1, 0, 1}, small
        # half-integer coordinates), two per-row projections instead of four products per element. sm_90a: the
        # padded Hiera-B+ LookHere dK/dV 255 registers + 24 B of spills -> 249 and none; logits_tile keeps the
        # per-element form (there it would raise the dQ from 126 to 171 registers).
        keep = keep & ((a0 * kx + b0 * ky)[:, None] >= (a0 * qx + b0 * qy)[None, :]) \
            & ((a1 * kx + b1 * ky)[:, None] >= (a1 * qx + b1 * qy)[None, :])
    if PAD_MASK:
        keep = keep & (k_gvalid[:, None] | (q_gvalid[None, :] == 0))
    return tl.where(keep, s, float("-inf"))
