"""detectron2 adapters: output_shape() matches the tensors actually returned, padding, the yacs builders, and the
pyramid wiring (FPN / SimpleFeaturePyramid from detectron2 are the oracles of the contract)."""
import pytest
import torch
from detectron2.config import get_cfg
from detectron2.layers import ShapeSpec
from detectron2.modeling import FPN, SimpleFeaturePyramid, build_backbone
from detectron2.modeling.backbone.fpn import LastLevelMaxPool

import winpos.d2  # noqa: F401  (registers the yacs builders)
from winpos.backbones import create
from winpos.d2 import HieraDetBackbone, ViTDetBackbone, add_winpos_config

HIERA = dict(img_size=128, window_spec=(8, 4, 4, 2))


def _check_outputs(backbone, x):
    out = backbone(x)
    shapes = backbone.output_shape()
    assert list(out) == list(shapes) == backbone._out_features
    hp = -(-x.shape[-2] // backbone.size_divisibility) * backbone.size_divisibility
    wp = -(-x.shape[-1] // backbone.size_divisibility) * backbone.size_divisibility
    for name, t in out.items():
        s = shapes[name]
        assert t.shape == (x.shape[0], s.channels, hp // s.stride, wp // s.stride), name
    return out


@pytest.mark.parametrize("hw", [(128, 128), (100, 75)])
def test_hieradet_adapter_output_shape_matches_outputs(hw):
    bb = HieraDetBackbone("hieradet_toy", **HIERA).eval()
    assert bb.output_shape()["scale2"] == ShapeSpec(channels=32, stride=4)
    assert [bb.output_shape()[f].stride for f in bb._out_features] == [4, 8, 16, 32]
    assert bb.size_divisibility == 32 and bb.padding_constraints == {"size_divisibility": 32, "square_size": 0}
    with torch.no_grad():
        _check_outputs(bb, torch.randn(2, 3, *hw))


def test_hieradet_adapter_applies_stage_norms_like_mvit():
    net = create("hieradet_toy", **HIERA).eval()
    bb = HieraDetBackbone(net, out_features=("scale3", "scale5")).eval()
    assert bb._out_features == ["scale3", "scale5"] and hasattr(bb, "scale3_norm") and not hasattr(bb, "scale2_norm")
    for p in bb.parameters():
        torch.nn.init.normal_(p, std=0.1)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        out, raw = bb(x), net(x)
    # reference: LayerNorm over channels of the NCHW map, written out independently
    ref = torch.nn.functional.layer_norm(raw[3].permute(0, 2, 3, 1), (raw[3].shape[1],), bb.scale5_norm.weight,
                                         bb.scale5_norm.bias, eps=1e-6).permute(0, 3, 1, 2)
    torch.testing.assert_close(out["scale5"], ref)
    bare = HieraDetBackbone(net, norm=False).eval()
    with torch.no_grad():
        torch.testing.assert_close(bare(x)["scale4"], raw[2])


@pytest.mark.parametrize("hw", [(64, 96), (70, 50)])
def test_vitdet_adapter_output_shape_and_padding(hw):
    bb = ViTDetBackbone("vitdet_toy", img_size=64, window_size=4).eval()
    assert bb.output_shape() == {"last_feat": ShapeSpec(channels=96, stride=16)}
    x = torch.randn(1, 3, *hw)
    with torch.no_grad():
        out = _check_outputs(bb, x)
        # padding is zeros at the bottom/right, i.e. the same as running the net on the zero-padded image
        padded = torch.nn.functional.pad(x, (0, (-hw[1]) % 16, 0, (-hw[0]) % 16))
        torch.testing.assert_close(out["last_feat"], bb.net(padded))


def test_adapters_reject_bad_arguments():
    with pytest.raises(ValueError, match="out_features"):
        HieraDetBackbone("hieradet_toy", out_features=("res4",))
    with pytest.raises(ValueError, match="overrides"):
        ViTDetBackbone(create("vitdet_toy"), drop_path_rate=0.1)
    with pytest.raises(ValueError, match="size_divisibility"):
        ViTDetBackbone("vitdet_toy", size_divisibility=24)
    with pytest.raises(ValueError, match="unknown backbone preset"):
        ViTDetBackbone("vitdet_typo")


def test_pyramids_on_adapters_line_up_at_any_size():
    fpn = FPN(bottom_up=HieraDetBackbone("hieradet_toy", **HIERA), in_features=["scale2", "scale3", "scale4",
              "scale5"], out_channels=16, norm="LN", top_block=LastLevelMaxPool()).eval()
    sfp = SimpleFeaturePyramid(ViTDetBackbone("vitdet_toy", img_size=64, window_size=4), "last_feat", 16,
                               (4.0, 2.0, 1.0, 0.5), top_block=LastLevelMaxPool(), norm="LN").eval()
    with torch.no_grad():
        for model in (fpn, sfp):
            out = model(torch.randn(1, 3, 100, 75))  # not a multiple of 32: the adapter pads
            for name, shape in model.output_shape().items():
                assert out[name].shape[1] == shape.channels
            assert out["p2"].shape[-2] == 2 * out["p3"].shape[-2] == 4 * out["p4"].shape[-2]


@pytest.mark.parametrize("builder,name", [("build_hieradet_fpn_backbone", "hieradet_toy"),
                                          ("build_vitdet_sfp_backbone", "vitdet_toy")])
def test_yacs_builders(builder, name):
    cfg = get_cfg()
    add_winpos_config(cfg)
    cfg.MODEL.BACKBONE.NAME = builder
    cfg.MODEL.WINPOS.NAME = name
    cfg.MODEL.WINPOS.RECIPE = "paper"
    cfg.MODEL.FPN.OUT_CHANNELS = 32
    cfg.MODEL.WINPOS.OVERRIDES.img_size = 64
    if name.startswith("vitdet"):
        cfg.MODEL.WINPOS.OVERRIDES.window_size = 4
    else:
        cfg.MODEL.WINPOS.OVERRIDES.window_spec = [8, 4, 4, 2]
    cfg.merge_from_list(["MODEL.WINPOS.SQUARE_PAD", 64])
    bb = build_backbone(cfg).eval()
    assert list(bb.output_shape()) == ["p2", "p3", "p4", "p5", "p6"]
    assert bb.padding_constraints["square_size"] == 64
    with torch.no_grad():
        out = bb(torch.randn(1, 3, 64, 64))
    assert [out[k].shape[-1] for k in ("p2", "p3", "p4", "p5", "p6")] == [16, 8, 4, 2, 1]
    cfg.MODEL.PIXEL_MEAN = [0.0]
    cfg.MODEL.PIXEL_STD = [1.0]
    with pytest.raises(ValueError, match="3 input channels"):
        build_backbone(cfg)
