"""``BACKBONE_REGISTRY`` builders for yacs configs (the Mask2Former / AdelaiDet style of project).

Usage::

    import winpos.d2                      # registers the builders below
    from winpos.d2 import add_winpos_config
    cfg = get_cfg(); add_winpos_config(cfg); cfg.merge_from_file("my.yaml")
    # my.yaml: MODEL.BACKBONE.NAME: build_hieradet_fpn_backbone, MODEL.WINPOS.NAME: hieradet_b, ...

``MODEL.WINPOS.OVERRIDES`` holds constructor arguments of the preset (``DROP_PATH_RATE``-style upper-case keys
are not translated: write them as the constructor spells them, e.g. ``drop_path_rate: 0.2``).
"""
from __future__ import annotations

from detectron2.config import CfgNode as CN
from detectron2.modeling import BACKBONE_REGISTRY, FPN, SimpleFeaturePyramid
from detectron2.modeling.backbone.fpn import LastLevelMaxPool

from winpos.d2.backbone import HieraDetBackbone, ViTDetBackbone
from winpos.errors import WinposError

__all__ = ["add_winpos_config", "build_hieradet_fpn_backbone", "build_vitdet_sfp_backbone"]


def add_winpos_config(cfg) -> None:
    """Add ``cfg.MODEL.WINPOS`` (defaults below) to a detectron2 yacs config, before ``merge_from_file``."""
    cfg.MODEL.WINPOS = CN()
    cfg.MODEL.WINPOS.NAME = "hieradet_b"  # a winpos preset (winpos.backbones.list_presets())
    cfg.MODEL.WINPOS.RECIPE = "original"  # original | paper | rope | lookhere
    cfg.MODEL.WINPOS.OVERRIDES = CN(new_allowed=True)  # preset constructor arguments
    cfg.MODEL.WINPOS.OUT_FEATURES = ["scale2", "scale3", "scale4", "scale5"]  # HieraDet only
    cfg.MODEL.WINPOS.SQUARE_PAD = 0  # pad batches to this square size (ViTDet LSJ: 1024)
    cfg.MODEL.WINPOS.SFP_SCALE_FACTORS = [4.0, 2.0, 1.0, 0.5]  # ViTDet only
    cfg.MODEL.WINPOS.SFP_NORM = "LN"


def _to_dict(node):
    return {k: _to_dict(v) for k, v in node.items()} if isinstance(node, dict) else node


def _check_rgb(input_shape, name):
    if input_shape.channels != 3:
        raise WinposError(f"{name} expects 3 input channels (len(MODEL.PIXEL_MEAN)), got {input_shape.channels}")


@BACKBONE_REGISTRY.register()
def build_hieradet_fpn_backbone(cfg, input_shape):
    """HieraDet bottom-up (``MODEL.WINPOS``) under detectron2's FPN (``MODEL.FPN``) with a max-pooled p6."""
    _check_rgb(input_shape, "build_hieradet_fpn_backbone")
    w = cfg.MODEL.WINPOS
    bottom_up = HieraDetBackbone(w.NAME, w.RECIPE, out_features=w.OUT_FEATURES, **_to_dict(w.OVERRIDES))
    return FPN(bottom_up=bottom_up, in_features=cfg.MODEL.FPN.IN_FEATURES or bottom_up._out_features,
               out_channels=cfg.MODEL.FPN.OUT_CHANNELS, norm=cfg.MODEL.FPN.NORM, top_block=LastLevelMaxPool(),
               fuse_type=cfg.MODEL.FPN.FUSE_TYPE, square_pad=w.SQUARE_PAD)


@BACKBONE_REGISTRY.register()
def build_vitdet_sfp_backbone(cfg, input_shape):
    """ViTDet (``MODEL.WINPOS``) under detectron2's SimpleFeaturePyramid (p2-p6, ``MODEL.FPN.OUT_CHANNELS``)."""
    _check_rgb(input_shape, "build_vitdet_sfp_backbone")
    w = cfg.MODEL.WINPOS
    net = ViTDetBackbone(w.NAME, w.RECIPE, **_to_dict(w.OVERRIDES))
    return SimpleFeaturePyramid(net=net, in_feature=net.out_feature, out_channels=cfg.MODEL.FPN.OUT_CHANNELS,
                                scale_factors=tuple(w.SFP_SCALE_FACTORS), top_block=LastLevelMaxPool(),
                                norm=w.SFP_NORM, square_pad=w.SQUARE_PAD)
