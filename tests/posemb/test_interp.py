"""Naive interpolation vs its oracles: detectron2 ``get_abs_pos`` and timm ``resample_abs_pos_embed``."""
import pytest
import torch
from hypothesis import given, strategies as st

from tests.conftest import require
from winpos.posemb.interp import interpolate_abs, resample_flat


@pytest.mark.parametrize("hw", [(64, 64), (14, 14), (32, 48), (37, 23)])
def test_matches_detectron2_get_abs_pos(hw):
    d2_utils = require("detectron2.modeling.backbone.utils")
    pos = torch.randn(1, 197, 32)
    if hw[0] != hw[1]:
        # detectron2 resizes to any (h, w) target from a square source
        pass
    ours = interpolate_abs(pos, hw, has_cls=True, antialias=False)
    ref = d2_utils.get_abs_pos(pos, True, hw)
    assert ours.shape == ref.shape == (1, *hw, 32)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize("antialias", [False, True])
@pytest.mark.parametrize("new", [(16, 16), (7, 9), (40, 24)])
def test_matches_timm_resample(antialias, new):
    pos_embed = require("timm.layers.pos_embed")
    pos = torch.randn(1, 1 + 14 * 14, 24)
    ref = pos_embed.resample_abs_pos_embed(pos, list(new), num_prefix_tokens=1, antialias=antialias)
    ours = resample_flat(pos, new, num_prefix=1, antialias=antialias)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-6)


def test_antialias_differs_when_upsampling():
    pos = torch.randn(1, 196, 8)
    a = interpolate_abs(pos, (28, 28), antialias=False)
    b = interpolate_abs(pos, (28, 28), antialias=True)
    assert (a - b).abs().max() > 1e-3


def test_fp16_computed_in_fp32_and_cast_back():
    pos = torch.randn(1, 196, 8)
    half = interpolate_abs(pos.half(), (30, 30))
    assert half.dtype == torch.float16
    torch.testing.assert_close(half.float(), interpolate_abs(pos, (30, 30)), rtol=0, atol=2e-2)


@given(h=st.integers(1, 40), w=st.integers(1, 40), s=st.integers(2, 12))
def test_same_size_is_identity_and_shapes(h, w, s):
    pos = torch.randn(1, s * s, 4)
    out = interpolate_abs(pos, (h, w))
    assert out.shape == (1, h, w, 4)
    same = interpolate_abs(pos, (s, s))
    assert torch.equal(same.reshape(1, s * s, 4), pos)


def test_bad_inputs():
    with pytest.raises(ValueError, match="not a square grid"):
        interpolate_abs(torch.randn(1, 197, 4), (8, 8))  # forgot has_cls
    with pytest.raises(ValueError, match="non-finite"):
        interpolate_abs(torch.full((1, 196, 4), float("nan")), (8, 8))
    with pytest.raises(ValueError, match="zero size"):
        interpolate_abs(torch.randn(1, 196, 4), (0, 8))
