"""The FlexAttention backend: ``torch.nn.attention.flex_attention`` with winpos's position terms as a ``score_mod``
and its masks as a ``block_mask``.

How each term maps onto FlexAttention (every mapping exact, no approximation):

- Window grouping: windows become the batch dimension (``(B * windows, heads, n, D)``, as in the SDPA reference),
  so a window block is a batch of small global attentions and needs no mask at all. A block mask over the whole
  grid would cut windows of 49 / 196 tokens into partial 128-token blocks and evaluate the mask in each.
- RoPE: q and k are rotated on the grid before the call (``winpos.posemb.rope.rope_on_grid``).
- Relpos (decomposed): the per-query terms ``rel_h (G, heads, Nq, kh)`` and ``rel_w (G, heads, Nq, kw)`` are
  computed once outside; the ``score_mod`` adds ``rel_h[b, h, q, k // kw] + rel_w[b, h, q, k % kw]``.
- LookHere: the distance penalty ``-slope[h] * |key - query|`` is a ``score_mod`` (fp32, like the reference's
  bias); the per-head fields of view are a ``mask_mod`` (integer half-plane tests on doubled coordinates, so the
  half-token offsets of pooled queries stay exact), which becomes the block mask: key blocks no query of a block
  sees are skipped.
- ``pad_mode="mask"``: the padding mask (valid queries do not see padded keys) is a ``mask_mod`` too.

Block masks are cached per (groups, heads, grids, padding, device) in a ``winpos.cache.GridCache`` under the
fingerprint of LookHere's ``fov`` buffer (its one invalidation rule). The FlexAttention call is compiled once per
compile backend (``COMPILE_BACKEND``, default inductor) with ``fullgraph=True, dynamic=False``; the compiler keeps
one graph per input shape, dtype, device and set of terms, so a repeated call of the same shape neither rebuilds
its block mask nor recompiles. Inside a model that ``torch.compile`` is already tracing, the call is traced
inline instead.

Limits (of PyTorch, checked with a ``WinposError``): FlexAttention has no backward on CPU, so on CPU this backend
is for inference; train on CPU with the reference, or on CUDA. ``backend="auto"`` never picks it: on CPU the
reference is faster (one ViTDet-B global relpos block at 1024^2, forward, 2 threads: 0.36 s vs 1.47 s), and on
CUDA the Triton kernels compute the same terms per tile.
"""
from __future__ import annotations

import functools
import os
from collections import Counter

import torch

from winpos.attention.geometry import Geometry, from_groups, geometry, padding_mask, to_groups
from winpos.attention.terms import PositionTerms
from winpos.cache import GridCache
from winpos.errors import WinposError
from winpos.posemb.relpos import rel_terms
from winpos.posemb.rope import rope_on_grid

__all__ = ["BUILDS", "COMPILE_BACKEND", "block_mask", "chunked_block_mask", "compiled_flex", "flex_attention",
           "flex_available", "mask_mod_for", "score_mod_for"]

# The torch.compile backend of the FlexAttention call ("inductor" generates the fused kernel; "aot_eager" traces
# the same graph without code generation, for tests). Read at every call; ``compiled_flex`` keeps one compiled
# callable per backend.
COMPILE_BACKEND = os.environ.get("WINPOS_FLEX_COMPILE_BACKEND", "inductor")

# Graphs the compiled FlexAttention call may keep (one per shape and set of terms) before a new shape fails loudly.
RECOMPILE_LIMIT = 64

# Block masks built so far, by terms kind ("lookhere", "pad", "lookhere+pad"): what the caching tests count.
BUILDS: Counter = Counter()

_BLOCK_MASKS = GridCache(8)


def flex_available() -> bool:
    """Whether this PyTorch has ``torch.nn.attention.flex_attention``."""
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def _check(q, k, v, pos=None) -> None:
    """What FlexAttention cannot do is refused here, in one line, before torch is called (its own errors are
    inductor traces of 80-260 lines)."""
    if not flex_available():
        raise WinposError(f"backend='flex' needs torch.nn.attention.flex_attention, which torch {torch.__version__} "
                          "lacks; upgrade torch (>= 2.5) or use backend='reference'")
    if q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise WinposError(f"backend='flex' takes float32, float16 or bfloat16 q/k/v, got {q.dtype} (PyTorch's "
                          "FlexAttention compiles no other dtype); use backend='reference' for it, or cast the "
                          "model (model.float())")
    tables = [t for t in (getattr(pos, "rel_pos", None) or ()) if isinstance(t, torch.Tensor)]
    trained = [name for name, ts in (("q/k/v", (q, k, v)), ("the relpos tables", tables))
               if any(t.requires_grad for t in ts)]
    if q.device.type == "cpu" and torch.is_grad_enabled() and trained:
        raise WinposError(f"backend='flex' on CPU is inference only: PyTorch's FlexAttention has no CPU backward "
                          f"(here {' and '.join(trained)} need gradients); use backend='reference' (or 'auto') to "
                          "train on CPU, run under torch.no_grad(), or move the model to CUDA")


def _lookhere_mask_mod(fov2, q_hw, k_hw):
    """``mask_mod`` of LookHere's fields of view: head h sees key k from query q iff ``a*dx + b*dy >= 0`` for both
    of its half-plane rows ``(a, b)``. Coordinates doubled, so pooled queries (at ``s*i + (s-1)/2``) stay
    integers and every test is exact."""
    (_, qw), (_, kw) = q_hw, k_hw
    s = kw // qw

    def mask_mod(b, h, qi, ki):
        dy2 = 2 * (ki // kw) - (2 * s * (qi // qw) + s - 1)
        dx2 = 2 * (ki % kw) - (2 * s * (qi % qw) + s - 1)
        first = fov2[h, 0, 0] * dx2 + fov2[h, 0, 1] * dy2 >= 0
        second = fov2[h, 1, 0] * dx2 + fov2[h, 1, 1] * dy2 >= 0
        return first & second

    return mask_mod


def _pad_mask_mod(pad, groups):
    """``mask_mod`` of ``pad_mode="mask"``: ``pad (groups, 1, Nq, Nk)`` bool, True = attend; batch b is window
    ``b % groups`` of image ``b // groups`` (``winpos.windows.window_partition``'s order)."""

    def mask_mod(b, h, qi, ki):
        return pad[b % groups, 0, qi, ki]

    return mask_mod


def _both(first, second):
    def mask_mod(b, h, qi, ki):
        return first(b, h, qi, ki) & second(b, h, qi, ki)

    return mask_mod


def mask_mod_for(lookhere, pad, geo: Geometry, device):
    """The ``mask_mod`` of LookHere's fields of view and / or the padding mask ``pad (groups, 1, Nq, Nk)``."""
    mods = []
    if lookhere is not None:
        mods.append(_lookhere_mask_mod(lookhere.fov.to(device=device, dtype=torch.int32), geo.q_window, geo.k_window))
    if pad is not None:
        mods.append(_pad_mask_mod(pad, pad.shape[0]))
    return mods[0] if len(mods) == 1 else _both(*mods)


BLOCK = 128  # FlexAttention's default tile, in queries and keys


def chunked_block_mask(mask_mod, batch: int, heads: int, n_q: int, n_k: int, device, block: int = BLOCK):
    """``create_block_mask(mask_mod, batch, heads, n_q, n_k)`` built one row of query blocks at a time.

    PyTorch's builder evaluates ``mask_mod`` over the whole ``(batch, heads, n_q, n_k)`` grid at once, with int64
    intermediates of that size: 8 GiB each for ViTDet-B's 12 heads at 1536^2 (9216 tokens), which ends the process
    on a 24 GiB machine. Here at most ``batch * heads * block * n_k`` entries are live. A key block is full where
    every entry of its complete ``block x block`` tile is True (a tile cut by the sequence end is never full: its
    masked-off tail is applied by ``mask_mod`` in the kernel, as in PyTorch's builder), partial where some are.
    """
    from torch.nn.attention.flex_attention import BlockMask

    nqb, nkb = -(-n_q // block), -(-n_k // block)
    partial = torch.zeros(batch, heads, nqb, nkb, dtype=torch.bool, device=device)
    full = torch.zeros_like(partial)
    b = torch.arange(batch, device=device).view(-1, 1, 1, 1)
    h = torch.arange(heads, device=device).view(1, -1, 1, 1)
    ki = torch.arange(n_k, device=device).view(1, 1, 1, -1)
    k_complete = torch.arange(nkb, device=device) < n_k // block
    for i in range(nqb):
        qi = torch.arange(i * block, min((i + 1) * block, n_q), device=device).view(1, 1, -1, 1)
        m = mask_mod(b, h, qi, ki).expand(batch, heads, qi.shape[2], n_k)
        m = torch.nn.functional.pad(m, (0, nkb * block - n_k)).view(batch, heads, qi.shape[2], nkb, block)
        seen, every = m.any(dim=(2, 4)), m.all(dim=(2, 4)) & k_complete & (qi.shape[2] == block)
        full[:, :, i], partial[:, :, i] = every, seen & ~every

    def sparse(dense):  # (B, H, q blocks, k blocks) bool -> per row: count, indices of the True blocks first
        order = torch.argsort(dense.to(torch.int8), dim=-1, descending=True, stable=True)
        return dense.sum(-1, dtype=torch.int32), order.to(torch.int32)

    return BlockMask.from_kv_blocks(*sparse(partial), *sparse(full), BLOCK_SIZE=block, mask_mod=mask_mod,
                                    seq_lengths=(n_q, n_k))


def block_mask(lookhere, geo: Geometry, batch: int, heads: int, q_hw, k_hw, valid_hw, pad_mode, device):
    """The ``BlockMask`` of LookHere's fields of view and / or the padding mask, or None when neither applies.

    Cached (``winpos.cache.GridCache``) under the grids, the batch of groups, the padding and the device, and the
    fingerprint of LookHere's ``fov`` buffer."""
    pad = padding_mask(geo, q_hw, k_hw, valid_hw, device) if pad_mode == "mask" and valid_hw else None
    if lookhere is None and pad is None:
        return None
    n_q, n_k = geo.q_window[0] * geo.q_window[1], geo.k_window[0] * geo.k_window[1]
    kind = "+".join(name for name, on in (("lookhere", lookhere is not None), ("pad", pad is not None)) if on)

    def build():
        BUILDS[kind] += 1
        return chunked_block_mask(mask_mod_for(lookhere, pad, geo, device), batch if pad is not None else 1,
                                  heads if lookhere is not None else 1, n_q, n_k, device)

    key = ("flex", kind, batch, heads, geo, tuple(q_hw), tuple(k_hw), tuple(valid_hw or ()), str(device))
    sources = (lookhere.fov,) if lookhere is not None else ()
    return _BLOCK_MASKS.get(key, build, *sources)


def score_mod_for(rel_h, rel_w, slopes, q_window, k_window):
    """The ``score_mod`` adding decomposed relpos (``rel_h (G, heads, Nq, kh)``, ``rel_w (G, heads, Nq, kw)``) and
    LookHere's distance penalty (``slopes (heads,)`` fp32) to the scaled logits, or None when neither is given.

    Written with tensor indexing only, so it is also evaluated densely on broadcast index grids (the tests do)."""
    if rel_h is None and slopes is None:
        return None
    (_, qw), (_, kw) = q_window, k_window
    s = kw // qw

    def score_mod(score, b, h, qi, ki):
        ky, kx = ki // kw, ki % kw
        if rel_h is not None:
            score = score + rel_h[b, h, qi, ky] + rel_w[b, h, qi, kx]
        if slopes is not None:
            dy = (2 * ky - (2 * s * (qi // qw) + s - 1)).to(torch.float32) * 0.5
            dx = (2 * kx - (2 * s * (qi % qw) + s - 1)).to(torch.float32) * 0.5
            score = score + (-slopes[h] * torch.hypot(dx, dy)).to(score.dtype)
        return score

    return score_mod


def _flex_call(q, k, v, mask, scale: float, rel_h, rel_w, slopes, q_window, k_window):
    """One FlexAttention call on grouped ``(G, heads, n, D)`` tensors; relpos terms and LookHere slopes (or None)
    are read by the ``score_mod``."""
    from torch.nn.attention.flex_attention import flex_attention as flex

    score_mod = score_mod_for(rel_h, rel_w, slopes, q_window, k_window)
    return flex(q, k, v, score_mod=score_mod, block_mask=mask, scale=scale)


@functools.lru_cache(maxsize=None)
def compiled_flex(backend: str):
    """``_flex_call`` compiled with ``backend`` (one callable per backend; the compiler keeps a graph per shape)."""
    return torch.compile(_flex_call, backend=backend, fullgraph=True, dynamic=False)


def flex_attention(q, k, v, *, window=None, pos: PositionTerms | None = None, valid_hw=None, pad_mode="zeros",
                   scale=None):
    """Window or global attention through FlexAttention; the arguments of ``winpos.attention.attention``."""
    _check(q, k, v, pos)
    pos = pos or PositionTerms()
    q_hw, k_hw = tuple(q.shape[1:3]), tuple(k.shape[1:3])
    geo = geometry(q_hw, k_hw, window)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if pos.rope is not None:
        q, k = rope_on_grid(q, k, pos.rope, geo.q_window, geo.k_window)
    qg, kg, vg = to_groups(q, geo, "q"), to_groups(k, geo, "k"), to_groups(v, geo, "k")
    heads = qg.shape[1]
    lookhere = pos.lookhere
    if lookhere is not None and getattr(lookhere, "num_heads", heads) != heads:
        raise WinposError(f"LookHere was built for {lookhere.num_heads} heads but attention has {heads}; build it "
                          f"with num_heads={heads}")
    mask = block_mask(lookhere, geo, qg.shape[0], heads, q_hw, k_hw, valid_hw, pad_mode, q.device)
    rel_h = rel_w = None
    if pos.rel_pos is not None:
        rel_h, rel_w = rel_terms(qg, *pos.rel_pos, geo.q_window, geo.k_window)
    slopes = lookhere.slopes.to(device=q.device, dtype=torch.float32) if lookhere is not None else None
    args = (qg, kg, vg, mask, scale, rel_h, rel_w, slopes, geo.q_window, geo.k_window)
    if torch.compiler.is_compiling():
        return from_groups(_flex_call(*args), geo, q_hw)
    # One graph per shape and set of terms: a whole backbone has one per block kind and stage (HieraDet-B+ at
    # 1024^2: about a dozen), past dynamo's default limit of 8 graphs per code object.
    with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
        out = compiled_flex(COMPILE_BACKEND)(*args)
    return from_groups(out, geo, q_hw)
