"""Triton device helpers of the window-attention kernels: which tokens a tile holds and where they are, the tiles
of q, k, v with their position terms, one step of a query tile's loop over key tiles (imported through
``winpos.kernels._jit``; the kernels themselves are in ``tl_attention``).

A program's rows are tokens of one window (``PACK == 1``: offsets from the window's top-left token) or of ``PACK``
whole windows side by side (offsets from the image's top-left token; slot ``g`` is window ``pack * PACK + g``).
"""
import triton
import triton.language as tl

from .tl_common import load_tile, logits_tile, tile_mask, token_rows, window_origin, window_tokens
from .tl_relpos import rel_tiles, rel_w_rows, tile_bias


@triton.jit
def program_origin(pid_g, n_win, n_ww, QWH, QWW, PACK: tl.constexpr):
    """Batch index, grid (row, col) of the program's base token and its pack index inside the image: the window's
    top-left token (``PACK == 1``; pack 0) or the image's (``PACK > 1``: rows carry their window's position)."""
    if PACK == 1:
        b, y0, x0 = window_origin(pid_g, n_win, n_ww, QWH, QWW)
        pk = 0
    else:
        n_packs = (n_win + PACK - 1) // PACK
        b = pid_g // n_packs
        pk = pid_g % n_packs
        y0 = 0
        x0 = 0
    return b, y0, x0, pk


@triton.jit
def tile_tokens(tile, BLOCK: tl.constexpr, WH, WW, pk, n_win, n_ww, PACK: tl.constexpr):
    """Rows of one tile: window-local token id, local (row, col), existence, the (row, col) offset from the
    program's base token used for addressing, and each row's slot (the window it belongs to; 0 without packing)."""
    if PACK == 1:
        t, ly, lx, valid = window_tokens(tile * BLOCK, BLOCK, WH * WW, WW)
        ry = ly
        rx = lx
        slot = 0
    else:
        SLOT: tl.constexpr = BLOCK // PACK
        r = tl.arange(0, BLOCK)
        slot = r // SLOT
        t = r % SLOT
        ly = t // WW
        lx = t % WW
        w = pk * PACK + slot
        valid = (t < WH * WW) & (w < n_win)
        ry = (w // n_ww) * WH + ly
        rx = (w % n_ww) * WW + lx
    return t, ly, lx, valid, ry, rx, slot


@triton.jit
def same_window(s, q_slot, k_slot, PACK: tl.constexpr, KEYS_FIRST: tl.constexpr):
    """``-inf`` where a packed tile pairs a query and a key of different windows (identity without packing)."""
    if PACK > 1:
        if KEYS_FIRST:
            s = tl.where(k_slot[:, None] == q_slot[None, :], s, float("-inf"))
        else:
            s = tl.where(q_slot[:, None] == k_slot[None, :], s, float("-inf"))
    return s


@triton.jit
def head_fov(FOV, SLOPE, head, HAS_LH: tl.constexpr):
    """A head's two half-planes as floats and its slope in base-2 units (zeros when LookHere is off)."""
    a0 = 0.0
    b0 = 0.0
    a1 = 0.0
    b1 = 0.0
    slope2 = 0.0
    if HAS_LH:
        a0 = tl.load(FOV + head * 4 + 0).to(tl.float32)
        b0 = tl.load(FOV + head * 4 + 1).to(tl.float32)
        a1 = tl.load(FOV + head * 4 + 2).to(tl.float32)
        b1 = tl.load(FOV + head * 4 + 3).to(tl.float32)
        slope2 = tl.load(SLOPE + head).to(tl.float32) * 1.4426950408889634
    return a0, b0, a1, b1, slope2


@triton.jit
def visit_count(CLS, at, n_all, HAS_LH: tl.constexpr):
    """How many tiles a program's loop visits: all ``n_all``, or with LookHere the count its compacted tile list
    stores at ``CLS[at]`` (a uniform loop over only the visited tiles, which the pipeliner can overlap)."""
    n = n_all
    if HAS_LH:
        n = tl.load(CLS + at)
    return n


@triton.jit
def visit_tile(CLS, at, i, HAS_LH: tl.constexpr):
    """The tile of the loop's ``i``-th step: ``i`` itself, or with LookHere entry ``i`` of the list at ``CLS[at]``."""
    t = i
    if HAS_LH:
        t = tl.load(CLS + at + i)
    return t


@triton.jit
def key_tile(K, V, k_base, v_base, sk_h, sk_w, sv_h, sv_w, kt, ky0, kx0, KWH, KWW, KVH, KVW,
              COSK, SINK, k_tab0, ck_t, offs_d, pk, n_win, n_ww,
              HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, ROT: tl.constexpr, HALF: tl.constexpr,
              HAS_ROPE: tl.constexpr, KV_SAME: tl.constexpr, PAD_MASK: tl.constexpr, PACK: tl.constexpr):
    """Key tile ``kt`` of a window (or of a pack of windows): rotated k and v ``[BLOCK_N, BLOCK_D]``, local token
    id and (row, col), existence, whether each key lies in the unpadded grid (only computed under ``PAD_MASK``), the
    rows' offsets from the program's base token and their slots."""
    tk, kly, klx, k_valid, kry, krx, k_slot = tile_tokens(kt, BLOCK_N, KWH, KWW, pk, n_win, n_ww, PACK)
    k_rows = token_rows(kry, krx, sk_h, sk_w)
    k = load_tile(K + k_base, k_rows, k_valid, offs_d, HEAD_DIM, COSK, SINK, k_tab0 + tk * ck_t, ROT, HALF,
                  HAS_ROPE)
    if KV_SAME:
        v_rows = k_rows
    else:
        v_rows = token_rows(kry, krx, sv_h, sv_w)
    v = tl.load(V + v_base + v_rows[:, None] + offs_d[None, :], mask=tile_mask(k_valid, offs_d, HEAD_DIM),
                other=0.0)
    k_gvalid = k_valid
    if PAD_MASK:
        k_gvalid = ((ky0 + kry) < KVH) & ((kx0 + krx) < KVW)
    return tk, kly, klx, k_valid, k_gvalid, k, v, kry, krx, k_slot


@triton.jit
def query_tile(Q, q_base, sq_h, sq_w, qt, qy0, qx0, QWH, QWW, QVH, QVW, POOL,
                COSQ, SINQ, q_tab0, cq_t, REL, r_base, sr_h, sr_w, KWH, KWW, offs_d, pk, n_win, n_ww,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, ROT: tl.constexpr, HALF: tl.constexpr,
                HAS_ROPE: tl.constexpr, HAS_REL: tl.constexpr, KH_P: tl.constexpr, KW_P: tl.constexpr,
                PAD_MASK: tl.constexpr, REL_ROWS: tl.constexpr, KEEP_W: tl.constexpr, PACK: tl.constexpr):
    """Query tile ``qt`` of a window (or of a pack of windows): rotated q, local (row, col), existence,
    unpadded-grid validity, LookHere coordinates in key units (pooled queries sit at the centre of their
    ``POOL x POOL`` key cell), relpos terms and rows, the rows' offsets from the program's base token and their
    slots. Relpos terms: both parts for the one-hot bias; with key tiles that are grid rows (``REL_ROWS``) only
    ``rel_w``, and only when the caller keeps it (``KEEP_W``: its loop runs over key tiles)."""
    tq, qly, qlx, q_valid, qry, qrx, q_slot = tile_tokens(qt, BLOCK_M, QWH, QWW, pk, n_win, n_ww, PACK)
    q = load_tile(Q + q_base, token_rows(qry, qrx, sq_h, sq_w), q_valid, offs_d, HEAD_DIM, COSQ, SINQ,
                  q_tab0 + tq * cq_t, ROT, HALF, HAS_ROPE)
    q_gvalid = q_valid
    if PAD_MASK:
        q_gvalid = ((qy0 + qry) < QVH) & ((qx0 + qrx) < QVW)
    qy = (qly * POOL).to(tl.float32) + (POOL - 1) * 0.5
    qx = (qlx * POOL).to(tl.float32) + (POOL - 1) * 0.5
    rh = 0.0
    rw = 0.0
    rel_rows = token_rows(qry, qrx, sr_h, sr_w)
    if HAS_REL:
        if REL_ROWS:
            if KEEP_W:
                rw = rel_w_rows(REL + r_base, rel_rows, q_valid, KH_P, KW_P)
        else:
            rh, rw = rel_tiles(REL + r_base, rel_rows, q_valid, KH_P, KW_P)
    return tq, qly, qlx, q_valid, q_gvalid, qy, qx, q, rh, rw, rel_rows, qry, qrx, q_slot


@triton.jit
def key_step(CLS, i, head, qt, n_qt, n_kt, K, V, k_base, v_base, sk_h, sk_w, sv_h, sv_w, ky0, kx0, KWH, KWW, KVH,
              KVW, COSK, SINK, k_tab0, ck_t, offs_d, pk, n_win, n_ww, REL, r_base, rel_rows, rh, rw, q, qk_scale,
              qy, qx, q_valid, q_gvalid, q_slot, a0, b0, a1, b1, slope2,
              HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, ROT: tl.constexpr, HALF: tl.constexpr,
              HAS_ROPE: tl.constexpr, KV_SAME: tl.constexpr, PAD_MASK: tl.constexpr, PACK: tl.constexpr,
              HAS_REL: tl.constexpr, HAS_LH: tl.constexpr, KH_P: tl.constexpr, KW_P: tl.constexpr,
              REL_ROWS: tl.constexpr, PRECISION: tl.constexpr):
    """Step ``i`` of a query tile's loop over key tiles (forward and dQ pass): the key tile it visits, its rotated
    k and v, their local (row, col), and the base-2 logits with every position term and mask applied."""
    kt = visit_tile(CLS, (head * n_qt + qt) * n_kt, i, HAS_LH)
    tk, kly, klx, k_valid, k_gvalid, k, v, kry, krx, k_slot = key_tile(
        K, V, k_base, v_base, sk_h, sk_w, sv_h, sv_w, kt, ky0, kx0, KWH, KWW, KVH, KVW, COSK, SINK, k_tab0, ck_t,
        offs_d, pk, n_win, n_ww, HEAD_DIM, BLOCK_N, ROT, HALF, HAS_ROPE, KV_SAME, PAD_MASK, PACK)
    bias = 0.0
    if HAS_REL:
        bias = tile_bias(REL + r_base, rel_rows, q_valid, rh, rw, kt, kly, klx, KH_P, KW_P, REL_ROWS, PRECISION)
    s = logits_tile(q, k, qk_scale, bias, kly, klx, k_valid, qy, qx, q_gvalid, k_gvalid,
                    a0, b0, a1, b1, slope2, HAS_REL, HAS_LH, PAD_MASK, PRECISION)
    return kt, kly, klx, k, v, same_window(s, q_slot, k_slot, PACK, False)


@triton.jit
def softmax_stats(LSE, DELTA, l_base, ry, rx, q_valid, sl_h, sl_w):
    rows = token_rows(ry, rx, sl_h, sl_w)
    lse = tl.load(LSE + l_base + rows, mask=q_valid, other=float("inf"))
    delta = tl.load(DELTA + l_base + rows, mask=q_valid, other=0.0)
    return lse, delta
