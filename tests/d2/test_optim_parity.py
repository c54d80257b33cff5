"""winpos's `original` ViTDet recipes train with detectron2's optimizer, parameter by parameter.

Oracle: detectron2's own ViTDet Mask R-CNN (``model_zoo`` ``common/models/mask_rcnn_vitdet.py`` with detectron2's
``ViT``) and its AdamW (``common/optim.py``: ``get_default_optimizer_params``) with ``get_vit_lr_decay_rate``. The
ViTDet project configs that set the per-size values are not installed with detectron2, so the published values of
``projects/ViTDet/configs/COCO/{mask,cascade_mask}_rcnn_vitdet_{b,l}_100ep.py`` and ``*_h_75ep.py`` are applied here
to detectron2's own base config: sizes, drop path, global blocks, layer decay, ``overrides={"pos_embed": wd 0}``
(B, L) or ``{}`` with ``weight_decay_norm=None`` (H), and the 3-stage cascade heads. Both models are built on the
meta device; every winpos parameter must get detectron2's lr and weight decay for the parameter of the same name.
"""
from functools import partial
from pathlib import Path

import pytest
from detectron2.config import LazyCall as L
from detectron2.config import instantiate
from detectron2.layers import ShapeSpec
from detectron2.model_zoo import get_config
from detectron2.modeling.backbone.vit import get_vit_lr_decay_rate
from detectron2.modeling.box_regression import Box2BoxTransform
from detectron2.modeling.matcher import Matcher
from detectron2.modeling.roi_heads import CascadeROIHeads, FastRCNNConvFCHead, FastRCNNOutputLayers

from tests.d2.test_configs import meta_parameters
from winpos.d2.config import load_config

COCO = Path(__file__).resolve().parents[2] / "configs" / "COCO"
# detectron2's projects/ViTDet values per size: (embed_dim, depth, heads, drop path, global blocks, layer decay)
PUBLISHED = {
    "b": (768, 12, 12, 0.1, (2, 5, 8, 11), 0.7),
    "l": (1024, 24, 16, 0.4, (5, 11, 17, 23), 0.8),
    "h": (1280, 32, 16, 0.5, (7, 15, 23, 31), 0.9),
}
CASES = [(size, cascade) for size in "blh" for cascade in (False, True)]


def detectron2_vitdet(size: str, cascade: bool):
    """detectron2's own ViTDet Mask R-CNN / Cascade model config and its AdamW config, with the published values."""
    dim, depth, heads, dp, global_blocks, decay = PUBLISHED[size]
    model = get_config("common/models/mask_rcnn_vitdet.py").model
    net = model.backbone.net
    net.embed_dim, net.depth, net.num_heads, net.drop_path_rate = dim, depth, heads, dp
    net.window_block_indexes = [i for i in range(depth) if i not in global_blocks]
    if cascade:  # projects/ViTDet cascade_mask_rcnn_vitdet_*: three LN 4conv1fc box heads, class-agnostic
        for key in ("box_head", "box_predictor", "proposal_matcher"):
            model.roi_heads.pop(key)
        model.roi_heads.update(
            _target_=CascadeROIHeads,
            box_heads=[L(FastRCNNConvFCHead)(input_shape=ShapeSpec(channels=256, height=7, width=7),
                                             conv_dims=[256] * 4, fc_dims=[1024], conv_norm="LN") for _ in range(3)],
            box_predictors=[L(FastRCNNOutputLayers)(input_shape=ShapeSpec(channels=1024), test_score_thresh=0.05,
                                                    box2box_transform=L(Box2BoxTransform)(weights=(w, w, w / 2, w / 2)),
                                                    cls_agnostic_bbox_reg=True, num_classes="${...num_classes}")
                            for w in (10, 20, 30)],
            proposal_matchers=[L(Matcher)(thresholds=[t], labels=[0, 1], allow_low_quality_matches=False)
                               for t in (0.5, 0.6, 0.7)])
    optimizer = get_config("common/optim.py").AdamW
    optimizer.params.lr_factor_func = partial(get_vit_lr_decay_rate, num_layers=depth, lr_decay_rate=decay)
    if size == "h":
        optimizer.params.overrides = {}
        optimizer.params.weight_decay_norm = None
    else:
        optimizer.params.overrides = {"pos_embed": {"weight_decay": 0.0}}
    return model, optimizer


def per_param(optimizer_cfg, model) -> dict:
    """``{parameter name: (lr, weight_decay)}`` as the optimizer ``optimizer_cfg`` sets them for ``model`` (a group
    without a key takes the optimizer's default)."""
    optimizer_cfg.params.model = model
    groups = instantiate(optimizer_cfg.params)
    default_wd = optimizer_cfg.weight_decay
    by_id = {id(p): (g["lr"], g.get("weight_decay", default_wd)) for g in groups for p in g["params"]}
    return {name: by_id[id(p)] for name, p in model.named_parameters()}


def detectron2_name(winpos_name: str) -> str:
    """winpos wraps its ViTDet in an adapter (``backbone.net.net.``) and keeps the abs embedding in a module."""
    name = winpos_name.replace("backbone.net.net.", "backbone.net.", 1)
    return name.replace("backbone.net.pos_embed.pos_embed", "backbone.net.pos_embed")


def winpos_config(size: str, cascade: bool) -> Path:
    epochs = "75ep" if size == "h" else "100ep"
    return COCO / f"{'cascade_' if cascade else ''}mask_rcnn_vitdet_{size}_{epochs}.py"


@pytest.mark.parametrize("size,cascade", CASES, ids=[f"{s}{'-cascade' if c else ''}" for s, c in CASES])
def test_original_vitdet_recipe_has_detectron2s_optimizer(size, cascade):
    ref_model_cfg, ref_opt_cfg = detectron2_vitdet(size, cascade)
    cfg = load_config(winpos_config(size, cascade))
    assert cfg.model.backbone.net.recipe == "original"
    with meta_parameters():
        ref_model, model = instantiate(ref_model_cfg), instantiate(cfg.model)
    want = per_param(ref_opt_cfg, ref_model)
    got = {detectron2_name(n): v for n, v in per_param(cfg.optimizer, model).items()}
    assert set(got) == set(want)  # the same parameters under the same names
    wrong = {n: (got[n], want[n]) for n in want if got[n][0] != pytest.approx(want[n][0], rel=1e-12)
             or got[n][1] != want[n][1]}
    assert not wrong, f"{len(wrong)} of {len(want)} parameters differ (winpos, detectron2): {sorted(wrong.items())[:4]}"
    decays = {wd for _, wd in want.values()}
    assert decays == ({0.1} if size == "h" else {0.0, 0.1})  # the oracle exercises both decays where it has them
