"""Hiera-family checkpoints into HieraDet: official Hiera (``hiera``), timm Hiera (plain and abs-win) and SAM2 are
the oracles; every converted model must reproduce its source's stage features."""
import pytest
import torch

from tests.conftest import require
from tests.helpers import assert_features_close, randomize_
from winpos.backbones.hieradet import HieraDet
from winpos.checkpoints import LoadReport
from winpos.checkpoints.hiera import convert_hiera_checkpoint, hiera_format, load_hiera_checkpoint
from winpos.posemb.abswin import tile_to_grid
from winpos.posemb.interp import resize_grid


# Official Hiera's attention layout: mask units (8x8, then 4x4) in stages 1-2, global in 3-4 (Ryali et al. 2023, Hiera).
HIERA_LAYOUT = dict(embed_dim=16, num_heads=1, stages=(1, 1, 2, 1), window_spec=(8, 4, 0, 0), global_blocks=())


@pytest.fixture(scope="module")
def official():
    hiera = require("hiera")
    return randomize_(hiera.Hiera(input_size=(224, 224), embed_dim=16, num_heads=1, stages=(1, 1, 2, 1),
                                  num_classes=10).eval())


def hiera_features(model, x):
    with torch.no_grad():
        _, inter = model(x, return_intermediates=True)  # rerolled to (B, H, W, C)
    return [f.permute(0, 3, 1, 2) for f in inter]


def run(model, x):
    with torch.no_grad():
        return model.eval()(x)


def test_official_hiera_intermediates(official):
    ours = HieraDet(img_size=224, pos_embed="abs", **HIERA_LAYOUT)
    report = load_hiera_checkpoint(ours, {"model_state": official.state_dict()})
    assert report.source == "hiera" and not report.missing
    assert report.converted == [("pos_embed.pos_embed", "renamed from 'pos_embed'")]
    assert {k for k, _ in report.unexpected} == {"norm.weight", "norm.bias", "head.projection.weight",
                                                 "head.projection.bias"}
    x = torch.randn(2, 3, 224, 224)
    assert_features_close(run(ours, x), hiera_features(official, x))


def test_timm_plain_hiera():
    timm = require("timm")
    ref = randomize_(timm.create_model("hiera_tiny_224", pretrained=False, embed_dim=16, stages=(1, 1, 2, 1),
                                       num_classes=0).eval())
    ours = HieraDet(img_size=224, pos_embed="abs", **HIERA_LAYOUT)
    assert load_hiera_checkpoint(ours, ref.state_dict()).source == "hiera"
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        expected = ref.forward_intermediates(x, intermediates_only=True)
    assert_features_close(run(ours, x), expected)


def test_timm_abswin_trunk():
    timm = require("timm")
    ref = randomize_(timm.create_model("hiera_small_abswin_256", pretrained=False, embed_dim=16,
                                       stages=(1, 1, 2, 1), num_classes=0).eval())
    # timm's abs-win: 16x16 global grid resized with antialias, LayerScale, no expand projection.
    ours = HieraDet(img_size=256, pos_embed="abswin", pos_global_size=16, pos_antialias=True, layer_scale_init=1e-5,
                    expand_proj=False, **HIERA_LAYOUT)
    report = load_hiera_checkpoint(ours, ref.state_dict())
    assert report.source == "timm_abswin" and not report.missing
    assert dict(report.converted) == {"pos_embed.global_embed": "renamed from 'pos_embed'",
                                      "pos_embed.window_embed": "renamed from 'pos_embed_win'"}
    x = torch.randn(2, 3, 256, 256)
    with torch.no_grad():
        expected = ref.forward_intermediates(x, intermediates_only=True)
    assert_features_close(run(ours, x), expected)


@pytest.mark.parametrize("pos_embed", ["abswin", "abswin_recursive"])
def test_abs_to_abswin_is_exact_at_224(official, pos_embed):
    ours = HieraDet(img_size=224, pos_embed=pos_embed, pos_global_size=56, **HIERA_LAYOUT)
    report = load_hiera_checkpoint(ours, official.state_dict())
    # exact, so converted (the same rule for every format): window = mean tile, global = the residual
    assert {k for k, _ in report.converted} == {"pos_embed.global_embed", "pos_embed.window_embed"}
    assert not report.reshaped
    x = torch.randn(2, 3, 224, 224)
    assert_features_close(run(ours, x), hiera_features(official, x), rtol=1e-5)


def test_abs_to_abswin_keeps_every_window_embedding(official):
    source = official.pos_embed.detach().reshape(1, 56, 56, 16)
    single = HieraDet(pos_embed="abswin", pos_global_size=56, **HIERA_LAYOUT)
    load_hiera_checkpoint(single, official.state_dict())
    mean_window = source.reshape(1, 7, 8, 7, 8, 16).mean(dim=(1, 3))  # (1, 8, 8, C)
    for hw in [(112, 112), (100, 76)]:
        with torch.no_grad():
            periodic = single.pos_embed(hw) - resize_grid(single.pos_embed.global_embed, hw).permute(0, 2, 3, 1)
        tiled = tile_to_grid(mean_window.permute(0, 3, 1, 2), hw).permute(0, 2, 3, 1)
        torch.testing.assert_close(periodic, tiled, rtol=0, atol=1e-6)
    # Recursive: every 224-px tile of a larger image gets exactly the embedding of the 224-px source.
    recursive = HieraDet(pos_embed="abswin_recursive", pos_global_size=56, **HIERA_LAYOUT)
    load_hiera_checkpoint(recursive, official.state_dict())
    with torch.no_grad():
        grid = recursive.pos_embed((140, 112))
    for i, j in [(0, 0), (56, 56), (112, 0)]:
        tile = grid[:, i:i + 56, j:j + 56]
        torch.testing.assert_close(tile, source[:, : tile.shape[1], : tile.shape[2]], rtol=0, atol=1e-6)


def test_smaller_global_grid_is_reported_as_lossy(official):
    ours = HieraDet(pos_embed="abswin", pos_global_size=7, **HIERA_LAYOUT)
    report = load_hiera_checkpoint(ours, official.state_dict())
    assert "resized (56, 56) -> (7, 7)" in dict(report.reshaped)["pos_embed.global_embed"]
    assert ours.pos_embed.global_embed.shape == (1, 16, 7, 7)


# --------------------------------------------------------------------------------------------------- SAM2
@pytest.fixture(scope="module")
def sam2_trunk():
    hieradet = require("sam2.modeling.backbones.hieradet")
    return randomize_(hieradet.Hiera(embed_dim=16, num_heads=1, stages=(1, 1, 2, 1), global_att_blocks=(3,),
                                     window_pos_embed_bkg_spatial_size=(7, 7)).eval())


def test_sam2_checkpoint_container(sam2_trunk):
    ckpt = {"model": {**{f"image_encoder.trunk.{k}": v for k, v in sam2_trunk.state_dict().items()},
                      "image_encoder.neck.convs.0.conv.weight": torch.ones(256, 128, 1, 1),
                      "sam_mask_decoder.iou_token.weight": torch.ones(1, 256)}}
    ours = HieraDet(pos_embed="abswin", pos_global_size=7, embed_dim=16, num_heads=1, stages=(1, 1, 2, 1),
                    global_blocks=(3,))
    report = load_hiera_checkpoint(ours, ckpt)
    assert report.source == "sam2" and not report.missing and not report.reshaped
    assert {k for k, _ in report.unexpected} == {"image_encoder.neck.convs.0.conv.weight",
                                                 "sam_mask_decoder.iou_token.weight"}
    converted = dict(report.converted)
    assert converted["blocks.0.mlp.fc1.weight"] == "renamed from 'image_encoder.trunk.blocks.0.mlp.layers.0.weight'"
    assert converted["pos_embed.window_embed"] == "renamed from 'image_encoder.trunk.pos_embed_window'"
    x = torch.randn(1, 3, 256, 256)
    with torch.no_grad():
        assert_features_close(run(ours, x), sam2_trunk(x))


def test_sam2_abswin_materialized_as_abs(sam2_trunk):
    ours = HieraDet(pos_embed="abs", embed_dim=16, num_heads=1, stages=(1, 1, 2, 1), global_blocks=(3,))
    report = load_hiera_checkpoint(ours, sam2_trunk.state_dict())
    assert "materialized" in dict(report.reshaped)["pos_embed.pos_embed"]
    with torch.no_grad():
        torch.testing.assert_close(ours.pos_embed((56, 56)), sam2_trunk._get_pos_embed((56, 56)), rtol=0, atol=1e-6)


# ------------------------------------------------------------------------------------------ report, errors
def test_new_block_terms_are_reported_missing(sam2_trunk):
    ours = HieraDet(pos_embed="abswin", pos_global_size=7, global_pos="relpos", embed_dim=16, num_heads=1,
                    stages=(1, 1, 2, 1), global_blocks=(3,))
    report = load_hiera_checkpoint(ours, sam2_trunk.state_dict())
    assert {k for k, _ in report.missing} == {"blocks.3.attn.rel_pos_h", "blocks.3.attn.rel_pos_w"}
    assert all("relpos" in reason for _, reason in report.missing)
    deeper = HieraDet(pos_embed="abswin", pos_global_size=7, embed_dim=16, num_heads=1, stages=(1, 1, 2, 2),
                      global_blocks=(3,))  # one more block at the end: blocks.5 is not in the checkpoint
    with pytest.raises(ValueError, match="lacks .* trunk weights"):
        load_hiera_checkpoint(deeper, sam2_trunk.state_dict())
    shallower = HieraDet(pos_embed="abswin", pos_global_size=7, embed_dim=16, num_heads=1, stages=(1, 1, 1, 1),
                         global_blocks=())
    with pytest.raises(ValueError, match="checkpoint key 'blocks.3.attn.qkv.weight'"):
        load_hiera_checkpoint(shallower, sam2_trunk.state_dict())  # block 3 opens stage 4 there: 2x wider


def test_wrong_shape_names_key_expected_found(official):
    ours = HieraDet(pos_embed="abs", **{**HIERA_LAYOUT, "embed_dim": 32})
    with pytest.raises(ValueError, match=r"'patch_embed.proj.weight'.*\(16, 3, 7, 7\).*expects \(32, 3, 7, 7\)"):
        convert_hiera_checkpoint(official.state_dict(), target=ours)
    with pytest.raises(ValueError, match=r"pos_embed.*\(1, 3136, 16\).*expects \(1, 4096, 16\)"):
        convert_hiera_checkpoint(official.state_dict(), target=HieraDet(pos_embed="abs", pretrain_img_size=256,
                                                                        **HIERA_LAYOUT))


def test_formats_and_bad_checkpoints(official, sam2_trunk, tmp_path):
    assert hiera_format(official.state_dict()) == "hiera"
    assert hiera_format(sam2_trunk.state_dict()) == "sam2"
    ours = HieraDet(pos_embed="abswin", pos_global_size=7, embed_dim=16, num_heads=1, stages=(1, 1, 2, 1),
                    global_blocks=(3,))
    assert hiera_format(ours.state_dict()) == "winpos"
    sd, report = convert_hiera_checkpoint(sam2_trunk.state_dict())  # no target: keeps the source's form
    assert isinstance(report, LoadReport) and sd["pos_embed.global_embed"].shape == (1, 16, 7, 7)
    path = tmp_path / "hiera.pth"
    torch.save({"model_state": official.state_dict()}, path)
    from_file, _ = convert_hiera_checkpoint(path)
    torch.testing.assert_close(from_file["pos_embed.pos_embed"], official.pos_embed.detach())
    with pytest.raises(ValueError, match="video Hiera"):
        hiera_format({"pos_embed_spatial": torch.zeros(1, 3136, 8), "blocks.0.norm1.weight": torch.zeros(8)})
    with pytest.raises(ValueError, match="could not tell the checkpoint's format"):
        convert_hiera_checkpoint({"encoder.layer.0.weight": torch.zeros(2)})
    with pytest.raises(ValueError, match="'mae' is not a Hiera format"):
        convert_hiera_checkpoint(official.state_dict(), source="mae")
    with pytest.raises(ValueError, match="unknown checkpoint format 'vit'"):
        convert_hiera_checkpoint(official.state_dict(), source="vit")
