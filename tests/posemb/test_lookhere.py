"""LookHere masks, slopes and tile classes vs an oracle written here, not imported from winpos: the paper's
definition, per pair. A key is visible to a query if it is the query itself or the angle of (dx, -dy) (math
convention, y up) lies in the head's angular sector, boundary rays included; the value is -m(l, h) * hypot(dx, dy).
Sectors follow the paper's 12-head order (4 + 4 directed heads, 4 undirected last); other head counts use winpos's
spread layout. Parity with the authors' bias builder is tested in ``test_lookhere_official.py``.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from winpos.posemb.lookhere import (
    VARIANTS,
    LookHere,
    fov_tile_classes,
    grid_coords,
    head_fields_of_view,
    head_slopes,
    lookhere_bias,
)

# Angular sectors [start, end] in degrees (counter-clockwise from +x, up = 90) of the 8 directed heads, in
# the paper's 12-head order.
SECTORS = {
    # up, down, left, right half-planes; then half-planes facing NE, NW, SE, SW
    "180": [(0, 180), (180, 360), (90, 270), (-90, 90), (-45, 135), (45, 225), (-135, 45), (135, 315)],
    # quadrants NW, NE, SW, SE; then 90-degree cones around up, down, left, right
    "90": [(90, 180), (0, 90), (180, 270), (270, 360), (45, 135), (225, 315), (135, 225), (-45, 45)],
    # wedges N->NW, S->SW, W->NW, E->NE, N->NE, S->SE, W->SW, E->SE
    "45": [(90, 135), (225, 270), (135, 180), (0, 45), (45, 90), (270, 315), (180, 225), (315, 360)],
}
# Specified order in which fewer than 8 leftover directed heads pick sectors (indices into SECTORS).
SPREAD = {"180": [0, 1, 2, 3, 4, 7, 5, 6], "90": [0, 3, 1, 2, 4, 5, 6, 7], "45": [0, 5, 3, 6, 4, 1, 2, 7]}
LIMITS = {"180": 1 / 2, "90": 3 / 4, "45": 7 / 8}


def expected_sectors(num_heads, variant):
    """Sector per head (None = undirected) under the documented rule: max(1, H // 3) undirected heads last."""
    n_und = max(1, num_heads // 3)
    n_dir = num_heads - n_und
    picks = list(range(8)) * (n_dir // 8) + SPREAD[variant][: n_dir % 8]
    return [SECTORS[variant][i] for i in picks] + [None] * n_und


def expected_slopes(num_heads, variant, layer, num_layers, s_g=1.0):
    s_l = 1.5 if num_layers == 1 else 1.5 + (0.5 - 1.5) * layer / (num_layers - 1)
    out, k = [], 0
    for sector in expected_sectors(num_heads, variant):
        if sector is None:
            out.append(s_g * s_l * 0.5 / 4**k)  # 1/2, 1/8, 1/32, 1/128, ...
            k += 1
        else:
            out.append(s_g * s_l)
    return out


def sees(sector, dx, dy):
    if (dx == 0 and dy == 0) or sector is None:
        return True
    theta = math.degrees(math.atan2(-dy, dx))
    start, end = sector
    d = (theta - start) % 360.0
    eps = 1e-7  # lattice directions off a boundary ray are > 1 degree away from it on these grids
    return d <= (end - start) + eps or d >= 360.0 - eps


def oracle_bias(sectors, slopes, q_pts, k_pts):
    """Per-pair Python evaluation -> (H, Nq, Nk) float64 tensor with -inf for masked pairs."""
    memo = {}
    out = []
    for sector, m in zip(sectors, slopes):
        rows = []
        for qy, qx in q_pts:
            row = []
            for ky, kx in k_pts:
                dx, dy = kx - qx, ky - qy
                key = (id(sector), dx, dy)
                if key not in memo:
                    memo[key] = sees(sector, dx, dy)
                row.append(-m * math.hypot(dx, dy) if memo[key] else -math.inf)
            rows.append(row)
        out.append(rows)
    return torch.tensor(out, dtype=torch.float64)


def grid_points(h, w, stride=1):
    off = (stride - 1) / 2
    return [(stride * i + off, stride * j + off) for i in range(h) for j in range(w)]


def assert_bias_matches(actual, expected):
    assert actual.dtype == torch.float32 and actual.shape == expected.shape
    masked = torch.isinf(expected)
    assert torch.equal(torch.isneginf(actual), masked), f"{int((torch.isneginf(actual) != masked).sum())} mask errors"
    torch.testing.assert_close(actual[~masked].double(), expected[~masked], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("hw", [(5, 5), (7, 11), (11, 7), (14, 14)])
def test_bias_matches_paper_definition_12_heads(variant, hw):
    layer, depth = 3, 12
    sectors = expected_sectors(12, variant)
    assert sectors[:8] == SECTORS[variant] and sectors[8:] == [None] * 4  # the paper's layout
    slopes = expected_slopes(12, variant, layer, depth)
    q, k = grid_coords(hw, hw)
    actual = lookhere_bias(head_fields_of_view(12, variant), head_slopes(12, variant, layer, depth), q, k)
    assert_bias_matches(actual, oracle_bias(sectors, slopes, grid_points(*hw), grid_points(*hw)))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("num_heads", [1, 2, 4, 6, 16])
def test_spread_layout_matches_its_definition(variant, num_heads):
    """layout='spread' (winpos's own layout, also the default for head counts the authors' code does not lay out),
    with a global slope in paper units."""
    hw = (5, 6)
    sectors = expected_sectors(num_heads, variant)
    slopes = expected_slopes(num_heads, variant, 0, 1, s_g=0.75)
    module = LookHere(num_heads, variant, layer_index=0, num_layers=1, global_slope=0.75, slope_units="paper",
                      layout="spread")
    expected = oracle_bias(sectors, slopes, grid_points(*hw), grid_points(*hw))
    assert_bias_matches(module.bias(hw, hw), expected)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("q_hw,k_hw,stride", [((3, 4), (6, 8), 2), ((2, 3), (6, 9), 3), ((1, 5), (2, 10), 2)])
def test_pooled_queries_match_definition(variant, q_hw, k_hw, stride):
    q, k = grid_coords(q_hw, k_hw)
    assert torch.equal(q, torch.tensor(grid_points(*q_hw, stride), dtype=torch.float32))
    assert torch.equal(k, torch.tensor(grid_points(*k_hw), dtype=torch.float32))
    actual = lookhere_bias(head_fields_of_view(12, variant), head_slopes(12, variant, 11, 12), q, k)
    expected = oracle_bias(expected_sectors(12, variant), expected_slopes(12, variant, 11, 12),
                           grid_points(*q_hw, stride), grid_points(*k_hw))
    assert_bias_matches(actual, expected)
    assert torch.isfinite(actual).any(-1).all()  # a pooled query still sees one of its source keys


def test_grid_coords_layout():
    q, k = grid_coords((2, 3), (4, 6))
    assert q.dtype == k.dtype == torch.float32 and q.shape == (6, 2) and k.shape == (24, 2)
    assert q[:3].tolist() == [[0.5, 0.5], [0.5, 2.5], [0.5, 4.5]]  # row-major, cell centres
    assert k[7].tolist() == [1.0, 1.0]
    q1, k1 = grid_coords((3, 5), (3, 5))
    assert torch.equal(q1, k1)


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_head_sees_itself(variant):
    bias = LookHere(12, variant).bias((7, 9), (7, 9))
    assert torch.all(bias.diagonal(dim1=1, dim2=2) == 0)


def test_lh45_wedges_tile_the_plane():
    bias = LookHere(12, "45").bias((9, 9), (9, 9))
    visible = torch.isfinite(bias[:8])  # the 8 directed heads
    assert visible.any(0).all()  # union of the wedges is every pair
    # Off the axes and diagonals exactly one wedge sees a key; boundary rays are shared by two.
    q, k = grid_coords((9, 9), (9, 9))
    dy = k[None, :, 0] - q[:, None, 0]
    dx = k[None, :, 1] - q[:, None, 1]
    on_ray = (dx == 0) | (dy == 0) | (dx.abs() == dy.abs())
    count = visible.sum(0)
    assert torch.all(count[~on_ray] == 1)
    assert torch.all(count[on_ray & ((dx != 0) | (dy != 0))] == 2)


@pytest.mark.parametrize("variant", VARIANTS)
def test_masked_fraction_approaches_limit(variant):
    """Directed heads mask ~0.47 / 0.72 / 0.84 of a 14x14 grid and ~0.49 / 0.74 / 0.87 of a 64x64 grid, tending to
    1/2, 3/4, 7/8 (the paper's "up to 7/8 for a 45-degree view")."""
    fov = head_fields_of_view(12, variant)[:8]
    slopes = torch.ones(8)

    def masked_fraction(side):
        # The mask depends only on the offset (dx, dy), and offset (dx, dy) occurs for
        # (side - |dx|) * (side - |dy|) query/key pairs: one query at the centre of a (2*side-1)^2 key grid
        # gives the exact fraction for the full side x side grid.
        _, k = grid_coords((2 * side - 1, 2 * side - 1), (2 * side - 1, 2 * side - 1))
        centre = torch.tensor([[side - 1.0, side - 1.0]])
        masked = torch.isneginf(lookhere_bias(fov, slopes, centre, k))[:, 0]  # (8, (2*side-1)^2)
        pairs = ((side - (k - centre).abs()).prod(-1))
        return float((masked * pairs).sum() / (8 * side**4))

    f14, f64 = masked_fraction(14), masked_fraction(64)
    limit = LIMITS[variant]
    assert abs(f14 - {"180": 0.47, "90": 0.72, "45": 0.84}[variant]) < 0.01  # 14x14
    assert abs(f64 - {"180": 0.49, "90": 0.74, "45": 0.87}[variant]) < 0.005  # 64x64
    assert limit - 0.01 < f64 <= limit
    assert limit - f64 < limit - f14  # boundary rays weigh less on a larger grid


def test_slopes_paper_values():
    for variant in VARIANTS:
        first, last = head_slopes(12, variant, 0, 12), head_slopes(12, variant, 11, 12)
        assert first.dtype == torch.float32 and first.shape == (12,)
        undirected = torch.tensor([1 / 2, 1 / 8, 1 / 32, 1 / 128])
        torch.testing.assert_close(first, torch.cat([torch.full((8,), 1.5), 1.5 * undirected]), rtol=0, atol=0)
        torch.testing.assert_close(last, torch.cat([torch.full((8,), 0.5), 0.5 * undirected]), rtol=0, atol=0)
        middle = head_slopes(12, variant, 5, 12, global_slope=0.6, slope_units="paper")
        torch.testing.assert_close(middle[0], torch.tensor(0.6 * (1.5 - 5 / 11)))
        official = head_slopes(12, variant, 5, 12, global_slope=1.2, slope_units="official")
        assert torch.equal(official, middle)  # the authors' units are twice the paper's
    # A first-layer directed head adds -19.5 logits at distance 13 (1.5 per token).
    bias = LookHere(12, "180", 0, 12).bias((1, 14), (1, 14))
    assert bias[0, 0, 13].item() == pytest.approx(-19.5)
    torch.testing.assert_close(head_slopes(3, "90", 0, 1), torch.tensor([1.5, 1.5, 0.75]))


def tile_any_all(visible, block_q, block_k):
    """visible: bool (..., Nq, Nk) -> (any, all) over each tile's present pairs, (..., nQ, nK)."""
    nq, nk = visible.shape[-2:]
    pad = (0, -nk % block_k, 0, -nq % block_q)  # rows/cols past the end are absent
    present = torch.nn.functional.pad(torch.ones(nq, nk, dtype=torch.uint8), pad).bool()
    padded = torch.nn.functional.pad(visible.to(torch.uint8), pad).bool()

    def tiles(t):  # (..., nQ*bq, nK*bk) -> (..., nQ, nK, bq*bk)
        t = t.unflatten(-2, (-1, block_q)).unflatten(-1, (-1, block_k))
        return t.transpose(-3, -2).flatten(-2)

    return tiles(padded).any(-1), (tiles(padded) | ~tiles(present)).all(-1)


def brute_force_classes(bias, block_q, block_k):
    any_, all_ = tile_any_all(torch.isfinite(bias), block_q, block_k)
    return torch.where(all_, 1, torch.where(any_, 2, 0)).to(torch.int8)


def interval_test_misses(fov, q, k, classes, block_q, block_k):
    """Tiles that are empty although each half-plane alone is satisfied by some pair there."""
    dy = k[None, :, 0] - q[:, None, 0]
    dx = k[None, :, 1] - q[:, None, 1]
    ab = fov.float()[..., None, None]  # (H, 2, 2, 1, 1)
    any0, _ = tile_any_all(ab[:, 0, 0] * dx + ab[:, 0, 1] * dy >= 0, block_q, block_k)
    any1, _ = tile_any_all(ab[:, 1, 0] * dx + ab[:, 1, 1] * dy >= 0, block_q, block_k)
    two = (fov != 0).any(-1).all(-1)[:, None, None]
    return int(((classes == 0) & any0 & any1 & two).sum())


@pytest.mark.parametrize("variant", VARIANTS)
def test_tile_classes_exact(variant):
    module = LookHere(12, variant)
    misses = 0
    cases = [((14, 14), (14, 14)), ((7, 11), (7, 11)), ((11, 7), (11, 7)), ((1, 37), (1, 37)),
             ((5, 7), (10, 14)), ((20, 20), (20, 20))]
    for q_hw, k_hw in cases:
        bias = module.bias(q_hw, k_hw)
        q, k = grid_coords(q_hw, k_hw)
        for block_q, block_k in [(16, 16), (32, 32), (16, 32), (32, 16), (7, 5)]:
            classes = module.tile_classes(q_hw, k_hw, block_q, block_k)
            assert classes.dtype == torch.int8
            assert torch.equal(classes, brute_force_classes(bias, block_q, block_k)), (q_hw, block_q, block_k)
            if (block_q, block_k) == (16, 16):
                misses += interval_test_misses(module.fov, q, k, classes, block_q, block_k)
    if variant != "180":  # two-constraint FOVs: the exact search must have been needed somewhere
        assert misses > 0


def test_tile_classes_arbitrary_token_order():
    """fov_tile_classes takes coordinates in storage order, e.g. a shuffled grid."""
    fov = head_fields_of_view(12, "45")
    q, k = grid_coords((9, 10), (9, 10))
    perm = torch.randperm(q.shape[0], generator=torch.Generator().manual_seed(0))
    bias = lookhere_bias(fov, torch.ones(12), q[perm], k[perm])
    assert torch.equal(fov_tile_classes(fov, q[perm], k[perm], 16, 8), brute_force_classes(bias, 16, 8))


def test_caching():
    module = LookHere(8, "90", layer_index=2, num_layers=6)
    a = module.bias((6, 6), (6, 6))
    assert module.bias((6, 6), (6, 6)) is a
    b = module.bias((4, 8), (4, 8))
    assert b is not a and b.shape == (8, 32, 32)
    assert module.bias([4, 8], (4, 8)) is b
    t = module.tile_classes((6, 6), (6, 6), 16, 16)
    assert module.tile_classes((6, 6), (6, 6), 16, 16) is t
    assert module.tile_classes((6, 6), (6, 6), 8, 16) is not t
    module.set_global_slope(0.5, slope_units="official")  # a quarter of the default 2.0; keeps the masks
    assert module.tile_classes((6, 6), (6, 6), 16, 16) is t
    c = module.bias((4, 8), (4, 8))
    assert c is not b
    finite = torch.isfinite(b)
    assert torch.equal(finite, torch.isfinite(c))
    torch.testing.assert_close(c[finite], 0.25 * b[finite])
    assert module.state_dict() == {}  # fixed buffers follow from the config; checkpoints need not carry them


@settings(max_examples=30, deadline=None)
@given(h=st.integers(1, 12), w=st.integers(1, 12), num_heads=st.integers(1, 16), variant=st.sampled_from(VARIANTS),
       stride=st.sampled_from([1, 2, 3]))
def test_property_self_visibility(h, w, num_heads, variant, stride):
    module = LookHere(num_heads, variant, layer_index=num_heads % 4, num_layers=4)
    bias = module.bias((h, w), (stride * h, stride * w))
    assert bias.shape == (num_heads, h * w, stride * stride * h * w)
    assert torch.isfinite(bias).any(-1).all()  # no all-masked row, so softmax stays defined
    if stride == 1:
        diagonal = bias.diagonal(dim1=1, dim2=2)
        assert torch.all(diagonal == 0)
    undirected = (module.fov == 0).all(-1).all(-1)
    assert undirected[-1] and torch.isfinite(bias[undirected]).all()  # undirected heads come last, see everything


def test_bad_input():
    with pytest.raises(ValueError, match="not a LookHere variant"):
        LookHere(12, "30")
    with pytest.raises(ValueError, match="not a LookHere variant"):
        head_fields_of_view(12, 45)
    with pytest.raises(ValueError, match="num_heads"):
        LookHere(0)
    with pytest.raises(ValueError, match="out of range"):
        LookHere(12, "45", layer_index=12, num_layers=12)
    with pytest.raises(ValueError, match="out of range"):
        head_slopes(12, "45", -1, 12)
    with pytest.raises(ValueError, match="num_layers"):
        head_slopes(12, "45", 0, 0)
    with pytest.raises(ValueError, match="global_slope"):
        head_slopes(12, "45", 0, 12, global_slope=-1.0)
    with pytest.raises(ValueError, match="integer stride"):
        grid_coords((3, 3), (7, 7))
    with pytest.raises(ValueError, match="integer stride"):
        grid_coords((2, 3), (4, 9))
    with pytest.raises(ValueError, match="positive integers"):
        grid_coords((0, 3), (0, 3))
    with pytest.raises(ValueError, match="block_q"):
        LookHere(4).tile_classes((4, 4), (4, 4), 0, 16)
    q, k = grid_coords((2, 2), (2, 2))
    with pytest.raises(ValueError, match="slopes"):
        lookhere_bias(head_fields_of_view(4, "90"), torch.ones(3), q, k)
    with pytest.raises(ValueError, match=r"\(N, 2\)"):
        lookhere_bias(head_fields_of_view(4, "90"), torch.ones(4), q[:, :1], k)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("q_hw,k_hw", [((5, 7), (5, 7)), ((9, 4), (9, 4)), ((3, 4), (6, 8))])
def test_bias_rows_equal_the_dense_bias_exactly(monkeypatch, variant, q_hw, k_hw):
    """Unpooled grids copy rows out of the cached displacement table, pooled ones compute them: both equal the
    dense bias bit for bit, for row ranges that start and stop inside grid rows, with and without ``out``."""
    import winpos.posemb.lookhere as L

    module = LookHere(12, variant, layer_index=1, num_layers=4)
    q, k = grid_coords(q_hw, k_hw)
    dense = lookhere_bias(module.fov, module.slopes, q, k)
    n = q.shape[0]
    for start, stop in [(0, n), (3, min(n, 17)), (n - 5, n), (6, 7)]:
        rows = module.bias_rows(q_hw, k_hw, start, stop)
        assert torch.equal(rows, dense[:, start:stop]), (start, stop)
        out = torch.full_like(rows, 7.0)
        assert module.bias_rows(q_hw, k_hw, start, stop, out=out) is out and torch.equal(out, rows)
    assert len(module._shift_cache) == (q_hw == k_hw)
    monkeypatch.setattr(L, "SHIFT_TABLE_BYTES", 0)  # too large to cache: computed directly, same rows
    module._shift_cache.clear()
    assert torch.equal(module.bias_rows(q_hw, k_hw, 2, 9), dense[:, 2:9]) and len(module._shift_cache) == 0


def test_bias_rows_follow_a_new_global_slope():
    module = LookHere(12, "45")
    before = module.bias_rows((6, 6), (6, 6), 0, 36)
    module.set_global_slope(0.5, slope_units="paper")
    after = module.bias_rows((6, 6), (6, 6), 0, 36)
    finite = torch.isfinite(before)
    torch.testing.assert_close(after[finite], 0.5 * before[finite])
    with pytest.raises(ValueError, match="out has shape"):
        module.bias_rows((6, 6), (6, 6), 0, 36, out=torch.empty(12, 35, 36))
    with pytest.raises(ValueError, match="not a nonempty range inside the 36 queries"):
        module.bias_rows((6, 6), (6, 6), 30, 40)
