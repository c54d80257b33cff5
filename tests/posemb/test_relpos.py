"""Decomposed relpos vs detectron2 ``add_decomposed_rel_pos`` and segment-anything's, and the resampling rule."""
import pytest
import torch

from tests.conftest import require
from winpos.posemb.relpos import rel_bias_dense, rel_lookup, resample_rel_table


@pytest.mark.parametrize("q_hw,k_hw,table", [((14, 14), (14, 14), 27), ((64, 64), (64, 64), 27),
                                             ((7, 7), (14, 14), 27), ((8, 12), (8, 12), 15), ((5, 9), (10, 18), 35)])
def test_bias_matches_detectron2(q_hw, k_hw, table):
    d2_utils = require("detectron2.modeling.backbone.utils")
    B, C = 3, 16
    q = torch.randn(B, q_hw[0] * q_hw[1], C)
    rh, rw = torch.randn(table, C), torch.randn(table + 4, C)
    attn = torch.zeros(B, q_hw[0] * q_hw[1], k_hw[0] * k_hw[1])
    ref = d2_utils.add_decomposed_rel_pos(attn, q, rh, rw, q_hw, k_hw)
    ours = rel_bias_dense(q, rh, rw, q_hw, k_hw)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_bias_matches_segment_anything():
    sam_encoder = require("segment_anything.modeling.image_encoder")
    q_hw = (14, 14)
    q = torch.randn(2, 196, 8)
    rh, rw = torch.randn(27, 8), torch.randn(27, 8)
    ref = sam_encoder.add_decomposed_rel_pos(torch.zeros(2, 196, 196), q, rh, rw, q_hw, q_hw)
    torch.testing.assert_close(rel_bias_dense(q, rh, rw, q_hw, q_hw), ref, rtol=1e-5, atol=1e-5)


def test_lookup_matches_detectron2_get_rel_pos_with_resampling():
    d2_utils = require("detectron2.modeling.backbone.utils")
    table = torch.randn(27, 4)
    for q, k in [(14, 14), (64, 64), (7, 14), (14, 7), (3, 5)]:
        torch.testing.assert_close(rel_lookup(table, q, k), d2_utils.get_rel_pos(q, k, table), rtol=0, atol=1e-6)


def test_resample_is_identity_at_same_length_and_linear_otherwise():
    t = torch.randn(27, 3)
    assert resample_rel_table(t, 27) is t
    assert resample_rel_table(t, 127).shape == (127, 3)
    with pytest.raises(ValueError, match="length, head_dim"):
        resample_rel_table(torch.randn(27), 5)


def test_head_dim_mismatch_is_explained():
    with pytest.raises(ValueError, match="head_dim"):
        rel_bias_dense(torch.randn(1, 16, 8), torch.randn(7, 4), torch.randn(7, 4), (4, 4), (4, 4))
