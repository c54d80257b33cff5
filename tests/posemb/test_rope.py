"""winpos.posemb.rope against timm (``timm.layers.pos_embed_sincos``) and independent float64 references."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from timm.layers import pos_embed_sincos as timm_rope  # oracle: a missing timm must fail, not skip

from winpos.posemb.rope import (
    RoPE,
    RopeTables,
    apply_rope,
    init_mixed_frequencies,
    query_key_coords,
    rope_rot_dims,
)

KINDS = ["axial", "mixed"]
GRIDS = [(1, 1), (3, 5), (5, 3), (8, 8), (7, 12), (14, 14), (16, 9)]


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _timm_layout(t: torch.Tensor, pairing: str) -> torch.Tensor:
    """Our (..., R/2) per-slot table in timm's (..., R) layout."""
    return t.repeat_interleave(2, -1) if pairing == "interleaved" else torch.cat([t, t], -1)


def _ref_angles(coords: torch.Tensor, rot_dims: int, base: float, axis_order: str) -> torch.Tensor:
    """Independent float64 axial angles (N, R/2) from the paper's formula w_i = base^(-i/(R/4))."""
    n = rot_dims // 4
    w = torch.tensor([base ** (-i / n) for i in range(n)], dtype=torch.float64)
    c = coords.double()
    first, second = (c[:, 0], c[:, 1]) if axis_order == "yx" else (c[:, 1], c[:, 0])
    return torch.cat([first[:, None] * w, second[:, None] * w], dim=-1)


def _complex_pairs(x: torch.Tensor, rot_dims: int, pairing: str) -> torch.Tensor:
    if pairing == "interleaved":
        return torch.complex(x[..., 0:rot_dims:2], x[..., 1:rot_dims:2])
    return torch.complex(x[..., : rot_dims // 2], x[..., rot_dims // 2: rot_dims])


# ----------------------------------------------------------------------------------------------- timm parity
@pytest.mark.parametrize("hw", GRIDS)
@pytest.mark.parametrize("base", [100.0, 10000.0])
def test_axial_matches_timm_interleaved_ij(hw, base):
    head_dim, heads, R = 40, 3, 32
    rope = RoPE(head_dim, heads, fraction=0.8, base=base, pairing="interleaved", axis_order="yx")
    assert rope.rot_dims == R
    t = rope.tables(hw, hw)
    sin_ref, cos_ref = timm_rope.build_rotary_pos_embed(
        list(hw), dim=R, temperature=base, in_pixels=False, grid_indexing="ij")
    assert t.cos_k.dtype == torch.float32 and t.cos_k.shape == (hw[0] * hw[1], R // 2)
    assert (_timm_layout(t.cos_k, "interleaved") - cos_ref).abs().max() <= 1e-6
    assert (_timm_layout(t.sin_k, "interleaved") - sin_ref).abs().max() <= 1e-6

    # the module + apply path as timm's attention uses it (RotaryEmbeddingCat in bands mode, first R dims rotated)
    emb = timm_rope.RotaryEmbeddingCat(R, temperature=base, in_pixels=False, grid_indexing="ij").get_embed(list(hw))
    x = torch.randn(2, heads, hw[0] * hw[1], head_dim, generator=_gen())
    ref = torch.cat([timm_rope.apply_rot_embed_cat(x[..., :R], emb), x[..., R:]], -1)
    out = apply_rope(x, t.cos_q, t.sin_q, t.rot_dims, t.pairing)
    assert (out - ref).abs().max() <= 1e-6


@pytest.mark.parametrize("hw", [(3, 5), (6, 4)])
@pytest.mark.parametrize("axis_order,indexing", [("yx", "ij"), ("xy", "xy")])
@pytest.mark.parametrize("pairing", ["interleaved", "half"])
def test_axial_layouts_match_timm(hw, axis_order, indexing, pairing):
    R = 16
    t = RoPE(R, 2, fraction=1.0, base=100.0, pairing=pairing, axis_order=axis_order).tables(hw, hw)
    sin_ref, cos_ref = timm_rope.build_rotary_pos_embed(
        list(hw), dim=R, temperature=100.0, in_pixels=False, grid_indexing=indexing,
        rotate_half=(pairing == "half"))
    assert (_timm_layout(t.cos_k, pairing) - cos_ref).abs().max() <= 1e-6
    x = torch.randn(2, 2, hw[0] * hw[1], R, generator=_gen(1))
    ref = timm_rope.apply_rot_embed(x, sin_ref, cos_ref, half=(pairing == "half"))
    assert (apply_rope(x, t.cos_k, t.sin_k, R, pairing) - ref).abs().max() <= 1e-6


@pytest.mark.parametrize("hw,ref_hw", [((8, 8), (16, 16)), ((12, 6), (4, 4)), ((5, 7), (14, 10))])
def test_normalized_coords_match_timm_ref_feat_shape(hw, ref_hw):
    R = 16
    t = RoPE(R, 2, fraction=1.0, base=10000.0, pairing="interleaved", coords="normalized", ref_hw=ref_hw).tables(hw, hw)
    sin_ref, cos_ref = timm_rope.build_rotary_pos_embed(
        list(hw), dim=R, temperature=10000.0, in_pixels=False, grid_indexing="ij", ref_feat_shape=list(ref_hw))
    assert (_timm_layout(t.cos_k, "interleaved") - cos_ref).abs().max() <= 1e-6
    assert (_timm_layout(t.sin_k, "interleaved") - sin_ref).abs().max() <= 1e-6


@pytest.mark.parametrize("hw", [(1, 1), (4, 4), (3, 7), (9, 5)])
@pytest.mark.parametrize("indexing", ["xy", "ij"])
def test_mixed_matches_timm(hw, indexing):
    heads, R = 3, 16
    torch.manual_seed(0)
    ref = timm_rope.RotaryEmbeddingMixed(heads * R, depth=1, num_heads=heads, temperature=10.0, grid_indexing=indexing)
    rope = RoPE(R, heads, kind="mixed", fraction=1.0, shared_heads=False, pairing="interleaved")
    f = ref.freqs.detach()[:, 0]  # (2, heads, R/2): timm's f[0] multiplies its "t_x", which is the row under 'ij'
    f_y, f_x = (f[1], f[0]) if indexing == "xy" else (f[0], f[1])
    with torch.no_grad():
        rope.freqs.copy_(torch.stack([f_y, f_x]))
    emb = ref.get_embed(list(hw))[0]  # (heads, N, 2R)
    sin_ref, cos_ref = emb.chunk(2, -1)
    t = rope.tables(hw, hw)
    assert t.cos_k.shape == (heads, hw[0] * hw[1], R // 2) and t.cos_k.dtype == torch.float32
    assert (_timm_layout(t.cos_k, "interleaved") - cos_ref).abs().max() <= 1e-6
    assert (_timm_layout(t.sin_k, "interleaved") - sin_ref).abs().max() <= 1e-6
    x = torch.randn(2, heads, hw[0] * hw[1], R, generator=_gen(2))
    out = apply_rope(x, t.cos_q, t.sin_q, R, "interleaved")
    assert (out - timm_rope.apply_rot_embed_cat(x, emb)).abs().max() <= 1e-6


def test_mixed_init_matches_timm_draw():
    R, heads = 24, 4
    torch.manual_seed(123)
    ref = timm_rope.init_random_2d_freqs(R, 1, heads, temperature=10.0)[:, 0]  # (f_x, f_y)
    torch.manual_seed(123)
    ours = RoPE(R, heads, kind="mixed", fraction=1.0, shared_heads=False, axis_order="xy").freqs.detach()
    assert ours.shape == (2, heads, R // 2)
    torch.testing.assert_close(ours[0], ref[1], rtol=0, atol=1e-7)
    torch.testing.assert_close(ours[1], ref[0], rtol=0, atol=1e-7)
    assert RoPE(R, heads, kind="mixed", fraction=1.0).freqs.shape == (2, 1, R // 2)


@pytest.mark.parametrize("axis_order", ["yx", "xy"])
def test_mixed_without_rotation_is_axial(axis_order):
    R, hw = 16, (5, 6)
    mixed = RoPE(R, 2, kind="mixed", fraction=1.0, axis_order=axis_order, mixed_init_base=7.0)
    with torch.no_grad():
        mixed.freqs.copy_(init_mixed_frequencies(R, 1, 7.0, axis_order, rotate=False))
    axial = RoPE(R, 2, kind="axial", fraction=1.0, base=7.0, axis_order=axis_order)
    tm, ta = mixed.tables(hw, hw), axial.tables(hw, hw)
    torch.testing.assert_close(tm.cos_k, ta.cos_k, rtol=0, atol=1e-5)
    torch.testing.assert_close(tm.sin_k, ta.sin_k, rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------------------ layout properties
def test_axial_tables_match_float64_formula():
    hw, R = (6, 9), 32
    for axis_order in ("yx", "xy"):
        t = RoPE(64, 2, fraction=0.5, base=100.0, axis_order=axis_order).tables(hw, hw)
        _, grid = query_key_coords(hw, hw)
        ang = _ref_angles(grid, R, 100.0, axis_order)
        assert (t.cos_k.double() - ang.cos()).abs().max() <= 1e-6
        assert (t.sin_k.double() - ang.sin()).abs().max() <= 1e-6


def test_half_equals_interleaved_after_permuting_dims():
    D, R, N = 24, 16, 12
    perm = [*range(0, R, 2), *range(1, R, 2), *range(R, D)]  # interleaved pair (2j, 2j+1) -> half pair (j, j+R/2)
    t = RoPE(D, 2, fraction=0.75, pairing="half").tables((3, 4), (3, 4))
    assert t.rot_dims == R
    x = torch.randn(2, 2, N, D, generator=_gen(3))
    inter = apply_rope(x, t.cos_k, t.sin_k, R, "interleaved")
    half = apply_rope(x[..., perm], t.cos_k, t.sin_k, R, "half")
    assert torch.equal(inter[..., perm], half)
    assert not torch.allclose(inter, apply_rope(x, t.cos_k, t.sin_k, R, "half"))


@pytest.mark.parametrize("kind", ["axial", "mixed"])
@pytest.mark.parametrize("pairing", ["interleaved", "half"])
def test_logits_depend_only_on_offset(kind, pairing):
    H, W, heads, D = 4, 5, 2, 16
    torch.manual_seed(4)
    rope = RoPE(D, heads, kind=kind, fraction=1.0, base=10.0, shared_heads=kind == "axial", pairing=pairing)
    t = rope.tables((H, W), (H, W))
    g = _gen(5)
    q = torch.randn(1, heads, 1, D, generator=g).expand(1, heads, H * W, D)  # one vector at every position
    k = torch.randn(1, heads, 1, D, generator=g).expand(1, heads, H * W, D)
    logits = apply_rope(q, t.cos_q, t.sin_q, D, pairing) @ apply_rope(k, t.cos_k, t.sin_k, D, pairing).mT
    by_offset = {}
    for i in range(H * W):
        for j in range(H * W):
            by_offset.setdefault((j // W - i // W, j % W - i % W), []).append(logits[0, :, i, j])
    spreads = [(torch.stack(v).amax(0) - torch.stack(v).amin(0)).max() for v in by_offset.values()]
    assert max(spreads) <= 1e-4
    assert len(by_offset) == (2 * H - 1) * (2 * W - 1)
    assert torch.stack([v[0] for v in by_offset.values()]).std(0).min() > 1e-2  # and they do vary with offset


# ------------------------------------------------------------------------------------------- pooled queries
def test_pooled_query_coords_are_key_cell_centres():
    gq, gk = query_key_coords((2, 3), (4, 6))
    assert gq.tolist() == [[0.5, 0.5], [0.5, 2.5], [0.5, 4.5], [2.5, 0.5], [2.5, 2.5], [2.5, 4.5]]
    assert gk[:7].tolist() == [[0, 0], [0, 1], [0, 2], [0, 3], [0, 4], [0, 5], [1, 0]]
    gq, _ = query_key_coords((1, 2), (3, 6))
    assert gq.tolist() == [[1.0, 1.0], [1.0, 4.0]]
    # oracle: the centre is the mean of the key coordinates that the pooling window covers
    for q_hw, k_hw in [((2, 3), (4, 6)), ((3, 2), (9, 6)), ((4, 4), (4, 8))]:
        gq, gk = query_key_coords(q_hw, k_hw)
        maps = gk.T.reshape(1, 2, *k_hw)
        pooled = F.avg_pool2d(maps, (k_hw[0] // q_hw[0], k_hw[1] // q_hw[1]))
        torch.testing.assert_close(gq, pooled.reshape(2, -1).T, rtol=0, atol=0)
    gq, gk = query_key_coords((2, 2), (4, 4), ref_hw=(16, 16))
    assert gq[:, 0].tolist() == [2.0, 2.0, 10.0, 10.0] and gk[:, 1].tolist()[:4] == [0.0, 4.0, 8.0, 12.0]


@pytest.mark.parametrize("pairing", ["interleaved", "half"])
def test_pooled_logits_match_float64_reference(pairing):
    q_hw, k_hw, D, R = (2, 3), (4, 6), 24, 16
    rope = RoPE(D, 2, fraction=0.7, base=100.0, pairing=pairing)
    t = rope.tables(q_hw, k_hw)
    assert t.cos_q.shape == (6, R // 2) and t.cos_k.shape == (24, R // 2)
    # reference coordinates written out here: keys at integers, each pooled query at the centre of its 2x2 cell
    gk = torch.tensor([[y, x] for y in range(4) for x in range(6)], dtype=torch.float64)
    gq = torch.tensor([[2 * i + 0.5, 2 * j + 0.5] for i in range(2) for j in range(3)], dtype=torch.float64)
    g = _gen(6)
    q, k = torch.randn(1, 2, 6, D, generator=g), torch.randn(1, 2, 24, D, generator=g)
    logits = apply_rope(q, t.cos_q, t.sin_q, R, pairing) @ apply_rope(k, t.cos_k, t.sin_k, R, pairing).mT
    # float64: sum_j Re(q_j conj(k_j) e^{i(theta_q - theta_k)}) + unrotated dims
    dtheta = _ref_angles(gq, R, 100.0, "yx")[:, None] - _ref_angles(gk, R, 100.0, "yx")[None]  # (Nq, Nk, R/2)
    qc, kc = _complex_pairs(q.double(), R, pairing), _complex_pairs(k.double(), R, pairing)
    ref = (qc[..., :, None, :] * kc[..., None, :, :].conj() * torch.exp(1j * dtheta)).real.sum(-1)
    ref = ref + q.double()[..., R:] @ k.double()[..., R:].mT
    assert (logits.double() - ref).abs().max() <= 1e-5


# ------------------------------------------------------------------------------------ fraction and norms
def test_rot_dims_from_fraction():
    cases = [(64, 0.5), (64, 0.3), (72, 0.25), (64, 1.0), (6, 1.0), (40, 0.3), (200, 0.58)]
    # 0.58 * 200 = 115.99999999999999 in floats: still 116
    assert [rope_rot_dims(hd, f) for hd, f in cases] == [32, 16, 16, 64, 4, 12, 116]


def test_dims_beyond_rot_dims_pass_through():
    rope = RoPE(32, 2, fraction=0.3)
    assert rope.rot_dims == 8
    t = rope.tables((3, 3), (3, 3))
    x = torch.randn(2, 2, 9, 32, generator=_gen(7))
    out = apply_rope(x, t.cos_q, t.sin_q, t.rot_dims, t.pairing)
    assert torch.equal(out[..., 8:], x[..., 8:])
    assert (out[..., :8] - x[..., :8]).abs().max() > 1e-2


@settings(max_examples=25, deadline=None)
@given(h=st.integers(1, 9), w=st.integers(1, 9), stride=st.sampled_from([1, 2, 3]),
       kind=st.sampled_from(KINDS),
       pairing=st.sampled_from(["half", "interleaved"]), fraction=st.sampled_from([0.25, 0.5, 1.0]),
       seed=st.integers(0, 2**16))
def test_rotation_preserves_norms(h, w, stride, kind, pairing, fraction, seed):
    D, heads = 16, 2
    torch.manual_seed(seed)
    rope = RoPE(D, heads, kind=kind, fraction=fraction, shared_heads=kind == "axial", pairing=pairing)
    t = rope.tables((h, w), (h * stride, w * stride))
    R = t.rot_dims
    for x, cos, sin in [(torch.randn(2, heads, h * w, D), t.cos_q, t.sin_q),
                        (torch.randn(2, heads, h * w * stride * stride, D), t.cos_k, t.sin_k)]:
        out = apply_rope(x, cos, sin, R, pairing)
        torch.testing.assert_close(_complex_pairs(out, R, pairing).abs(), _complex_pairs(x, R, pairing).abs(),
                                   rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------------------------- dtypes
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", KINDS)
def test_low_precision_inputs(dtype, kind):
    rope = RoPE(32, 2, kind=kind, fraction=0.5, shared_heads=kind == "axial")
    t = rope.tables((8, 8), (8, 8))
    x32 = torch.randn(2, 2, 64, 32, generator=_gen(8))
    x = x32.to(dtype)
    out = apply_rope(x, t.cos_q, t.sin_q, t.rot_dims, t.pairing)
    assert out.dtype == dtype
    assert torch.equal(out, apply_rope(x.float(), t.cos_q, t.sin_q, t.rot_dims, t.pairing).to(dtype))
    eps = torch.finfo(dtype).eps
    ref = apply_rope(x32, t.cos_q, t.sin_q, t.rot_dims, t.pairing)
    assert (out.float() - ref).abs().max() <= 2 * eps * x32.abs().max()


def test_tables_stay_float32_after_module_cast():
    axial = RoPE(16, 2).to(torch.bfloat16)
    assert axial.inv_freq.dtype == torch.float32
    assert axial.tables((4, 4), (4, 4)).cos_k.dtype == torch.float32
    mixed = RoPE(16, 2, kind="mixed").half()
    assert mixed.tables((2, 2), (4, 4)).cos_q.dtype == torch.float32


# ------------------------------------------------------------------------------------------ autograd, cache
@pytest.mark.parametrize("pairing", ["interleaved", "half"])
def test_apply_rope_gradcheck(pairing):
    g = _gen(9)
    x = torch.randn(1, 2, 6, 8, generator=g, dtype=torch.float64, requires_grad=True)
    ang = torch.randn(2, 6, 3, generator=g, dtype=torch.float64)
    cos, sin = ang.cos().requires_grad_(), ang.sin().requires_grad_()
    assert torch.autograd.gradcheck(lambda a, c, s: apply_rope(a, c, s, 6, pairing), (x, cos, sin))


class _RotateQK(torch.nn.Module):
    def __init__(self, rope, q_hw, k_hw):
        super().__init__()
        self.rope, self.q_hw, self.k_hw = rope, q_hw, k_hw

    def forward(self, q, k):
        t = self.rope.tables(self.q_hw, self.k_hw)
        return apply_rope(q, t.cos_q, t.sin_q, t.rot_dims, t.pairing), apply_rope(k, t.cos_k, t.sin_k, t.rot_dims,
                                                                                  t.pairing)


@pytest.mark.parametrize("shared", [True, False])
def test_mixed_freqs_gradcheck(shared):
    rope = RoPE(8, 2, kind="mixed", fraction=1.0, shared_heads=shared, base=10.0).double()
    module = _RotateQK(rope, (1, 2), (2, 4))
    g = _gen(10)
    q = torch.randn(1, 2, 2, 8, generator=g, dtype=torch.float64)
    k = torch.randn(1, 2, 8, 8, generator=g, dtype=torch.float64)
    freqs = rope.freqs.detach().clone().requires_grad_()
    fn = lambda f: torch.func.functional_call(module, {"rope.freqs": f}, (q, k))  # noqa: E731
    assert torch.autograd.gradcheck(fn, (freqs,))
    out_q, out_k = module(q, k)
    (out_q.sum() + out_k.sum()).backward()
    assert rope.freqs.grad is not None and rope.freqs.grad.abs().max() > 0


def test_axial_cache_and_inference_mode():
    rope = RoPE(16, 2)
    with torch.inference_mode():
        t1 = rope.tables((4, 4), (4, 4))
    t2 = rope.tables((4, 4), (4, 4))
    assert t1 is t2 and isinstance(t1, RopeTables) and t1.cos_q is t1.cos_k
    assert rope.tables((2, 2), (4, 4)) is not t1
    x = torch.randn(1, 2, 16, 16, requires_grad=True)
    apply_rope(x, t1.cos_q, t1.sin_q, t1.rot_dims, t1.pairing).square().sum().backward()  # no inference-tensor error
    assert x.grad is not None


def test_mixed_tables_follow_freqs():
    rope = RoPE(16, 2, kind="mixed", shared_heads=False)
    before = rope.tables((3, 3), (3, 3)).cos_k
    with torch.no_grad():
        rope.freqs.mul_(2.0)
    after = rope.tables((3, 3), (3, 3)).cos_k
    assert after.shape == (2, 9, 4) and not torch.allclose(before, after)
    assert rope.no_weight_decay() == {"freqs"}


# ------------------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("kwargs,fragment", [
    (dict(kind="sincos"), "'axial', 'mixed'"),
    (dict(pairing="pairs"), "'half', 'interleaved'"),
    (dict(axis_order="hw"), "'yx', 'xy'"),
    (dict(coords="pixel"), "'integer', 'normalized'"),
    (dict(fraction=0.0), "(0, 1]"),
    (dict(fraction=1.5), "(0, 1]"),
    (dict(head_dim=15), "even"),
    (dict(head_dim=6, fraction=0.5), "fewer than 4 dims"),
    (dict(shared_heads=False), "kind='mixed'"),
    (dict(coords="normalized"), "ref_hw=(H, W)"),
    (dict(ref_hw=(14, 14)), "only used with coords='normalized'"),
    (dict(base=0.0), "base"),
])
def test_bad_construction(kwargs, fragment):
    args = dict(head_dim=16, num_heads=2) | kwargs
    with pytest.raises(ValueError) as info:
        RoPE(**args)
    assert fragment in str(info.value)


@pytest.mark.parametrize("q_hw,k_hw,fragment", [
    ((3, 3), (4, 4), "integer stride"),
    ((2, 3), (4, 4), "integer stride"),
    ((4, 4), (2, 2), "larger than the key grid"),
])
def test_bad_grids(q_hw, k_hw, fragment):
    with pytest.raises(ValueError) as info:
        RoPE(16, 2).tables(q_hw, k_hw)
    assert fragment in str(info.value)


def test_bad_apply_inputs():
    t = RoPE(16, 2, fraction=0.5).tables((2, 2), (2, 2))  # R = 8, N = 4
    x = torch.randn(1, 2, 4, 16)
    cases = [
        ((x[0], t.cos_q, t.sin_q, 8, "half"), "(B, heads, N, head_dim)"),
        ((x, t.cos_q, t.sin_q, 32, "half"), "rot_dims=32"),
        ((x, t.cos_q, t.sin_q, 7, "half"), "positive even"),
        ((x, t.cos_q, t.sin_q, 8, "rotate"), "'half', 'interleaved'"),
        ((x[:, :, :3], t.cos_q, t.sin_q, 8, "half"), "do not fit"),
        ((x, t.cos_q, t.sin_q, 12, "half"), "do not fit"),
        ((x, t.cos_q.expand(3, 4, 4), t.sin_q.expand(3, 4, 4), 8, "half"), "heads=2"),
        ((x, t.cos_q, t.sin_q[:2], 8, "half"), "share a shape"),
    ]
    for args, fragment in cases:
        with pytest.raises(ValueError) as info:
            apply_rope(*args)
        assert fragment in str(info.value), (fragment, str(info.value))
