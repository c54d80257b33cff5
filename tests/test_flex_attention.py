"""The FlexAttention backend (``winpos.attention.flex``) against the SDPA reference and the materialized
specification (``winpos.attention.reference_attention`` / ``dense_attention``): every position-term kind, window
and global blocks, pooled queries, both padding modes; its block masks and compiled call built once per shape.

The FlexAttention call is compiled with ``aot_eager`` here (the same traced graph as inductor, without code
generation). PyTorch's FlexAttention has no CPU backward, so on CPU the gradients of the backend's own
``score_mod`` / ``mask_mod`` are checked by evaluating them densely; FlexAttention's backward itself is checked
on CUDA only (that test says so)."""
import itertools

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import winpos.attention.flex as F
from winpos.attention import PositionTerms, attention, dense_attention, reference_attention, resolve_backend
from winpos.attention.geometry import from_groups, geometry, padding_mask, to_groups
from winpos.errors import WinposError
from winpos.posemb.lookhere import LookHere
from winpos.posemb.relpos import rel_terms
from winpos.posemb.rope import RoPE, rope_on_grid

pytestmark = pytest.mark.skipif(not F.flex_available(), reason="this torch has no FlexAttention")

HEADS, D = 4, 8
# The backend refuses float64 (PyTorch's FlexAttention compiles only 32- and 16-bit floats), so every flex call runs
# in float32 and is held to float32 rounding of the reference computed on the same inputs.
F32 = torch.float32
TOL = dict(rtol=0, atol=2e-6)


@pytest.fixture
def counter(monkeypatch):
    """Compile FlexAttention with a counting aot_eager backend; fresh block-mask cache and build counts."""
    cnt = CompileCounterWithBackend("aot_eager")
    monkeypatch.setattr(F, "COMPILE_BACKEND", cnt)
    F._BLOCK_MASKS.clear()
    F.BUILDS.clear()
    torch._dynamo.reset()
    yield cnt
    F.compiled_flex.cache_clear()


def _qkv(B, H, W, stride=1, dtype=torch.float64, grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H // stride, W // stride, HEADS, D, dtype=dtype, generator=g)
    k = torch.randn(B, H, W, HEADS, D, dtype=dtype, generator=g)
    v = torch.randn(B, H, W, HEADS, D, dtype=dtype, generator=g)
    return tuple(t.requires_grad_(grad) for t in (q, k, v))


def _terms(kind, extent, dtype=torch.float64, grad=False):
    g = torch.Generator().manual_seed(3)
    rel = tuple(torch.randn(2 * extent - 1, D, dtype=dtype, generator=g).mul_(0.5).requires_grad_(grad)
                for _ in range(2))
    parts = kind.split("+")
    lh = LookHere(HEADS, variant="45", layout="spread") if "lookhere" in parts else None
    rope = RoPE(D, HEADS).to(dtype) if "rope" in parts else None
    return PositionTerms(rope=rope, rel_pos=rel if "relpos" in parts else None, lookhere=lh)


CASES = [  # H, W, window, stride
    (8, 8, 4, 1),      # window blocks
    (6, 10, None, 1),  # global, non-square
    (8, 8, 4, 2),      # windows with pooled queries (Hiera q-pool)
    (8, 12, None, 2),  # global with pooled queries
]


@pytest.mark.parametrize("kind,H,W,window,stride", [(kind, *case) for kind in ("none", "rope", "relpos", "lookhere")
                                                    for case in CASES] + [("relpos+lookhere", 8, 8, 4, 2)])
def test_flex_equals_reference_and_dense(counter, kind, H, W, window, stride):
    q, k, v = _qkv(2, H, W, stride, dtype=F32)
    pos = _terms(kind, window or max(H, W), dtype=F32)
    with torch.no_grad():
        out = attention(q, k, v, window=window, pos=pos, backend="flex")
        ref = reference_attention(q, k, v, window=window, pos=pos)
        dense = dense_attention(q, k, v, window=window, pos=pos)
    torch.testing.assert_close(out, ref, **TOL)
    torch.testing.assert_close(out, dense, **TOL)
    assert counter.frame_count == 1


@pytest.mark.parametrize("kind,H,W,valid,window,stride", [
    ("none", 8, 8, (6, 7), 4, 1), ("lookhere", 8, 8, (6, 7), 4, 1), ("lookhere", 8, 12, (7, 9), None, 1),
    ("relpos", 8, 12, (7, 9), None, 1), ("lookhere", 8, 8, (5, 6), 4, 2), ("none", 8, 8, (5, 6), 4, 2)])
def test_flex_pad_modes_equal_reference(counter, kind, H, W, valid, window, stride):
    q, k, v = _qkv(2, H, W, stride, dtype=F32)
    pos = _terms(kind, window or max(H, W), dtype=F32)
    outs = {}
    for pad_mode in ("zeros", "mask", "mask"):  # the second masked call reuses the block mask
        with torch.no_grad():
            out = outs[pad_mode] = attention(q, k, v, window=window, pos=pos, valid_hw=valid, pad_mode=pad_mode,
                                             backend="flex")
            ref = reference_attention(q, k, v, window=window, pos=pos, valid_hw=valid, pad_mode=pad_mode)
        torch.testing.assert_close(out, ref, **TOL)
    assert not torch.allclose(outs["mask"], outs["zeros"]), "pad_mode='mask' changed nothing"
    assert F.BUILDS["lookhere+pad" if kind == "lookhere" else "pad"] == 1


def test_second_call_of_a_shape_neither_rebuilds_nor_recompiles(counter):
    q, k, v = _qkv(1, 8, 8, dtype=F32)
    pos = _terms("relpos+lookhere", 8, dtype=F32)
    with torch.no_grad():
        first = attention(q, k, v, pos=pos, backend="flex")
        assert (F.BUILDS["lookhere"], counter.frame_count) == (1, 1)
        q2, k2, v2 = _qkv(1, 8, 8, dtype=F32, seed=5)  # new values, same shape
        second = attention(q2, k2, v2, pos=pos, backend="flex")
        assert (F.BUILDS["lookhere"], counter.frame_count) == (1, 1), "a same-shape call rebuilt or recompiled"
        assert not torch.allclose(first, second)
        attention(*_qkv(1, 8, 12, dtype=F32), pos=PositionTerms(rel_pos=pos.rel_pos, lookhere=pos.lookhere), backend="flex")
        assert (F.BUILDS["lookhere"], counter.frame_count) == (2, 2), "a new shape must build and compile once"
        pos.lookhere.set_global_slope(4.0, slope_units="official")  # edits the fov/slopes buffers in place: the mask cache must see it
        third = attention(q, k, v, pos=pos, backend="flex")
        torch.testing.assert_close(third, reference_attention(q, k, v, pos=pos), **TOL)


@pytest.mark.parametrize("kind", ["lookhere", "lookhere+pad"])
@pytest.mark.parametrize("n, block", [(100, 16), (64, 16), (49, 8)])
def test_chunked_block_mask_equals_pytorchs_builder(kind, n, block):
    """The row-by-row builder against ``create_block_mask`` (PyTorch's own, dense): same full and partial blocks,
    same dense mask, grids that the tile divides and grids it does not (last block cut)."""
    from torch.nn.attention.flex_attention import create_block_mask

    side = int(n ** 0.5)
    lookhere = LookHere(HEADS, variant="45", layout="spread", layer_index=3, num_layers=6)
    geo = geometry((side, side), (side, side), None)
    pad = None
    batch = 1
    if kind == "lookhere+pad":
        pad = padding_mask(geo, (side, side), (side, side), (side - 2, side - 1), "cpu")
        pad = pad.expand(3, -1, -1, -1)
        batch = 3
    mod = F.mask_mod_for(lookhere, pad, geo, "cpu")
    n_q = n_k = side * side
    ours = F.chunked_block_mask(mod, batch, HEADS, n_q, n_k, "cpu", block=block)
    ref = create_block_mask(mod, batch, HEADS, n_q, n_k, device="cpu", BLOCK_SIZE=block)
    assert torch.equal(ours.to_dense(), ref.to_dense())
    assert torch.equal(ours.kv_num_blocks, ref.kv_num_blocks)
    assert torch.equal(ours.full_kv_num_blocks, ref.full_kv_num_blocks)
    for mine, theirs, count in ((ours.kv_indices, ref.kv_indices, ref.kv_num_blocks),
                                (ours.full_kv_indices, ref.full_kv_indices, ref.full_kv_num_blocks)):
        for idx in itertools.product(*map(range, count.shape)):
            c = int(count[idx])
            assert sorted(mine[idx][:c].tolist()) == sorted(theirs[idx][:c].tolist())
    assert int(ref.kv_num_blocks.sum()) > 0 and int(ref.full_kv_num_blocks.sum()) > 0  # both kinds exercised


def test_more_shapes_than_dynamos_default_limit_compile_once_each(counter):
    """A whole backbone calls FlexAttention at one shape per block kind and stage; dynamo's default of 8 graphs per
    code object would end the 9th shape with FailOnRecompileLimitHit (fullgraph)."""
    sides = range(3, 3 + 10)
    for side in sides:
        q, k, v = _qkv(1, side, side, dtype=F32)
        torch.testing.assert_close(attention(q, k, v, backend="flex"), reference_attention(q, k, v), **TOL)
    assert counter.frame_count == len(sides) > 8


def test_environment_forces_flex_and_auto_never_picks_it(monkeypatch):
    assert resolve_backend("auto", torch.device("cpu")) == "reference"
    monkeypatch.setenv("WINPOS_ATTENTION_BACKEND", "flex")
    assert resolve_backend("auto", torch.device("cpu")) == "flex"
    assert resolve_backend("reference", torch.device("cpu")) == "reference"


def test_cpu_backward_is_refused_with_the_fix():
    q, k, v = _qkv(1, 4, 4, dtype=F32, grad=True)
    with pytest.raises(WinposError, match="inference only.*backend='reference'"):
        attention(q, k, v, backend="flex")


def _dense_flex(q, k, v, window, pos, valid_hw=None, pad_mode="zeros"):
    """The backend's own score_mod and mask_mod evaluated on broadcast index grids (a materialized FlexAttention),
    differentiable on CPU."""
    geo = geometry(q.shape[1:3], k.shape[1:3], window)
    if pos.rope is not None:
        q, k = rope_on_grid(q, k, pos.rope, geo.q_window, geo.k_window)
    qg, kg, vg = to_groups(q, geo, "q"), to_groups(k, geo, "k"), to_groups(v, geo, "k")
    G, heads, n_q, n_k = *qg.shape[:3], kg.shape[2]
    b, h = torch.arange(G)[:, None, None, None], torch.arange(heads)[None, :, None, None]
    qi, ki = torch.arange(n_q)[None, None, :, None], torch.arange(n_k)[None, None, None, :]
    scores = (qg @ kg.transpose(-1, -2)) * D ** -0.5
    rel = rel_terms(qg, *pos.rel_pos, geo.q_window, geo.k_window) if pos.rel_pos is not None else (None, None)
    slopes = pos.lookhere.slopes if pos.lookhere is not None else None
    mod = F.score_mod_for(*rel, slopes, geo.q_window, geo.k_window)
    if mod is not None:
        scores = mod(scores, b, h, qi, ki)
    pad = padding_mask(geo, q.shape[1:3], k.shape[1:3], valid_hw, q.device) if pad_mode == "mask" else None
    if pos.lookhere is not None or pad is not None:
        scores = scores.masked_fill(~F.mask_mod_for(pos.lookhere, pad, geo, q.device)(b, h, qi, ki), float("-inf"))
    return from_groups(scores.softmax(-1) @ vg, geo, q.shape[1:3])


@pytest.mark.parametrize("kind", ["relpos", "lookhere", "relpos+lookhere", "rope"])
@pytest.mark.parametrize("H,W,window,stride", [(8, 8, 4, 1), (8, 12, None, 2)])
def test_score_and_mask_mods_have_the_reference_gradients(kind, H, W, window, stride):
    q, k, v = _qkv(2, H, W, stride, grad=True)
    pos = _terms(kind, window or max(H, W), grad=True)
    leaves = [q, k, v, *(pos.rel_pos or ())]
    mine, ref = _dense_flex(q, k, v, window, pos), reference_attention(q, k, v, window=window, pos=pos)
    torch.testing.assert_close(mine, ref, rtol=0, atol=1e-10)
    g = torch.randn(ref.shape, dtype=ref.dtype, generator=torch.Generator().manual_seed(1))
    for a, b in zip(torch.autograd.grad(mine, leaves, g), torch.autograd.grad(ref, leaves, g)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_padding_mask_mod_has_the_reference_gradients():
    q, k, v = _qkv(2, 8, 8, grad=True)
    pos = _terms("relpos+lookhere", 4, grad=True)
    leaves = [q, k, v, *pos.rel_pos]
    mine = _dense_flex(q, k, v, 4, pos, valid_hw=(6, 7), pad_mode="mask")
    ref = reference_attention(q, k, v, window=4, pos=pos, valid_hw=(6, 7), pad_mode="mask")
    torch.testing.assert_close(mine, ref, rtol=0, atol=1e-10)
    for a, b in zip(torch.autograd.grad(mine.sum(), leaves), torch.autograd.grad(ref.sum(), leaves)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU-only: PyTorch's FlexAttention backward needs CUDA")
@pytest.mark.parametrize("kind", ["none", "rope", "relpos", "lookhere"])
@pytest.mark.parametrize("H,W,window,stride", CASES)
def test_flex_forward_and_backward_on_cuda_equal_reference(kind, H, W, window, stride):
    q, k, v = (t.detach().cuda().float().requires_grad_() for t in _qkv(2, H, W, stride))
    pos = _terms(kind, window or max(H, W), dtype=torch.float32, grad=True)
    pos = PositionTerms(rope=pos.rope.cuda() if pos.rope is not None else None,
                        rel_pos=tuple(t.detach().cuda().requires_grad_() for t in pos.rel_pos) if pos.rel_pos else None,
                        lookhere=pos.lookhere.cuda() if pos.lookhere is not None else None)
    leaves = [q, k, v, *(pos.rel_pos or ())]
    out = attention(q, k, v, window=window, pos=pos, backend="flex")
    ref = reference_attention(q, k, v, window=window, pos=pos)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    g = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(out, leaves, g), torch.autograd.grad(ref, leaves, g)):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)
