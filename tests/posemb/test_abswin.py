"""Abs-win vs sam2 ``Hiera._get_pos_embed`` and timm's abswin Hiera; conversions reproduce their source exactly."""
import pytest
import torch
from hypothesis import given, strategies as st

from tests.conftest import require
from winpos.posemb.abswin import (
    AbsWinPosEmbed, abs_to_abswin, abswin_embedding, abswin_recursive, tile_to_grid,
)


def _sam2_trunk(global_size, window):
    hieradet = require("sam2.modeling.backbones.hieradet")
    trunk = hieradet.Hiera(embed_dim=16, num_heads=1, stages=(1, 1, 1, 1), global_att_blocks=(),
                           window_pos_embed_bkg_spatial_size=global_size, window_spec=(window, 4, 2, 1))
    with torch.no_grad():
        trunk.pos_embed.normal_()
        trunk.pos_embed_window.normal_()
    return trunk


@pytest.mark.parametrize("hw", [(256, 256), (128, 128), (64, 96), (56, 56)])
def test_single_matches_sam2(hw):
    trunk = _sam2_trunk((7, 7), 8)
    ref = trunk._get_pos_embed(hw)
    ours = abswin_embedding(trunk.pos_embed, trunk.pos_embed_window, hw).permute(0, 2, 3, 1)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-6)


def test_module_loads_sam2_weights_and_matches():
    trunk = _sam2_trunk((14, 14), 8)
    mod = AbsWinPosEmbed(16, window_size=8, global_size=14)
    mod.load_state_dict({"global_embed": trunk.pos_embed, "window_embed": trunk.pos_embed_window})
    with torch.no_grad():
        torch.testing.assert_close(mod((64, 64)), trunk._get_pos_embed((64, 64)), rtol=0, atol=1e-6)


def test_single_matches_timm_abswin_hiera():
    timm = require("timm")
    model = timm.create_model("hiera_small_abswin_256", pretrained=False, embed_dim=16, num_heads=1,
                              stages=(1, 1, 1, 1), img_size=256)
    with torch.no_grad():
        model.pos_embed.normal_()
        model.pos_embed_win.normal_()
        x = torch.zeros(1, 64 * 64, 16)
        ref = model._pos_embed(x)  # adds the (1, N, C) embedding to zeros, in spatial (not unrolled) order
    ours = abswin_embedding(model.pos_embed, model.pos_embed_win, (64, 64), antialias=True)
    torch.testing.assert_close(ours.flatten(2).transpose(1, 2), ref, rtol=0, atol=1e-6)


@given(h=st.integers(1, 70), w=st.integers(1, 70), win=st.integers(1, 16))
def test_tiles_anchor_at_origin_for_any_grid(h, w, win):
    window = torch.randn(1, 3, win, win)
    tiled = tile_to_grid(window, (h, w))
    assert tiled.shape == (1, 3, h, w)
    ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    expected = window[0][:, ys % win, xs % win]
    assert torch.equal(tiled[0], expected)


@given(h=st.integers(8, 64), w=st.integers(8, 64), win=st.sampled_from([4, 7, 8, 14]))
def test_abs_to_abswin_is_exact_at_source_grid(h, w, win):
    pos = torch.randn(1, 5, h, w, dtype=torch.float64)
    if h < win or w < win:
        with pytest.raises(ValueError, match="larger than"):
            abs_to_abswin(pos, win)
        return
    g, wn = abs_to_abswin(pos, win)
    rebuilt = abswin_embedding(g, wn, (h, w))
    torch.testing.assert_close(rebuilt, pos, rtol=0, atol=1e-12)


def test_abs_to_abswin_projection_is_the_tile_mean():
    periodic = tile_to_grid(torch.randn(1, 4, 8, 8, dtype=torch.float64), (56, 56))
    g, wn = abs_to_abswin(periodic, 8)
    torch.testing.assert_close(tile_to_grid(wn, (56, 56)), periodic)
    assert g.abs().max() < 1e-12


def test_windows_keep_identical_embedding_at_any_resolution():
    """The fix: with a zero global part every window sees exactly the window embedding, at every grid."""
    wn = torch.randn(1, 4, 14, 14)
    for hw in [(64, 64), (96, 80), (14, 14)]:
        e = abswin_embedding(torch.zeros(1, 4, 14, 14), wn, hw)
        for y in range(0, hw[0] - 13, 14):
            for x in range(0, hw[1] - 13, 14):
                assert torch.equal(e[..., y:y + 14, x:x + 14], wn)


def test_recursive_is_periodic_with_base_and_equals_single_at_base():
    g, wn = torch.randn(1, 4, 7, 7), torch.randn(1, 4, 8, 8)
    base = abswin_embedding(g, wn, (56, 56))
    rec = abswin_recursive(g, wn, (256, 200), base_hw=(56, 56))
    torch.testing.assert_close(rec[..., :56, :56], base)
    torch.testing.assert_close(rec[..., 56:112, 112:168], base)
    torch.testing.assert_close(rec[..., 224:256, 168:200], base[..., :32, :32])


def test_cache_reuses_in_eval_and_tracks_updates():
    mod = AbsWinPosEmbed(4, 8, 7, init_std=0.02)
    with torch.no_grad():
        a = mod((32, 32))
        assert mod((32, 32)) is a
        mod.window_embed.add_(1.0)
        b = mod((32, 32))
    assert b is not a and torch.allclose(b, a + 1.0)
    out = mod((32, 32))  # with grad: not cached, differentiable
    out.sum().backward()
    assert mod.global_embed.grad is not None and mod.window_embed.grad.abs().sum() > 0


def test_bad_inputs():
    with pytest.raises(ValueError, match="unknown abswin mode"):
        AbsWinPosEmbed(4, 8, 7, mode="tiled")
    with pytest.raises(ValueError, match="multiple of the window"):
        AbsWinPosEmbed(4, 14, 7, mode="recursive", base_hw=(56, 50))
    with pytest.raises(ValueError, match="zero size"):
        AbsWinPosEmbed(4, 8, 7)((0, 5))
    with pytest.raises(ValueError, match="non-finite"):
        abs_to_abswin(torch.full((1, 2, 16, 16), float("inf")), 8)


def test_cached_embeddings_never_carry_requires_grad_into_inference():
    """At the stored grid the plain embedding is a view of its parameter; the cached inference result must be
    detached (a jit trace after a cached forward used to fail on a grad-requiring constant). While tracing nothing
    is read from the cache: the graph computes the embedding from the module's parameters."""
    from winpos.posemb.abswin import AbsPosEmbed

    class AddEmbedding(torch.nn.Module):
        def __init__(self, embed, hw):
            super().__init__()
            self.embed, self.hw = embed, hw

        def forward(self, x):
            return x + self.embed(self.hw)

    for mod, hw in ((AbsPosEmbed(4, (6, 6)), (6, 6)), (AbsWinPosEmbed(4, 8, 7), (8, 8))):
        with torch.no_grad():
            out = mod(hw)
            assert not out.requires_grad
            traced = torch.jit.trace(AddEmbedding(mod, hw), torch.zeros(1, *hw, 4), check_trace=False)
        torch.testing.assert_close(traced(torch.zeros(1, *hw, 4)), out)
