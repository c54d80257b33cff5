"""Triton kernels of fused window attention: forward, dQ pass and dK/dV pass (FlashAttention-2 structure).

Program grid ``(batch * windows, tiles, heads)``: axis 0 is the group (one window of one image, or the whole grid
for global attention), axis 1 the query tile (forward, dQ) or key tile (dK/dV). Window tokens are mapped to grid
rows in-kernel (``tl_common``), so q, k, v, o and every gradient stay in the ``(B, H, W, heads, D)`` layout.

Shared arguments (see ``attention_fwd_bwd._kernel_args``):
  Q, K, V + strides (batch, row, col, head); LSE: fp32 ``(B, Hq, Wq, heads)`` base-2 log-sum-exp;
  COSQ/SINQ/COSK/SINK fp32 RoPE tables + (head, row) strides; REL packed ``[rel_h | rel_w]`` ``(B, Hq, Wq, heads,
  KH_P + KW_P)`` (zero-padded to the power-of-two extents, rel_w from column KH_P); FOV int32 ``(heads, 4)``
  = (a0, b0, a1, b1), SLOPE fp32 ``(heads,)``, CLS int32 compacted LookHere tile lists (``lookhere_tile_lists``:
  per query tile the visited key tiles first, per key tile the visited query tiles, and their counts); window
  geometry (``QWH x QWW`` query window, ``KWH x KWW`` key window,
  pooling stride ``POOL``); padding extents ``QVH, QVW`` (queries) and ``KVH, KVW`` (keys) in grid tokens.
  Strides of q/k/v/o/do/dq/dk/dv arrive divided by ``SV`` (16 bytes in elements when every stride allows it, else
  1) and are multiplied back here: a constexpr factor tells the compiler they are multiples of 16 bytes (Triton
  marks only ints divisible by 16 elements, so head_dim 56 or 72 strides would otherwise get 2-byte accesses).

Several windows per program (``PACK > 1``, for windows far smaller than a tile, e.g. 4x4): a tile holds ``PACK``
whole windows of one image, ``BLOCK_M // PACK`` query rows and ``BLOCK_N // PACK`` key rows each (slot ``g`` =
window ``pack * PACK + g`` of the image), and a query sees only the keys of its own slot (a block-diagonal mask on
top of the other terms). There is one query tile and one key tile per program (``n_qt = n_kt = 1``). Program axis 0
then enumerates ``batch * ceil(windows / PACK)`` packs, the base offset is the image's top-left token and each
row's offset adds its window's position in the image. With ``PACK == 1`` every row is a token of the program's one
window, addressed from that window's corner as before.
"""
import triton
import triton.language as tl

from .tl_common import base_offset, logits_tile, logits_tile_t, tile_mask, token_rows, unrotate
from .tl_relpos import onehot_bias, onehot_drel, row_bias_t, row_drel
from .tl_tiles import (head_fov, key_step, key_tile, program_origin, query_tile, same_window, softmax_stats,
                       visit_count, visit_tile)

# Window geometry changes with every block shape; specializing on it (value 1, divisibility by 16) would compile
# a new kernel per shape for no gain, so only strides and constexprs pick kernel variants.
# The fp32 LSE/delta rows are read one scalar per token, so their strides' divisibility would only add variants.
_GEOMETRY = ["n_qt", "n_kt", "n_win", "n_ww", "QWH", "QWW", "KWH", "KWW", "POOL", "QVH", "QVW", "KVH", "KVW",
             "sl_b", "sl_h", "sl_w"]


@triton.jit(do_not_specialize=_GEOMETRY)
def attn_fwd(
    Q, K, V, O, LSE,
    sq_b, sq_h, sq_w, sq_n, sk_b, sk_h, sk_w, sk_n, sv_b, sv_h, sv_w, sv_n, so_b, so_h, so_w, so_n,
    sl_b, sl_h, sl_w,
    COSQ, SINQ, COSK, SINK, cq_n, cq_t, ck_n, ck_t,
    REL, sr_b, sr_h, sr_w, sr_n,
    FOV, SLOPE, CLS, n_qt, n_kt,
    n_win, n_ww, QWH, QWW, KWH, KWW, POOL, QVH, QVW, KVH, KVW,
    qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ROT: tl.constexpr, HALF: tl.constexpr, HAS_ROPE: tl.constexpr, HAS_REL: tl.constexpr,
    KH_P: tl.constexpr, KW_P: tl.constexpr, HAS_LH: tl.constexpr, PAD_MASK: tl.constexpr,
    KV_SAME: tl.constexpr, PRECISION: tl.constexpr, SV: tl.constexpr, REL_ROWS: tl.constexpr,
    PACK: tl.constexpr,
):
    pid_g = tl.program_id(0)
    sq_b, sq_h, sq_w, sq_n = sq_b * SV, sq_h * SV, sq_w * SV, sq_n * SV
    sk_b, sk_h, sk_w, sk_n = sk_b * SV, sk_h * SV, sk_w * SV, sk_n * SV
    sv_b, sv_h, sv_w, sv_n = sv_b * SV, sv_h * SV, sv_w * SV, sv_n * SV
    so_b, so_h, so_w, so_n = so_b * SV, so_h * SV, so_w * SV, so_n * SV
    qt = tl.program_id(1)
    head = tl.program_id(2)
    offs_d = tl.arange(0, BLOCK_D)
    b, qy0, qx0, pk = program_origin(pid_g, n_win, n_ww, QWH, QWW, PACK)
    ky0 = qy0 * POOL
    kx0 = qx0 * POOL
    r_base = base_offset(b, qy0, qx0, head, sr_b, sr_h, sr_w, sr_n)
    tq, qly, qlx, q_valid, q_gvalid, qy, qx, q, rh, rw, rel_rows, qry, qrx, q_slot = query_tile(
        Q, base_offset(b, qy0, qx0, head, sq_b, sq_h, sq_w, sq_n), sq_h, sq_w, qt, qy0, qx0, QWH, QWW, QVH, QVW,
        POOL, COSQ, SINQ, head * cq_n, cq_t, REL, r_base, sr_h, sr_w,
        KWH, KWW, offs_d, pk, n_win, n_ww, HEAD_DIM, BLOCK_M, ROT, HALF, HAS_ROPE, HAS_REL, KH_P, KW_P, PAD_MASK,
        REL_ROWS, True, PACK)
    a0, b0, a1, b1, slope2 = head_fov(FOV, SLOPE, head, HAS_LH)
    k_base = base_offset(b, ky0, kx0, head, sk_b, sk_h, sk_w, sk_n)
    v_base = base_offset(b, ky0, kx0, head, sv_b, sv_h, sv_w, sv_n)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    n_lh = tl.num_programs(2) * n_qt * n_kt  # query-major LookHere lists: n_lh entries, then one count per row
    for i in range(0, visit_count(CLS, n_lh + head * n_qt + qt, n_kt, HAS_LH)):
        kt, kly, klx, k, v, s = key_step(
            CLS, i, head, qt, n_qt, n_kt, K, V, k_base, v_base, sk_h, sk_w, sv_h, sv_w, ky0, kx0, KWH, KWW, KVH, KVW,
            COSK, SINK, head * ck_n, ck_t, offs_d, pk, n_win, n_ww, REL, r_base, rel_rows, rh, rw, q, qk_scale,
            qy, qx, q_valid, q_gvalid, q_slot, a0, b0, a1, b1, slope2, HEAD_DIM, BLOCK_N, ROT, HALF, HAS_ROPE,
            KV_SAME, PAD_MASK, PACK, HAS_REL, HAS_LH, KH_P, KW_P, REL_ROWS, PRECISION)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row with every key masked so far keeps m = -inf; shift by 0 instead so exp2 gives 0, not NaN.
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_use[:, None])
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    o_base = base_offset(b, qy0, qx0, head, so_b, so_h, so_w, so_n)
    tl.store(O + o_base + token_rows(qry, qrx, so_h, so_w)[:, None] + offs_d[None, :], out.to(O.dtype.element_ty),
             mask=tile_mask(q_valid, offs_d, HEAD_DIM))
    # +inf for a row that saw nothing makes every recomputed probability 0 in the backward passes.
    lse = tl.where(seen, m_i + tl.math.log2(tl.where(seen, l_i, 1.0)), float("inf"))
    l_base = base_offset(b, qy0, qx0, head, sl_b, sl_h, sl_w, 1)
    tl.store(LSE + l_base + token_rows(qry, qrx, sl_h, sl_w), lse, mask=q_valid)


@triton.jit(do_not_specialize=_GEOMETRY)
def attn_bwd_dq(
    Q, K, V, O, LSE, DO, DELTA, DQ, DREL,
    sq_b, sq_h, sq_w, sq_n, sk_b, sk_h, sk_w, sk_n, sv_b, sv_h, sv_w, sv_n, so_b, so_h, so_w, so_n, sl_b, sl_h, sl_w,
    sdo_b, sdo_h, sdo_w, sdo_n, sdq_b, sdq_h, sdq_w, sdq_n,
    COSQ, SINQ, COSK, SINK, cq_n, cq_t, ck_n, ck_t,
    REL, sr_b, sr_h, sr_w, sr_n,
    FOV, SLOPE, CLS, n_qt, n_kt,
    n_win, n_ww, QWH, QWW, KWH, KWW, POOL, QVH, QVW, KVH, KVW,
    qk_scale, scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ROT: tl.constexpr, HALF: tl.constexpr, HAS_ROPE: tl.constexpr, HAS_REL: tl.constexpr,
    KH_P: tl.constexpr, KW_P: tl.constexpr, HAS_LH: tl.constexpr, PAD_MASK: tl.constexpr,
    KV_SAME: tl.constexpr, PRECISION: tl.constexpr, REL_PRECISION: tl.constexpr, SV: tl.constexpr,
    REL_ROWS: tl.constexpr, PACK: tl.constexpr,
):
    """dQ, and the per-query relpos gradients d rel_h, d rel_w reduced over keys right here (no atomics); also
    writes ``DELTA = rowsum(O * DO)`` (fp32, LSE's layout) for the dK/dV pass."""
    pid_g = tl.program_id(0)
    sq_b, sq_h, sq_w, sq_n = sq_b * SV, sq_h * SV, sq_w * SV, sq_n * SV
    sk_b, sk_h, sk_w, sk_n = sk_b * SV, sk_h * SV, sk_w * SV, sk_n * SV
    sv_b, sv_h, sv_w, sv_n = sv_b * SV, sv_h * SV, sv_w * SV, sv_n * SV
    so_b, so_h, so_w, so_n = so_b * SV, so_h * SV, so_w * SV, so_n * SV
    sdo_b, sdo_h, sdo_w, sdo_n = sdo_b * SV, sdo_h * SV, sdo_w * SV, sdo_n * SV
    sdq_b, sdq_h, sdq_w, sdq_n = sdq_b * SV, sdq_h * SV, sdq_w * SV, sdq_n * SV
    qt = tl.program_id(1)
    head = tl.program_id(2)
    offs_d = tl.arange(0, BLOCK_D)
    b, qy0, qx0, pk = program_origin(pid_g, n_win, n_ww, QWH, QWW, PACK)
    ky0 = qy0 * POOL
    kx0 = qx0 * POOL
    r_base = base_offset(b, qy0, qx0, head, sr_b, sr_h, sr_w, sr_n)
    tq, qly, qlx, q_valid, q_gvalid, qy, qx, q, rh, rw, rel_rows, qry, qrx, q_slot = query_tile(
        Q, base_offset(b, qy0, qx0, head, sq_b, sq_h, sq_w, sq_n), sq_h, sq_w, qt, qy0, qx0, QWH, QWW, QVH, QVW,
        POOL, COSQ, SINQ, head * cq_n, cq_t, REL, r_base, sr_h, sr_w,
        KWH, KWW, offs_d, pk, n_win, n_ww, HEAD_DIM, BLOCK_M, ROT, HALF, HAS_ROPE, HAS_REL, KH_P, KW_P, PAD_MASK,
        REL_ROWS, True, PACK)
    do_base = base_offset(b, qy0, qx0, head, sdo_b, sdo_h, sdo_w, sdo_n)
    do = tl.load(DO + do_base + token_rows(qry, qrx, sdo_h, sdo_w)[:, None] + offs_d[None, :],
                 mask=tile_mask(q_valid, offs_d, HEAD_DIM), other=0.0)
    # delta = rowsum(o * do) in fp32, computed here for this program's queries (each query row belongs to exactly
    # one dQ program) and stored for the dK/dV pass, which launches after this one.
    o = tl.load(O + base_offset(b, qy0, qx0, head, so_b, so_h, so_w, so_n) + token_rows(qry, qrx, so_h, so_w)[:, None]
                + offs_d[None, :], mask=tile_mask(q_valid, offs_d, HEAD_DIM), other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    l_base = base_offset(b, qy0, qx0, head, sl_b, sl_h, sl_w, 1)
    l_rows = token_rows(qry, qrx, sl_h, sl_w)
    tl.store(DELTA + l_base + l_rows, delta, mask=q_valid)
    lse = tl.load(LSE + l_base + l_rows, mask=q_valid, other=float("inf"))
    a0, b0, a1, b1, slope2 = head_fov(FOV, SLOPE, head, HAS_LH)
    k_base = base_offset(b, ky0, kx0, head, sk_b, sk_h, sk_w, sk_n)
    v_base = base_offset(b, ky0, kx0, head, sv_b, sv_h, sv_w, sv_n)

    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    drh = tl.zeros([BLOCK_M, KH_P], dtype=tl.float32)
    drw = tl.zeros([BLOCK_M, KW_P], dtype=tl.float32)
    n_lh = tl.num_programs(2) * n_qt * n_kt  # query-major LookHere lists: n_lh entries, then one count per row
    for i in range(0, visit_count(CLS, n_lh + head * n_qt + qt, n_kt, HAS_LH)):
        kt, kly, klx, k, v, s = key_step(
            CLS, i, head, qt, n_qt, n_kt, K, V, k_base, v_base, sk_h, sk_w, sv_h, sv_w, ky0, kx0, KWH, KWW, KVH, KVW,
            COSK, SINK, head * ck_n, ck_t, offs_d, pk, n_win, n_ww, REL, r_base, rel_rows, rh, rw, q, qk_scale,
            qy, qx, q_valid, q_gvalid, q_slot, a0, b0, a1, b1, slope2, HEAD_DIM, BLOCK_N, ROT, HALF, HAS_ROPE,
            KV_SAME, PAD_MASK, PACK, HAS_REL, HAS_LH, KH_P, KW_P, REL_ROWS, PRECISION)
        p = tl.math.exp2(s - lse[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])  # gradient of the natural-unit logits
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
        if HAS_REL:
            if REL_ROWS:
                drh, drw = row_drel(drh, drw, ds, kt, KH_P)
            else:
                drh, drw = onehot_drel(drh, drw, ds, kly, klx, KH_P, KW_P, REL_PRECISION)

    dq = dq * scale
    if HAS_ROPE:
        dq = unrotate(dq, COSQ, SINQ, head * cq_n + tq * cq_t, q_valid, offs_d, ROT, HALF)
    dq_base = base_offset(b, qy0, qx0, head, sdq_b, sdq_h, sdq_w, sdq_n)
    tl.store(DQ + dq_base + token_rows(qry, qrx, sdq_h, sdq_w)[:, None] + offs_d[None, :], dq.to(DQ.dtype.element_ty),
             mask=tile_mask(q_valid, offs_d, HEAD_DIM))
    if HAS_REL:
        oh = tl.arange(0, KH_P)
        ow = tl.arange(0, KW_P)
        tl.store(DREL + r_base + rel_rows[:, None] + oh[None, :], drh.to(DREL.dtype.element_ty),
                 mask=q_valid[:, None])
        tl.store(DREL + r_base + rel_rows[:, None] + KH_P + ow[None, :], drw.to(DREL.dtype.element_ty),
                 mask=q_valid[:, None])


@triton.jit(do_not_specialize=_GEOMETRY)
def attn_bwd_dkdv(
    Q, K, V, LSE, DO, DELTA, DK, DV,
    sq_b, sq_h, sq_w, sq_n, sk_b, sk_h, sk_w, sk_n, sv_b, sv_h, sv_w, sv_n, sl_b, sl_h, sl_w,
    sdo_b, sdo_h, sdo_w, sdo_n, sdk_b, sdk_h, sdk_w, sdk_n,
    COSQ, SINQ, COSK, SINK, cq_n, cq_t, ck_n, ck_t,
    REL, sr_b, sr_h, sr_w, sr_n,
    FOV, SLOPE, CLS, n_qt, n_kt,
    n_win, n_ww, QWH, QWW, KWH, KWW, POOL, QVH, QVW, KVH, KVW,
    qk_scale, scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ROT: tl.constexpr, HALF: tl.constexpr, HAS_ROPE: tl.constexpr, HAS_REL: tl.constexpr,
    KH_P: tl.constexpr, KW_P: tl.constexpr, HAS_LH: tl.constexpr, PAD_MASK: tl.constexpr,
    KV_SAME: tl.constexpr, PRECISION: tl.constexpr, SV: tl.constexpr, REL_ROWS: tl.constexpr,
    PACK: tl.constexpr,
):
    """dK, dV of one key tile, looping over the query tiles of its window (DK and DV share strides)."""
    pid_g = tl.program_id(0)
    sq_b, sq_h, sq_w, sq_n = sq_b * SV, sq_h * SV, sq_w * SV, sq_n * SV
    sk_b, sk_h, sk_w, sk_n = sk_b * SV, sk_h * SV, sk_w * SV, sk_n * SV
    sv_b, sv_h, sv_w, sv_n = sv_b * SV, sv_h * SV, sv_w * SV, sv_n * SV
    sdo_b, sdo_h, sdo_w, sdo_n = sdo_b * SV, sdo_h * SV, sdo_w * SV, sdo_n * SV
    sdk_b, sdk_h, sdk_w, sdk_n = sdk_b * SV, sdk_h * SV, sdk_w * SV, sdk_n * SV
    kt = tl.program_id(1)
    head = tl.program_id(2)
    offs_d = tl.arange(0, BLOCK_D)
    b, qy0, qx0, pk = program_origin(pid_g, n_win, n_ww, QWH, QWW, PACK)
    ky0 = qy0 * POOL
    kx0 = qx0 * POOL
    k_base = base_offset(b, ky0, kx0, head, sk_b, sk_h, sk_w, sk_n)
    tk, kly, klx, k_valid, k_gvalid, k, v, kry, krx, k_slot = key_tile(
        K, V, k_base, base_offset(b, ky0, kx0, head, sv_b, sv_h, sv_w, sv_n), sk_h, sk_w, sv_h, sv_w, kt, ky0, kx0,
        KWH, KWW, KVH, KVW, COSK, SINK, head * ck_n, ck_t, offs_d, pk, n_win, n_ww, HEAD_DIM, BLOCK_N, ROT, HALF,
        HAS_ROPE, KV_SAME, PAD_MASK, PACK)
    a0, b0, a1, b1, slope2 = head_fov(FOV, SLOPE, head, HAS_LH)
    q_base = base_offset(b, qy0, qx0, head, sq_b, sq_h, sq_w, sq_n)
    r_base = base_offset(b, qy0, qx0, head, sr_b, sr_h, sr_w, sr_n)
    do_base = base_offset(b, qy0, qx0, head, sdo_b, sdo_h, sdo_w, sdo_n)
    l_base = base_offset(b, qy0, qx0, head, sl_b, sl_h, sl_w, 1)

    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    heads = tl.num_programs(2)
    n_lh = heads * n_qt * n_kt  # key-major LookHere lists follow the query-major block and its counts
    for i in range(0, visit_count(CLS, 2 * n_lh + heads * n_qt + head * n_kt + kt, n_qt, HAS_LH)):
        qt = visit_tile(CLS, n_lh + heads * n_qt + (head * n_kt + kt) * n_qt, i, HAS_LH)
        tq, qly, qlx, q_valid, q_gvalid, qy, qx, q, rh, rw, rel_rows, qry, qrx, q_slot = query_tile(
            Q, q_base, sq_h, sq_w, qt, qy0, qx0, QWH, QWW, QVH, QVW, POOL, COSQ, SINQ, head * cq_n, cq_t,
            REL, r_base, sr_h, sr_w, KWH, KWW, offs_d, pk, n_win, n_ww, HEAD_DIM, BLOCK_M, ROT, HALF, HAS_ROPE,
            HAS_REL, KH_P, KW_P, PAD_MASK, REL_ROWS, False, PACK)
        do = tl.load(DO + do_base + token_rows(qry, qrx, sdo_h, sdo_w)[:, None] + offs_d[None, :],
             mask=tile_mask(q_valid, offs_d, HEAD_DIM), other=0.0)
        lse, delta = softmax_stats(LSE, DELTA, l_base, qry, qrx, q_valid, sl_h, sl_w)
        if HAS_REL and not REL_ROWS:  # transposed one-hot bias dots would serialize the loop (C7515)
            s = logits_tile(q, k, qk_scale, onehot_bias(rh, rw, kly, klx, KH_P, KW_P, PRECISION), kly, klx,
                            k_valid, qy, qx, q_gvalid, k_gvalid, a0, b0, a1, b1, slope2, HAS_REL, HAS_LH, PAD_MASK,
                            PRECISION)
            s = same_window(s, q_slot, k_slot, PACK, False)
            p = tl.math.exp2(s - lse[:, None])
            dv += tl.dot(tl.trans(p).to(do.dtype), do, input_precision=PRECISION)
            dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
            ds = p * (dp - delta[:, None])
            dk += tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=PRECISION)
        else:
            # Transposed (keys x queries) so both accumulating dots take their left operand straight from
            # registers: p^T.do and ds^T.q without a register transpose (which ptxas serializes, C7515).
            st = logits_tile_t(q, k, qk_scale, kly, klx, k_valid, qy, qx, q_gvalid, k_gvalid,
                               a0, b0, a1, b1, slope2, HAS_LH, PAD_MASK, PRECISION)
            if HAS_REL:  # row-aligned (key tile kt is grid row kt): no dots; masked logits stay -inf
                st += row_bias_t(REL + r_base, rel_rows, q_valid, kt, KH_P, BLOCK_N) * 1.4426950408889634
            st = same_window(st, q_slot, k_slot, PACK, True)
            pt = tl.math.exp2(st - lse[None, :])
            dv += tl.dot(pt.to(do.dtype), do, input_precision=PRECISION)
            dpt = tl.dot(v, tl.trans(do), input_precision=PRECISION)
            dst = pt * (dpt - delta[None, :])
            dk += tl.dot(dst.to(q.dtype), q, input_precision=PRECISION)

    dk = dk * scale
    if HAS_ROPE:
        dk = unrotate(dk, COSK, SINK, head * ck_n + tk * ck_t, k_valid, offs_d, ROT, HALF)
    out_base = base_offset(b, ky0, kx0, head, sdk_b, sdk_h, sdk_w, sdk_n)
    out_rows = token_rows(kry, krx, sdk_h, sdk_w)
    omask = tile_mask(k_valid, offs_d, HEAD_DIM)
    tl.store(DK + out_base + out_rows[:, None] + offs_d[None, :], dk.to(DK.dtype.element_ty), mask=omask)
    tl.store(DV + out_base + out_rows[:, None] + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=omask)
