"""Launch configuration of the fused attention kernels: tile sizes (``default_blocks``), windows per program
(``default_pack``), warps and pipeline stages (``launch_options``: a heuristic from sm_90a register reports, or the
``TUNED`` table a GPU sweep fills through ``set_tuned``), and the cache of launch arguments that depends on them
(``STATIC``, emptied whenever the tuned table changes)."""
from typing import Optional


def pow2(n: int, floor: int = 16) -> int:
    """The smallest power of two >= n, and at least ``floor``."""
    return max(floor, 1 << (int(n) - 1).bit_length())


def default_blocks(head_dim: int, q_tokens: Optional[int] = None, k_tokens: Optional[int] = None,
                   relpos: bool = False) -> tuple[int, int]:
    """(block_m, block_n): 64 x 64 up to head_dim 64, 64 x 32 above (register pressure of 128-wide tiles), each
    shrunk to the attention group when it is smaller (``q_tokens`` / ``k_tokens``: tokens of one query / key
    window), so a 4x4 window runs 16 x 16 tiles instead of filling 6% of a 64 x 64 one; never below 16 (tl.dot).
    With relpos (one-hot bias dots) the query tile is never narrower than the key tile: the dQ pass of a 16 x 64
    tile (pooled queries, 4x4 on 8x8 keys) spills 260-680 B at any warp count on sm_90a, a 64 x 64 one nothing.
    Not autotuned: LookHere tile classes are cached per block shape; a GPU sweep fills ``TUNED`` instead."""
    bm, bn = (64, 64) if head_dim <= 64 else (64, 32)
    if q_tokens is not None:
        bm = min(bm, pow2(q_tokens))
    if k_tokens is not None:
        bn = min(bn, pow2(k_tokens))
    if relpos:
        bm = max(bm, bn)
    return bm, bn


def default_pack(head_dim: int, blocks: tuple[int, int], q_tokens: int, k_tokens: int, windows: int) -> int:
    """Windows per program: as many as fill the default tile (64 x 64, 64 x 32 above head_dim 64) when a query and a
    key window each fit one block (a 4x4 window's 16 x 16 tiles become one 64 x 64 tile of four windows: 4-warp
    programs that Hopper runs on wgmma instead of 2-warp 16-row mma.sync ones, four times fewer of them, three
    quarters of each product masked off), never more than the image has windows; 1 otherwise."""
    bm, bn = blocks
    if q_tokens > bm or k_tokens > bn or windows < 2:
        return 1
    cap_m, cap_n = default_blocks(head_dim)
    pack = 1
    while 2 * pack * bm <= cap_m and 2 * pack * bn <= cap_n and 2 * pack <= windows:
        pack *= 2
    return pack


# Tuned launch options from a GPU sweep (``winpos.bench.kernels --sweep``): (kernel, BLOCK_M, BLOCK_N, BLOCK_D,
# terms) -> {"num_warps": w, "num_stages": s}, kernel one of "fwd", "bwd"; BLOCK_M x BLOCK_N the kernel's tile (with
# packing, of all its windows); terms a sorted tuple of the position terms present ("lookhere", "rel", "rel_rows"
# for the row-aligned relpos path, "rope") and "pack" when the tile holds several windows. Entries override the
# heuristic of ``launch_options``. Empty until a sweep has run on the target GPU; ``set_tuned`` replaces it.
TUNED: dict = {}


def launch_key(args: dict, backward: bool) -> tuple:
    """The ``TUNED`` key of a launch's arguments."""
    present = dict(args, PACK=args.get("PACK", 1) > 1)
    terms = tuple(t for t, flag in (("lookhere", "HAS_LH"), ("pack", "PACK"), ("rel", "HAS_REL"),
                                    ("rel_rows", "REL_ROWS"), ("rope", "HAS_ROPE")) if present.get(flag))
    return ("bwd" if backward else "fwd", args["BLOCK_M"], args["BLOCK_N"], args["BLOCK_D"], terms)


SHARED_LIMIT = 232448  # bytes of shared memory one program may use on sm_90 (H100 / H200: 227 KB)


def shared_estimate(key: tuple, num_stages: int) -> int:
    """An upper estimate, in bytes, of the shared memory of the kernels under ``TUNED`` key ``key`` (the larger of
    the two backward kernels for ``"bwd"``) with ``num_stages`` pipeline stages and 16-bit inputs (the fast path),
    in units of one ``[max(BLOCK_M, BLOCK_N), BLOCK_D]`` 16-bit tile: two streamed tiles per stage (k and v; q and do
    in the dK/dV pass), one resident tile (q) forward and two backward, RoPE tables one more per stage, relpos rows
    and their one-hot operands 1.5 more per stage, and the per-row fp32 vectors. At 2 stages it bounds what every
    sm_90a compile of the launches allocates (``tests/kernels/test_aot_compile.py`` checks it: 20-115 KB, up to 98%
    of the estimate); ``set_tuned`` and the sweep refuse configurations over
    ``SHARED_LIMIT``, which would fail only at launch on the GPU (OutOfResources)."""
    kernel, bm, bn, bd, terms = key
    side = max(bm, bn)
    units = 2 * num_stages + (1 if kernel == "fwd" else 2)
    if "rope" in terms:
        units += num_stages
    if "rel" in terms:
        units += 1.5 * num_stages
    return int(units * side * bd * 2) + num_stages * side * 8 + 1024


def set_tuned(table: dict) -> None:
    """Replace the tuned launch options (the sweep hook) and forget every cached launch that used the old ones.
    Refuses malformed entries and options whose ``shared_estimate`` exceeds ``SHARED_LIMIT``."""
    for key, opts in table.items():
        if not (isinstance(key, tuple) and len(key) == 5 and key[0] in ("fwd", "bwd")):
            raise ValueError(f"tuned key {key!r} must be (kernel 'fwd'|'bwd', BLOCK_M, BLOCK_N, BLOCK_D, terms)")
        if set(opts) != {"num_warps", "num_stages"} or opts["num_warps"] not in (1, 2, 4, 8, 16) \
                or not 1 <= opts["num_stages"] <= 6:
            raise ValueError(f"tuned options {opts!r} for {key} must be num_warps in 1..16 (a power of two) and "
                             "num_stages in 1..6")
        need = shared_estimate(key, opts["num_stages"])
        if need > SHARED_LIMIT:
            raise ValueError(f"tuned options {opts!r} for {key} need about {need} bytes of shared memory, over the "
                             f"{SHARED_LIMIT} an sm_90 program may use; use fewer stages or smaller tiles")
    TUNED.clear()
    TUNED.update(table)
    STATIC.clear()


def launch_options(args: dict, backward: bool) -> dict:
    """num_warps/num_stages: a ``TUNED`` entry when a GPU sweep has filled one, else the heuristic chosen from
    ptxas register reports for sm_90 (``tests/kernels/aot_compile.py``): 4 warps keep the plain kernels spill-free;
    the backward passes with position terms or 128-wide head tiles hold more live tiles (rotation tables, relpos
    terms and their gradients) and spill less with 8; tiles of fewer than 64 rows (small windows) need no more
    than 2 warps (one 16-row mma tile each), and 4 would idle half of them. The forward counts query rows; the
    two backward kernels share their options and count the larger tile side (the dK/dV of a 16 x 64 pooled
    transition owns 64 key rows and spills at 2 warps), and with 16-row query tiles they keep 4 warps even with
    position terms (at 8 the dK/dV of the 16 x 64 transition with RoPE or LookHere loses its 16-byte cp.async)."""
    tuned = TUNED.get(launch_key(args, backward))
    if tuned is not None:
        return dict(tuned)
    # Row-aligned relpos (REL_ROWS) holds no one-hot operands: at 8 warps ptxas serializes its backward wgmma
    # loops (C7515), at 4 it keeps them asynchronous without spills (sm_90a, ViTDet-B / Hiera-B+ global).
    heavy = args["HAS_ROPE"] or (args["HAS_REL"] and not args.get("REL_ROWS")) or args["HAS_LH"] \
        or args["BLOCK_D"] > 64
    rows = max(args["BLOCK_M"], args["BLOCK_N"]) if backward else args["BLOCK_M"]  # both backward kernels share them
    if rows < 64:
        return dict(num_warps=2, num_stages=2)
    # The fused-RoPE forward at 128-wide head tiles (head_dim 72..128) holds rotated q and k and their fp32
    # tables at twice the width: 4 warps spill (Hiera-L, 24 B at 255 registers), 8 do not (186 registers).
    wide_rope_fwd = not backward and args["HAS_ROPE"] and args["BLOCK_D"] > 64
    heavy_bwd = backward and heavy and args["BLOCK_M"] >= 64
    return dict(num_warps=8 if heavy_bwd or wide_rope_fwd else 4, num_stages=2)


# Launch signature -> the launches' non-tensor keyword arguments and grids. Everything they depend on is in the
# key (geometry, scale, dtype, shapes and strides of every tensor, which terms are present), so a hit skips the
# validation and argument building of ``attention_fwd_bwd._kernel_args``, the costliest host step after Triton's
# own binding.
STATIC: dict = {}
STATIC_MAX = 512



def remember(key, value):
    if len(STATIC) >= STATIC_MAX:
        STATIC.clear()
    STATIC[key] = value
    return value


__all__ = ["SHARED_LIMIT", "STATIC", "TUNED", "default_blocks", "default_pack", "launch_key", "launch_options",
           "pow2", "remember", "set_tuned", "shared_estimate"]
