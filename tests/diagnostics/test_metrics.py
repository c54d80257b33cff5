"""Window-similarity metrics against brute-force loops written here, and a table of synthetic values.

The synthetic rows (``test_periodic_*`` below) come from an independent numpy re-implementation of PyTorch's bicubic (a=-0.75, align_corners=False)
with random Gaussian maps of C=64; the random rows are averaged over 8 seeds here so that the ±0.02 tolerance
tests the definition, not one draw (one draw of C=64 varies by about ±0.007).
"""

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from winpos.diagnostics.metrics import (abswin_embed, abswin_parts_from_grid, naive_resize, offset_similarity_map,
                                        period_scan, periodic_energy_ratio, window_similarity,
                                        window_similarity_matrix)
from winpos.diagnostics.report import verdict

TOL = 0.02


# ---- independent references -------------------------------------------------------------------------------------

def ref_tiles(E, w, centred=False):
    E = E.double()
    if centred:
        E = E - E.mean(dim=(1, 2), keepdim=True)
    return [E[:, i * w:(i + 1) * w, j * w:(j + 1) * w].flatten()
            for i in range(E.shape[1] // w) for j in range(E.shape[2] // w)]


def ref_ws(E, w, centred=False):
    t = ref_tiles(E, w, centred)
    cos = [F.cosine_similarity(a, b, dim=0, eps=1e-300).item() for i, a in enumerate(t) for j, b in enumerate(t) if i != j]
    return sum(cos) / len(cos)


def ref_energy_ratio(E, w):
    Ec = (E.double() - E.double().mean(dim=(1, 2), keepdim=True)).numpy()
    nh, nw = E.shape[1] // w, E.shape[2] // w
    region = Ec[:, : nh * w, : nw * w]
    mean_tile = np.mean([region[:, i * w:(i + 1) * w, j * w:(j + 1) * w] for i in range(nh) for j in range(nw)], 0)
    return float((np.tile(mean_tile, (1, nh, nw)) ** 2).sum() / (region ** 2).sum())


def periodic_grid(C, w, H, W, seed=0):
    tile = torch.randn(C, w, w, generator=torch.Generator().manual_seed(seed))
    return tile.tile(1, math.ceil(H / w), math.ceil(W / w))[:, :H, :W]


def mae_sincos_2d(dim, n):
    """MAE's fixed 2-D sin-cos table (models_mae / util/pos_embed.py), written from its definition: half the
    channels encode the column, half the row; each half is [sin(pos * omega), cos(pos * omega)] with
    omega_k = 1 / 10000^(k / (dim/4)). Returns (dim, n, n)."""
    def one_d(d, pos):
        omega = 1.0 / 10000 ** (np.arange(d // 2, dtype=np.float64) / (d / 2))
        out = np.outer(pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    rows, cols = np.meshgrid(np.arange(n, dtype=np.float64), np.arange(n, dtype=np.float64), indexing="ij")
    emb = np.concatenate([one_d(dim // 2, cols), one_d(dim // 2, rows)], axis=1)  # (n*n, dim), row-major
    return torch.from_numpy(emb.T.reshape(dim, n, n).copy()).float()


# ---- metric definitions vs brute force --------------------------------------------------------------------------

grids = st.tuples(st.integers(1, 5), st.integers(2, 17), st.integers(2, 17), st.integers(1, 6), st.integers(0, 10**6))


@settings(max_examples=25, deadline=None)
@given(grids, st.booleans())
def test_metrics_match_brute_force(shape, centred):
    C, H, W, w, seed = shape
    if (H // w) * (W // w) < 2:
        with pytest.raises(ValueError, match="at least 2"):
            window_similarity(torch.randn(C, H, W), w)
        return
    E = torch.randn(C, H, W, generator=torch.Generator().manual_seed(seed))
    assert window_similarity(E, w, centred) == pytest.approx(ref_ws(E, w, centred), abs=1e-9)
    t = ref_tiles(E, w, centred)
    M = window_similarity_matrix(E, w, centred)
    ref_M = np.array([[F.cosine_similarity(a, b, dim=0).item() for b in t] for a in t])
    np.testing.assert_allclose(M, ref_M, atol=1e-9)
    assert periodic_energy_ratio(E, w) == pytest.approx(ref_energy_ratio(E, w), abs=1e-9)
    off = offset_similarity_map(E, w, centred)
    tiles = [x.reshape(C, w, w) for x in t]
    for i in range(w):
        for j in range(w):
            v = [x[:, i, j] for x in tiles]
            c = [F.cosine_similarity(a, b, dim=0).item() for p, a in enumerate(v) for q, b in enumerate(v) if p != q]
            assert off[i, j] == pytest.approx(sum(c) / len(c), abs=1e-9)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 6), st.integers(2, 7), st.integers(2, 4), st.integers(0, 6), st.integers(0, 6))
def test_perfectly_periodic_has_ws_one_and_peaks_at_its_period(C, w, reps, extra_h, extra_w):
    # partial windows at the bottom/right (extra rows/cols) are left out, so they cannot lower WS
    H, W = w * reps + extra_h, w * reps + extra_w
    E = periodic_grid(C, w, H, W, seed=C * 100 + w)
    assert window_similarity(E, w) == pytest.approx(1.0, abs=1e-12)
    assert window_similarity(E, w, centred=True) == pytest.approx(1.0, abs=1e-12)
    assert periodic_energy_ratio(E, w) == pytest.approx(1.0, abs=1e-12)
    if (H // (2 * w)) * (W // (2 * w)) >= 2:
        assert window_similarity(E, 2 * w) == pytest.approx(1.0, abs=1e-12)
    if C * w * w >= 8:  # a random tile this size has no smaller period
        assert period_scan(E).peak == w


@settings(max_examples=20, deadline=None)
@given(st.integers(2, 6), st.integers(2, 5), st.integers(2, 4), st.integers(0, 10**6))
def test_energy_ratio_identity_for_equal_norm_tiles(C, w, reps, seed):
    # WS_centred = (n R_w - 1) / (n - 1) exactly when all (centred) tiles have equal norm.
    # Tiles with zero per-channel mean leave centring a no-op; normalizing them equalizes the norms.
    g = torch.Generator().manual_seed(seed)
    tiles = torch.randn(reps, reps, C, w, w, generator=g, dtype=torch.float64)
    tiles = tiles - tiles.mean(dim=(-1, -2), keepdim=True)
    tiles = tiles / tiles.flatten(2).norm(dim=-1)[..., None, None, None]
    E = tiles.permute(2, 0, 3, 1, 4).reshape(C, reps * w, reps * w)
    n = reps * reps
    ws_c = window_similarity(E, w, centred=True)
    assert ws_c == pytest.approx((n * periodic_energy_ratio(E, w) - 1) / (n - 1), abs=1e-9)


# ---- synthetic table ---------------------------------------------------------------------------------------------

def _mean_over_seeds(fn, seeds=8):
    return np.mean([fn(torch.Generator().manual_seed(s)) for s in range(seeds)], axis=0)


def test_periodic_upsampled_loses_alignment_and_period_doubles():
    def one(g):
        P = torch.randn(64, 8, 8, generator=g).tile(1, 7, 7)  # perfectly 8-periodic 56x56
        up = naive_resize(P, (112, 112))
        return [window_similarity(P, 8), window_similarity(up, 8), window_similarity(up, 8, centred=True),
                period_scan(up, range(2, 41)).peak]

    ws_p, ws_up, ws_up_c, peak = _mean_over_seeds(one)
    assert ws_p == pytest.approx(1.0, abs=1e-9)
    assert ws_up == pytest.approx(0.256, abs=TOL)
    assert ws_up_c == pytest.approx(0.234, abs=TOL)
    assert peak == 16  # every seed peaks at 16 (the mean of ints equals 16 only then)


def test_smooth_global_only_has_no_window_structure():
    ws = _mean_over_seeds(lambda g: window_similarity(naive_resize(torch.randn(64, 14, 14, generator=g), (56, 56)), 8))
    assert ws == pytest.approx(0.0, abs=TOL)


def test_abswin_keeps_ws_at_every_resolution_and_naive_does_not():
    def one(g):
        G, Wn = torch.randn(64, 7, 7, generator=g), torch.randn(64, 8, 8, generator=g)
        a224 = abswin_embed(G, Wn, (56, 56))
        rows = [a224, naive_resize(a224, (112, 112)), abswin_embed(G, Wn, (112, 112))]
        return [[window_similarity(E, 8), window_similarity(E, 8, centred=True), periodic_energy_ratio(E, 8),
                 window_similarity(E, 16)] for E in rows]

    got = _mean_over_seeds(one)
    table = [[0.573, 0.563, 0.569, 0.569],  # abs-win at 224 (G 7x7 + W 8x8)
             [0.143, 0.119, 0.122, 0.493],  # naive bicubic of that to 448
             [0.582, 0.573, 0.569, 0.573]]  # correct abs-win at 448
    np.testing.assert_allclose(got, table, atol=TOL)


def test_abswin_keeps_window_structure_at_many_sizes():
    g = torch.Generator().manual_seed(1)
    G, Wn = torch.randn(32, 7, 7, generator=g), torch.randn(32, 8, 8, generator=g)
    base = window_similarity(abswin_embed(G, Wn, (56, 56)), 8, centred=True)
    for side in (64, 88, 100, 129, 256):  # includes grids windows do not divide
        assert window_similarity(abswin_embed(G, Wn, (side, side)), 8, centred=True) == pytest.approx(base, abs=0.08)
        assert window_similarity(naive_resize(abswin_embed(G, Wn, (56, 56)), (side, side)), 8, centred=True) < base - 0.2


def test_vitdet_rows_interpolated_vs_tiled():
    ws = _mean_over_seeds(lambda g: window_similarity(naive_resize(torch.randn(64, 14, 14, generator=g), (64, 64)), 14))
    assert ws == pytest.approx(0.003, abs=TOL)
    E = torch.randn(64, 14, 14, generator=torch.Generator().manual_seed(0))
    assert window_similarity(abswin_embed(torch.zeros(64, 1, 1), E, (64, 64)), 14) == pytest.approx(1.0, abs=1e-9)


def test_mae_sincos_interpolated_vs_tiled():
    E = mae_sincos_2d(768, 14)
    up = naive_resize(E, (64, 64))
    tiled = abswin_embed(torch.zeros(768, 14, 14), E, (64, 64))
    assert window_similarity(up, 14, centred=True) == pytest.approx(0.0, abs=TOL)
    # the low-frequency cos channels are ~1 everywhere, so the *raw* cosine stays high although windows see
    # different positions: this is why the verdicts use the centred WS
    assert window_similarity(up, 14) > 0.7
    assert window_similarity(tiled, 14) == pytest.approx(1.0, abs=1e-9)
    assert window_similarity(tiled, 14, centred=True) == pytest.approx(1.0, abs=1e-9)


# ---- helpers: resizing and abs-win -------------------------------------------------------------------------------

def test_naive_resize_is_torch_bicubic_and_identity_at_same_size():
    E = torch.randn(5, 14, 14, generator=torch.Generator().manual_seed(0))
    for aa in (False, True):
        ref = F.interpolate(E[None], size=(40, 33), mode="bicubic", align_corners=False, antialias=aa)[0]
        torch.testing.assert_close(naive_resize(E, (40, 33), antialias=aa), ref, rtol=0, atol=0)
    torch.testing.assert_close(naive_resize(E, (14, 14)), E, rtol=0, atol=0)


def test_abswin_embed_matches_loop_reference_with_partial_windows():
    g = torch.Generator().manual_seed(0)
    G, Wn = torch.randn(3, 7, 7, generator=g), torch.randn(3, 8, 8, generator=g)
    H, W = 21, 30
    out = abswin_embed(G, Wn, (H, W))
    Gi = F.interpolate(G[None], size=(H, W), mode="bicubic", align_corners=False)[0]
    ref = torch.stack([torch.stack([Gi[:, i, j] + Wn[:, i % 8, j % 8] for j in range(W)], -1) for i in range(H)], -2)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)


def test_projection_reconstructs_and_its_window_part_is_the_mean_tile():
    E = torch.randn(4, 64, 64, generator=torch.Generator().manual_seed(0))
    g, win = abswin_parts_from_grid(E, 14)
    torch.testing.assert_close(abswin_embed(g, win, (64, 64)), E, rtol=0, atol=1e-5)
    ref_mean = torch.stack([E[:, i * 14:(i + 1) * 14, j * 14:(j + 1) * 14] for i in range(4) for j in range(4)]).mean(0)
    torch.testing.assert_close(win, ref_mean, rtol=0, atol=1e-6)


# ---- errors and verdicts -----------------------------------------------------------------------------------------

def test_inputs_are_never_modified():
    # (1, 2w, w) tiles are contiguous, so the flattened tiles are a view: normalizing must not touch the input
    for E in (np.random.default_rng(0).standard_normal((1, 16, 8)), torch.randn(3, 24, 16)):
        before = E.copy() if isinstance(E, np.ndarray) else E.clone()
        window_similarity(E, 8)
        window_similarity_matrix(E, 8)
        offset_similarity_map(E, 8)
        period_scan(E)
        assert (E == before).all()


def test_bad_inputs_raise_with_a_fix():
    with pytest.raises(ValueError, match=r"only 1 full 14x14 window.*at least 2"):
        window_similarity(torch.randn(4, 14, 14), 14)
    with pytest.raises(ValueError, match=r"shape \(C, H, W\)"):
        window_similarity(torch.randn(1, 4, 14, 14), 7)
    with pytest.raises(ValueError, match="non-finite"):
        window_similarity(torch.full((2, 16, 16), float("nan")), 8)
    with pytest.raises(ValueError, match="zero-initialized"):
        window_similarity(torch.zeros(2, 16, 16), 8)
    with pytest.raises(ValueError, match="constant per channel"):
        window_similarity(torch.ones(2, 16, 16), 8, centred=True)


def test_verdict_sentences():
    s = verdict(1024, (64, 64), 14, 0.98, 0.04, 0.97)
    assert "1024x1024 px (64x64 tokens, 14x14-token windows)" in s
    assert "naive keeps 4% of WS 0.98 (-> 0.04)" in s and "no longer see the same embedding" in s
    assert "under the 50% threshold" in s and "winpos-convert --input" in s and "0.97" in s
    s = verdict(1024, (64, 64), 14, None, 0.00, 1.00)  # MAE: a single window at 224 px
    assert "different piece of the pretrained embedding" in s and "of WS 1.00 (-> 0.00)" in s
    assert "winpos-convert" in s
    s = verdict(2048, (512, 512), 8, 0.57, 0.12, 0.57, is_abswin_family=True)
    assert "abs-win: resizing keeps the windows aligned, nothing to fix (WS 0.57" in s
    assert "no window pattern (reference WS 0.01 < 0.1): the bug cannot matter" in verdict(448, (112, 112), 8, 0.01,
                                                                                         0.0, None)
    assert "kept: naive keeps 98% of WS 0.90" in verdict(224, (56, 56), 8, 0.9, 0.88, None)
    json.dumps(s)
