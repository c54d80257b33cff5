"""Triton helpers of the decomposed relative-position bias (imported through ``winpos.kernels._jit``).

Each query's packed REL row is ``[rel_h | 0 | rel_w | 0]`` (``KH_P + KW_P`` columns, ``rel_w`` from column
``KH_P``); the bias of key (ky, kx) is ``rel_h[ky] + rel_w[kx]``. A tile of it is built one of two ways:

* one-hot dots, for any tile: ``rel_h . onehot(row(key))^T + rel_w . onehot(col(key))^T``. Exact, but two extra
  dots per tile (as large as q.k^T at global extents, K = KH_P = 64), two more for the gradient, and in the
  dK/dV pass their transposes make ptxas serialize the wgmma loop (C7515).
* row-aligned (``REL_ROWS``, chosen by the host when a key tile is exactly one row of the key window,
  ``BLOCK_N == KWW``, e.g. 64-key tiles of a 64-wide global grid): key tile ``kt`` is grid row ``kt``, so its bias
  is one ``rel_h`` value per query plus the whole ``rel_w`` row, and its gradient a row sum plus the tile itself.
  No dots, exact fp32 sums. (Tiles narrower than the row would work the same way with a slice of ``rel_w``, but
  the sm_90a compile of the Hiera-L global dQ serialized its wgmma loop with them, so they keep the dots.)
"""
import triton
import triton.language as tl


@triton.jit
def rel_w_rows(REL, rel_rows, valid, KH_P: tl.constexpr, KW_P: tl.constexpr):
    """``rel_w`` of a query tile, ``[rows, KW_P]`` (16-byte aligned rows, read with a row mask only)."""
    ow = tl.arange(0, KW_P)
    return tl.load(REL + rel_rows[:, None] + KH_P + ow[None, :], mask=valid[:, None], other=0.0)


@triton.jit
def rel_tiles(REL, rel_rows, valid, KH_P: tl.constexpr, KW_P: tl.constexpr):
    """Per-query relpos terms of the one-hot path: ``rel_h`` [rows, KH_P] and ``rel_w`` [rows, KW_P] (columns
    beyond the window's ``KWH`` / ``KWW`` hold zeros)."""
    oh = tl.arange(0, KH_P)
    rh = tl.load(REL + rel_rows[:, None] + oh[None, :], mask=valid[:, None], other=0.0)
    return rh, rel_w_rows(REL, rel_rows, valid, KH_P, KW_P)


@triton.jit
def onehot_bias(rh, rw, kly, klx, KH_P: tl.constexpr, KW_P: tl.constexpr, PRECISION: tl.constexpr):
    """Bias tile ``[BLOCK_M, BLOCK_N]`` (natural units, fp32) by the one-hot dots: any tile size and window."""
    eh = (kly[None, :] == tl.arange(0, KH_P)[:, None]).to(rh.dtype)  # [KH_P, BLOCK_N]
    ew = (klx[None, :] == tl.arange(0, KW_P)[:, None]).to(rw.dtype)
    bias = tl.dot(rh, eh, input_precision=PRECISION)
    bias += tl.dot(rw, ew, input_precision=PRECISION)
    return bias


@triton.jit
def onehot_drel(drh, drw, ds, kly, klx, KH_P: tl.constexpr, KW_P: tl.constexpr, PRECISION: tl.constexpr):
    """Accumulate ``d rel_h``, ``d rel_w`` of a tile through the one-hot codes (two dots)."""
    eh = (kly[:, None] == tl.arange(0, KH_P)[None, :]).to(tl.float32)  # [BLOCK_N, KH_P]
    ew = (klx[:, None] == tl.arange(0, KW_P)[None, :]).to(tl.float32)
    drh += tl.dot(ds, eh, input_precision=PRECISION)
    drw += tl.dot(ds, ew, input_precision=PRECISION)
    return drh, drw


@triton.jit
def rel_h_column(REL, rel_rows, valid, ky):
    """``rel_h[:, ky]`` of a query tile (fp32, one per query) as a vector load, so it arrives in the layout of
    the logits' rows (a reduction or a [rows, cols] tile here would need a layout conversion through shared
    memory per key tile, which makes ptxas serialize the wgmma loop, C7515). 16-bit tables are read as the
    4-byte word holding ``ky`` and its neighbour (2-byte gathers would defeat cp.async) and the half taken."""
    if REL.dtype.element_ty.primitive_bitwidth == 16:
        word = (REL + rel_rows + (ky - ky % 2)).to(tl.pointer_type(tl.int32), bitcast=True)
        w = tl.load(word, mask=valid, other=0)
        half = tl.where(ky % 2 == 0, w, w >> 16) & 0xFFFF
        col = half.to(tl.int16).to(REL.dtype.element_ty, bitcast=True)
    else:
        col = tl.load(REL + rel_rows + ky, mask=valid, other=0.0)
    return col.to(tl.float32)


@triton.jit
def row_bias(REL, rel_rows, valid, rw, ky):
    """Bias tile ``[BLOCK_M, BLOCK_N]`` (fp32) of the key tile that is grid row ``ky``: ``rel_h[:, ky]`` broadcast
    over the keys plus the caller's preloaded ``rel_w`` row tile ``rw``."""
    return rel_h_column(REL, rel_rows, valid, ky)[:, None] + rw.to(tl.float32)


@triton.jit
def tile_bias(REL, rel_rows, valid, rh, rw, kt, kly, klx, KH_P: tl.constexpr, KW_P: tl.constexpr,
              REL_ROWS: tl.constexpr, PRECISION: tl.constexpr):
    """Bias tile of (query tile, key tile ``kt``) for the forward and dQ loops: row-aligned when ``REL_ROWS``
    (key tile ``kt`` is grid row ``kt``), else by the one-hot dots."""
    if REL_ROWS:
        bias = row_bias(REL, rel_rows, valid, rw, kt)
    else:
        bias = onehot_bias(rh, rw, kly, klx, KH_P, KW_P, PRECISION)
    return bias


@triton.jit
def row_bias_t(REL, rel_rows, valid, ky, KH_P: tl.constexpr, BLOCK_N: tl.constexpr):
    """``row_bias`` transposed, ``[BLOCK_N, BLOCK_M]`` (keys x queries), for the transposed dK/dV loop: its query
    tiles change every step, so ``rel_w`` is read here, already transposed."""
    on = tl.arange(0, BLOCK_N)
    bw = tl.load(REL + rel_rows[None, :] + KH_P + on[:, None], mask=valid[None, :], other=0.0)
    return rel_h_column(REL, rel_rows, valid, ky)[None, :] + bw.to(tl.float32)


@triton.jit
def row_drel(drh, drw, ds, ky, KH_P: tl.constexpr):
    """Accumulate ``d rel_h``, ``d rel_w`` of the key tile that is grid row ``ky``: ``d rel_h[:, ky]`` gains the
    row sums of ``ds``, ``d rel_w`` gains ``ds`` itself (exact fp32, where the dots rounded ``ds`` to tf32)."""
    drh += tl.where(tl.arange(0, KH_P)[None, :] == ky, tl.sum(ds, 1)[:, None], 0.0)
    drw += ds
    return drh, drw
