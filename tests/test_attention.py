"""The attention entry point: relpos's training path (query blocks, backward by recomputation) vs materialized relpos
(float64, 1e-10, forward and every gradient, one block and many, with padding masks; gradcheck; bf16),
window/global geometry, pooled queries, padding modes, and input validation."""
import pytest
import torch
from hypothesis import given, strategies as st

from tests.conftest import require
from winpos.attention import PositionTerms, attention, dense_attention, reference_attention
from winpos.windows import pad_to_window, window_partition, window_unpartition


def _qkv(B, H, W, heads, D, stride=1, dtype=torch.float64, grad=True):
    q = torch.randn(B, H // stride, W // stride, heads, D, dtype=dtype, requires_grad=grad)
    k = torch.randn(B, H, W, heads, D, dtype=dtype, requires_grad=grad)
    v = torch.randn(B, H, W, heads, D, dtype=dtype, requires_grad=grad)
    return q, k, v


def _rel_tables(extent, D, dtype=torch.float64):
    return (torch.randn(2 * extent - 1, D, dtype=dtype, requires_grad=True),
            torch.randn(2 * extent - 1, D, dtype=dtype, requires_grad=True))


def _grads(out, tensors, seed=1):
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    return torch.autograd.grad(out, tensors, g)


@pytest.mark.parametrize("block_bytes", [None, 700])  # None: the default budget (one block here); 700: many blocks
@pytest.mark.parametrize("H,W,window,stride", [(14, 14, 7, 1), (12, 16, None, 1), (16, 16, 8, 2), (8, 12, None, 2),
                                               (28, 28, 14, 1)])
def test_relpos_training_path_equals_materialized_relpos_fwd_bwd(monkeypatch, H, W, window, stride, block_bytes):
    import winpos.attention.relpos_train as RT

    if block_bytes:
        monkeypatch.setattr(RT, "BLOCK_BYTES", block_bytes)
    q, k, v = _qkv(2, H, W, 3, 8, stride)
    extent = window or max(H, W)
    rh, rw = _rel_tables(extent, 8)
    pos = PositionTerms(rel_pos=(rh, rw))
    fast = reference_attention(q, k, v, window=window, pos=pos)
    slow = dense_attention(q, k, v, window=window, pos=pos)
    torch.testing.assert_close(fast, slow, rtol=0, atol=1e-10)
    for a, b in zip(_grads(fast, (q, k, v, rh, rw)), _grads(slow, (q, k, v, rh, rw))):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


@pytest.mark.parametrize("H,W,window,stride", [(13, 14, 8, 1), (10, 13, 7, 1), (12, 15, None, 1)])
def test_relpos_training_path_with_a_padding_mask_equals_materialized(monkeypatch, H, W, window, stride):
    import winpos.attention.relpos_train as RT

    monkeypatch.setattr(RT, "BLOCK_BYTES", 900)
    Hp, Wp = (-(-H // window) * window, -(-W // window) * window) if window else (H + 2, W + 1)
    q, k, v = _qkv(2, Hp, Wp, 3, 8, stride)
    rh, rw = _rel_tables(window or max(Hp, Wp), 8)
    kwargs = dict(window=window, pos=PositionTerms(rel_pos=(rh, rw)), valid_hw=(H, W), pad_mode="mask")
    fast = reference_attention(q, k, v, **kwargs)
    slow = dense_attention(q, k, v, **kwargs)
    valid = torch.zeros(fast.shape, dtype=torch.bool)
    valid[:, :H, :W] = True  # rows of padded queries are not outputs
    torch.testing.assert_close(fast[valid], slow[valid], rtol=0, atol=1e-10)
    g = torch.randn(fast.shape, generator=torch.Generator().manual_seed(3), dtype=fast.dtype) * valid
    for a, b in zip(torch.autograd.grad(fast, (q, k, v, rh, rw), g), torch.autograd.grad(slow, (q, k, v, rh, rw), g)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_relpos_training_function_passes_gradcheck(monkeypatch):
    import winpos.attention.relpos_train as RT

    monkeypatch.setattr(RT, "BLOCK_BYTES", 2 * 3 * 30 * 8 * 4)  # 4 query rows per block: 8 blocks
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 30, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    rh = torch.randn(2, 3, 30, 5, dtype=torch.float64, requires_grad=True)
    rw = torch.randn(2, 3, 30, 6, dtype=torch.float64, requires_grad=True)
    mask = torch.randn(1, 3, 30, 30, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda *t: RT.relpos_attention(*t, mask=mask, scale=0.4), (q, k, v, rh, rw))
    with pytest.raises(ValueError, match="5x6 key grid but k has 29 keys"):
        RT.relpos_attention(q, k[:, :, :29], v[:, :, :29], rh, rw)


def test_relpos_training_path_in_bf16_follows_float64():
    """Under bf16 the blocks' matmuls run in bf16 and dK / dV accumulate in float32: within bf16 rounding of the
    float64 result."""
    from winpos.attention.relpos_train import relpos_attention

    torch.manual_seed(0)
    ref = [torch.randn(1, 2, 64, 16, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    ref += [torch.randn(1, 2, 64, 8, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    low = [t.detach().bfloat16().requires_grad_() for t in ref]
    out64, out16 = relpos_attention(*ref), relpos_attention(*low)
    assert out16.dtype == torch.bfloat16
    g = torch.randn(out64.shape, dtype=torch.float64)
    torch.testing.assert_close(out16.double(), out64, rtol=0, atol=3e-2)
    for a, b in zip(torch.autograd.grad(out16, low, g.bfloat16()), torch.autograd.grad(out64, ref, g)):
        assert a.dtype == torch.bfloat16
        torch.testing.assert_close(a.double(), b, rtol=0, atol=6e-2 * b.abs().max().item())


@pytest.mark.parametrize("H,W,window,stride,pad_mode,with_lookhere", [
    (14, 14, 7, 1, "zeros", False), (12, 16, None, 1, "zeros", True), (16, 16, 8, 2, "mask", False),
    (10, 13, 7, 1, "mask", True)])
def test_inference_relpos_in_query_blocks_equals_materialized(monkeypatch, H, W, window, stride, pad_mode,
                                                              with_lookhere):
    """Without autograd, relpos goes to SDPA as a float mask built a block of queries at a time; force many
    blocks (a tiny byte budget) and compare with the materialized specification, incl. padding masks and
    LookHere."""
    import winpos.attention.reference as A
    from winpos.posemb.lookhere import LookHere

    calls = []
    chunked = A._blockwise
    monkeypatch.setattr(A, "_blockwise", lambda *a: calls.append(a[0].shape) or chunked(*a))
    monkeypatch.setattr(A, "RELPOS_CHUNK_BYTES", 4096)
    Hp, Wp = (-(-H // window) * window, -(-W // window) * window) if window else (H, W)
    q, k, v = _qkv(2, Hp, Wp, 3, 8, stride, grad=False)
    rh, rw = (t.detach() for t in _rel_tables(window or max(H, W), 8))
    pos = PositionTerms(rel_pos=(rh, rw), lookhere=LookHere(3).double() if with_lookhere else None)
    kwargs = dict(window=window, pos=pos, valid_hw=(H, W), pad_mode=pad_mode)
    with torch.no_grad():
        fast = reference_attention(q, k, v, **kwargs)
    slow = dense_attention(q, k, v, **kwargs)
    assert len(calls) == 1  # the inference path ran (and split its queries: see the budget)
    finite = torch.isfinite(slow)
    assert finite.any()
    torch.testing.assert_close(fast[finite], slow[finite], rtol=0, atol=1e-10)


def test_relpos_takes_the_lean_backward_path_when_autograd_needs_it(monkeypatch):
    import winpos.attention.reference as A

    monkeypatch.setattr(A, "_blockwise", lambda *a: pytest.fail("inference path used under autograd"))
    calls = []
    lean = A.relpos_attention
    monkeypatch.setattr(A, "relpos_attention", lambda *a, **kw: calls.append(a[0].shape) or lean(*a, **kw))
    q, k, v = _qkv(1, 8, 8, 2, 8)
    rh, rw = _rel_tables(4, 8)
    out = reference_attention(q, k, v, window=4, pos=PositionTerms(rel_pos=(rh, rw)))
    assert out.requires_grad and calls == [torch.Size([4, 2, 16, 8])]  # 4 windows of 16 tokens, 2 heads


@pytest.mark.parametrize("with_relpos", [False, True])
@pytest.mark.parametrize("H,W,window,stride", [(12, 16, None, 1), (16, 16, 8, 2)])
def test_lookhere_too_large_to_cache_is_built_by_query_blocks(monkeypatch, H, W, window, stride, with_relpos):
    """Above LOOKHERE_CACHE_BYTES the LookHere bias is never kept whole: built a block of queries at a time (with
    relpos too), forward and backward equal the materialized specification, and nothing is cached."""
    import winpos.attention.bias as B
    import winpos.attention.reference as A
    from winpos.posemb.lookhere import LookHere

    monkeypatch.setattr(B, "LOOKHERE_CACHE_BYTES", 0)
    monkeypatch.setattr(A, "RELPOS_CHUNK_BYTES", 4096)
    lookhere = LookHere(3).double()
    monkeypatch.setattr(lookhere, "bias", lambda *a: pytest.fail("the whole bias was built by the fast path"))
    q, k, v = _qkv(2, H, W, 3, 8, stride)
    rel = _rel_tables(window or max(H, W), 8) if with_relpos else None
    pos = PositionTerms(rel_pos=rel, lookhere=lookhere)
    fast = reference_attention(q, k, v, window=window, pos=pos)
    monkeypatch.undo()
    slow = dense_attention(q, k, v, window=window, pos=PositionTerms(rel_pos=rel, lookhere=lookhere))
    torch.testing.assert_close(fast, slow, rtol=0, atol=1e-10)
    inputs = (q, k, v, *(rel or ()))
    for a, b in zip(_grads(fast, inputs), _grads(slow, inputs)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    assert len(lookhere._bias_cache) == 1  # only the spec (dense_attention) built and cached it


def test_window_relpos_matches_detectron2_attention_block():
    """Oracle: detectron2's ``Attention`` (relpos, fused qkv) on partitioned windows, same weights."""
    vit = require("detectron2.modeling.backbone.vit")
    d2_attn = vit.Attention(dim=32, num_heads=4, qkv_bias=True, use_rel_pos=True, input_size=(7, 7)).double()
    with torch.no_grad():
        d2_attn.rel_pos_h.normal_()
        d2_attn.rel_pos_w.normal_()
    x = torch.randn(2, 14, 21, 32, dtype=torch.float64)
    windows = window_partition(x, 7).reshape(-1, 7, 7, 32)
    ref = window_unpartition(d2_attn(windows).flatten(1, 2), 7, (14, 21))
    qkv = d2_attn.qkv(x).reshape(2, 14, 21, 3, 4, 8)
    q, k, v = qkv.unbind(3)
    out = attention(q, k, v, window=7, pos=PositionTerms(rel_pos=(d2_attn.rel_pos_h, d2_attn.rel_pos_w)))
    ours = d2_attn.proj(out.flatten(-2))
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-10)


@given(h=st.integers(1, 4), w=st.integers(1, 4), win=st.sampled_from([2, 3, 4]), heads=st.integers(1, 3),
       glob=st.booleans())
def test_windows_equal_per_window_global_attention(h, w, win, heads, glob):
    """A windowed call equals independent global calls on each window (geometry is right for any grid)."""
    H, W = h * win, w * win
    q, k, v = _qkv(1, H, W, heads, 4, grad=False)
    out = attention(q, k, v, window=None if glob else win)
    if glob:
        ref = torch.softmax(torch.einsum("bnhd,bmhd->bhnm", q.flatten(1, 2), k.flatten(1, 2)) / 2.0, -1)
        ref = torch.einsum("bhnm,bmhd->bnhd", ref, v.flatten(1, 2)).reshape(out.shape)
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)
        return
    for y in range(0, H, win):
        for x in range(0, W, win):
            sl = (slice(None), slice(y, y + win), slice(x, x + win))
            torch.testing.assert_close(out[sl], attention(q[sl], k[sl], v[sl]), rtol=0, atol=1e-10)


def test_pad_mask_hides_padded_keys_from_valid_queries():
    x_valid = (5, 6)
    q, k, v = _qkv(1, 8, 8, 2, 4, grad=False)
    out_mask = attention(q, k, v, window=4, valid_hw=x_valid, pad_mode="mask")
    out_zero = attention(q, k, v, window=4, valid_hw=x_valid, pad_mode="zeros")
    # Changing padded keys must not change valid outputs under "mask", and must under "zeros".
    k2, v2 = k.clone(), v.clone()
    k2[:, 5:], v2[:, 5:] = 9.0, 9.0
    k2[:, :, 6:], v2[:, :, 6:] = -9.0, -9.0
    masked2 = attention(q, k2, v2, window=4, valid_hw=x_valid, pad_mode="mask")
    zero2 = attention(q, k2, v2, window=4, valid_hw=x_valid, pad_mode="zeros")
    torch.testing.assert_close(masked2[:, :5, :6], out_mask[:, :5, :6], rtol=0, atol=1e-12)
    assert (zero2[:, :5, :6] - out_zero[:, :5, :6]).abs().max() > 1e-3
    assert torch.isfinite(out_mask).all()
    dense = dense_attention(q, k, v, window=4, valid_hw=x_valid, pad_mode="mask")
    torch.testing.assert_close(out_mask, dense, rtol=0, atol=1e-10)


def test_pad_helper_round_trip():
    x = torch.randn(2, 10, 13, 3)
    xp, hw = pad_to_window(x, 7)
    assert xp.shape == (2, 14, 14, 3) and hw == (10, 13)
    assert torch.equal(xp[:, :10, :13], x) and xp[:, 10:].abs().sum() == 0
    assert torch.equal(window_unpartition(window_partition(xp, 7), 7, (14, 14)), xp)


def test_bad_inputs():
    q, k, v = _qkv(1, 8, 8, 2, 4, grad=False)
    with pytest.raises(ValueError, match="does not tile"):
        attention(q, k, v, window=3)
    with pytest.raises(ValueError, match="head dims differ"):
        attention(q, k[..., :2], v)
    with pytest.raises(ValueError, match="unknown attention backend"):
        attention(q, k, v, backend="flash")
    with pytest.raises(ValueError, match="unknown pad_mode"):
        attention(q, k, v, pad_mode="reflect")
    with pytest.raises(ValueError, match=r"\(B, H, W, heads, head_dim\)"):
        attention(q.flatten(1, 2), k, v)
    with pytest.raises(ValueError, match="head_dim"):
        attention(q, k, v, pos=PositionTerms(rel_pos=(torch.randn(15, 3, dtype=q.dtype), torch.randn(15, 3, dtype=q.dtype))))


@pytest.mark.parametrize("kind,pairing,shared", [("axial", "half", True), ("axial", "interleaved", True),
                                                 ("mixed", "half", False)])
@pytest.mark.parametrize("H,W,window,stride", [(16, 24, 8, 1), (16, 16, 8, 2), (10, 14, None, 1), (12, 12, None, 2)])
def test_rope_on_grid_equals_rotating_each_window(kind, pairing, shared, H, W, window, stride):
    """Independent check: rotate partitioned windows with ``apply_rope`` (tested against timm), then plain SDPA;
    with autograd and in inference."""
    from winpos.posemb.rope import RoPE, apply_rope

    heads, D = 2, 16
    rope = RoPE(D, heads, kind=kind, pairing=pairing, shared_heads=shared, fraction=0.5).double()
    q, k, v = _qkv(2, H, W, heads, D, stride)
    out = attention(q, k, v, window=window, pos=PositionTerms(rope=rope))
    qw = (window // stride) if window else None
    if window:
        qg = window_partition(q, qw).transpose(1, 2)
        kg, vg = (window_partition(t, window).transpose(1, 2) for t in (k, v))
        q_hw, k_hw = (qw, qw), (window, window)
    else:
        qg, kg, vg = (t.flatten(1, 2).transpose(1, 2) for t in (q, k, v))
        q_hw, k_hw = tuple(q.shape[1:3]), (H, W)
    t = rope.tables(q_hw, k_hw)
    qr = apply_rope(qg, t.cos_q, t.sin_q, t.rot_dims, t.pairing)
    kr = apply_rope(kg, t.cos_k, t.sin_k, t.rot_dims, t.pairing)
    ref = torch.softmax(qr @ kr.transpose(-1, -2) * D ** -0.5, -1) @ vg
    ref = ref.transpose(1, 2)
    ref = window_unpartition(ref, qw, tuple(q.shape[1:3])) if window else ref.reshape(out.shape)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)
    with torch.no_grad():  # inference rotates in place (mul + addcmul into one buffer): same answer
        torch.testing.assert_close(attention(q, k, v, window=window, pos=PositionTerms(rope=rope)), ref,
                                   rtol=0, atol=1e-10)
    params = (q, k, v) + tuple(rope.parameters())
    for a, b in zip(_grads(out, params), _grads(ref, params)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


@pytest.mark.parametrize("term", ["none", "lookhere", "relpos", "pad_mask"])
def test_every_position_term_keeps_sdpa_on_its_fused_kernel(term):
    """A 3-D float mask sends PyTorch's SDPA to the unfused math path (N x N per head, 2x slower at 1024 px);
    every term must reach the fused CPU kernel (flash attention for CPU) in inference."""
    from torch.profiler import ProfilerActivity, profile

    from winpos.posemb.lookhere import LookHere

    q, k, v = _qkv(1, 8, 8, 2, 16, dtype=torch.float32, grad=False)
    pos = {"none": PositionTerms(), "lookhere": PositionTerms(lookhere=LookHere(2)),
           "relpos": PositionTerms(rel_pos=tuple(t.detach().float() for t in _rel_tables(8, 16))),
           "pad_mask": PositionTerms()}[term]
    kwargs = dict(valid_hw=(7, 6), pad_mode="mask") if term == "pad_mask" else {}
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        reference_attention(q, k, v, pos=pos, **kwargs)
    ops = {e.key for e in prof.key_averages()}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in ops, sorted(ops)
    assert "aten::_scaled_dot_product_attention_math" not in ops


def test_inference_mask_buffer_is_reused_across_calls_and_never_leaks_stale_rows(monkeypatch):
    """CPU inference writes each relpos/LookHere mask block into one reused per-thread buffer: a second call with
    other inputs and another grid still equals the specification, the buffer is the same memory, and
    ``release_workspace`` frees it."""
    import winpos.attention.reference as A
    import winpos.attention.workspace as workspace

    monkeypatch.setattr(A, "RELPOS_CHUNK_BYTES", 8192)
    workspace.release_workspace()
    pointers = []
    for seed, (H, W) in [(0, (12, 16)), (1, (12, 16)), (2, (8, 8))]:
        torch.manual_seed(seed)
        q, k, v = _qkv(2, H, W, 3, 8, grad=False)
        rh, rw = (t.detach() for t in _rel_tables(max(H, W), 8))
        pos = PositionTerms(rel_pos=(rh, rw))
        with torch.no_grad():
            fast = reference_attention(q, k, v, pos=pos)
        torch.testing.assert_close(fast, dense_attention(q, k, v, pos=pos), rtol=0, atol=1e-10)
        pointers.append(workspace._WORKSPACE.buffers[torch.float64].data_ptr())
    assert pointers[0] == pointers[1] == pointers[2]
    workspace.release_workspace()
    assert not hasattr(workspace._WORKSPACE, "buffers")


@pytest.mark.parametrize("batch,with_relpos,pad", [(1, False, False), (2, False, False), (1, True, False),
                                                   (1, False, True)])
def test_lookhere_by_query_blocks_in_inference_equals_materialized(monkeypatch, batch, with_relpos, pad):
    """Inference, LookHere too large to cache: its rows go straight into the reused mask buffer (one group), are
    copied into it (several), or added to relpos / the padding mask; every way equals the specification."""
    import winpos.attention.bias as B
    import winpos.attention.reference as A
    from winpos.posemb.lookhere import LookHere

    monkeypatch.setattr(B, "LOOKHERE_CACHE_BYTES", 0)
    monkeypatch.setattr(A, "RELPOS_CHUNK_BYTES", 8192)
    lookhere = LookHere(3)
    q, k, v = _qkv(batch, 12, 16, 3, 8, dtype=torch.float32, grad=False)
    rel = tuple(t.detach().float() for t in _rel_tables(16, 8)) if with_relpos else None
    kwargs = dict(pos=PositionTerms(rel_pos=rel, lookhere=lookhere), valid_hw=(10, 13) if pad else None,
                  pad_mode="mask")
    with torch.no_grad():
        fast = reference_attention(q, k, v, **kwargs)
    assert len(lookhere._bias_cache) == 0  # never built whole
    slow = dense_attention(q, k, v, **kwargs)
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-5)
