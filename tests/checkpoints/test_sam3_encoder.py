"""SAM3's image encoder as a winpos ViTDet: parity with ``sam3.model.vitdet.ViT`` (the oracle, Meta's ``sam3``
package) on the same random weights, with SAM3's own settings: 24 x 24 windows, the tiled absolute embedding, RoPE
rescaled into the window, ``ln_pre``, patch 14 without a bias.

Sizes: the encoder's own 1008 px and 560 px (40 x 40 tokens: windows padded to 48, as SAM3 pads) on a narrow
encoder with SAM3's head width (64) and block kinds, and the full ViT-L/14 (32 blocks) at 336 px. Tolerance 1e-4,
max abs over the feature map, fp32.
"""
import pytest
import torch

from tests.conftest import require
from winpos.backbones import create
from winpos.checkpoints import load_external
from winpos.checkpoints.formats import Format, detect
from winpos.errors import WinposError

# SAM3's model builder (_create_vit_backbone) builds its encoder with these settings; the tests vary only the size.
SAM3_SETTINGS = dict(pretrain_img_size=336, patch_size=14, mlp_ratio=4.625, norm_layer="LayerNorm", qkv_bias=True,
                     use_abs_pos=True, tile_abs_pos=True, rel_pos_blocks=(), use_rope=True, use_interp_rope=True,
                     window_size=24, pretrain_use_cls_token=True, retain_cls_token=False, ln_pre=True, ln_post=False,
                     return_interm_layers=False, bias_patch_embed=False, drop_path_rate=0.0,
                     use_act_checkpoint=False)
TOY = dict(embed_dim=128, depth=4, num_heads=2, global_att_blocks=(1, 3))
FULL = dict(embed_dim=1024, depth=32, num_heads=16, global_att_blocks=(7, 15, 23, 31))


def _oracle(img_size, sizes, seed=0):
    vitdet = require("sam3.model.vitdet")
    torch.manual_seed(seed)
    model = vitdet.ViT(img_size=img_size, **SAM3_SETTINGS, **sizes).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # O(1) logits and a visible embedding: no term can hide behind a small init
        for name, p in model.named_parameters():
            std = 0.5 if "pos_embed" in name else (p.shape[-1] ** -0.5 if p.dim() > 1 else 0.1)
            p.copy_(torch.randn(p.shape, generator=g) * std + (1.0 if "norm" in name and "weight" in name else 0.0))
    return model


def _converted(oracle, preset, img_size):
    ours = create(preset, img_size=img_size).eval()
    converted, report = load_external(oracle.state_dict(), ours)
    result = ours.load_state_dict(converted, strict=False)
    assert not result.missing_keys and not result.unexpected_keys, result
    assert report.source == "sam3" and not report.missing and not report.lost
    return ours, report


def _max_error(oracle, ours, img_size, seed=1):
    x = torch.randn(1, 3, img_size, img_size, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        ref = oracle(x)[-1]
        out = ours(x)
    assert out.shape == ref.shape
    return (out - ref).abs().max().item(), ref.abs().max().item()


@pytest.mark.parametrize("img_size", [1008, 560])
def test_sam3_encoder_settings_equal_sam3_at_two_sizes(img_size):
    oracle = _oracle(img_size, TOY)
    ours, report = _converted(oracle, "vitdet_sam3_toy", img_size)
    err, scale = _max_error(oracle, ours, img_size)
    assert scale > 0.5  # the features are not near zero
    assert err <= 1e-4, err
    # the tiled embedding arrives whole as the abs-win window embedding, the global part zero (exact)
    assert dict(report.converted)["pos_embed.global_embed"].startswith("zeros")
    torch.testing.assert_close(ours.pos_embed.window_embed.permute(0, 2, 3, 1).reshape(1, -1, 128),
                               oracle.pos_embed[:, 1:], rtol=0, atol=0)


def test_one_converted_model_runs_where_sam3_needs_a_rebuild():
    """SAM3 fixes its RoPE tables at build; winpos's model built at 1008 px equals SAM3 rebuilt at 560 px."""
    oracle_560 = _oracle(560, TOY)
    ours, _ = _converted(_oracle(1008, TOY), "vitdet_sam3_toy", 1008)  # the same weights (same seed)
    err, _ = _max_error(oracle_560, ours, 560)
    assert err <= 1e-4, err


@pytest.mark.slow  # 32 s
def test_the_full_sam3_encoder_equals_sam3():
    oracle = _oracle(336, FULL)
    ours, report = _converted(oracle, "vitdet_sam3", 336)
    assert len(report.matched) == 2 + 32 * 12 + 1  # ln_pre (2), 12 tensors a block, the patch kernel
    err, scale = _max_error(oracle, ours, 336)
    assert err <= 1e-4 * max(1.0, scale), (err, scale)


def test_a_whole_sam3_checkpoint_is_found_under_its_prefix():
    trunk = _oracle(336, TOY).state_dict()
    prefix = "detector.backbone.vision_backbone.trunk."
    whole = {f"{prefix}{k}": v for k, v in trunk.items()}
    whole["detector.backbone.vision_backbone.convs.0.dconv_2x2.weight"] = torch.zeros(4, 4, 2, 2)
    whole["tracker.maskmem_backbone.mask_downsampler.encoder.0.weight"] = torch.zeros(4, 1, 3, 3)
    assert detect(trunk) == Format.SAM3 and detect(whole) == Format.SAM3
    ours = create("vitdet_sam3_toy", img_size=336)
    converted, report = load_external(whole, ours)
    assert set(converted) == set(ours.state_dict())
    assert {k for k, _ in report.unexpected} >= {k for k in whole if k.endswith("freqs_cis")}
    assert not report.unknown or all(not k.startswith(prefix) for k in report.unknown)


def test_a_sam3_encoder_into_a_patch16_vitdet_is_refused_in_one_line():
    trunk = _oracle(336, TOY).state_dict()
    with pytest.raises(WinposError) as e:
        load_external(trunk, create("vitdet_toy", img_size=64))
    assert "\n" not in str(e.value) and "shape" in str(e.value)


def test_a_size_that_is_not_a_multiple_of_14_is_refused_not_cropped():
    ours = create("vitdet_sam3_toy", img_size=336)
    with pytest.raises(WinposError, match="14"):
        ours(torch.zeros(1, 3, 1024, 1024))
