# Turn a Mask R-CNN config into Cascade Mask R-CNN: three box stages at IoU 0.5 / 0.6 / 0.7 with box weights
# (10,10,5,5), (20,20,10,10), (30,30,15,15) and class-agnostic regression (detectron2's ViTDet cascade recipe).
from detectron2.config import LazyCall as L
from detectron2.layers import ShapeSpec
from detectron2.modeling.box_regression import Box2BoxTransform
from detectron2.modeling.matcher import Matcher
from detectron2.modeling.roi_heads import CascadeROIHeads, FastRCNNConvFCHead, FastRCNNOutputLayers


def to_cascade(model):
    """Replace ``model.roi_heads``' single box stage by three cascade stages, in place; returns ``model``."""
    for key in ("box_head", "box_predictor", "proposal_matcher"):
        model.roi_heads.pop(key)
    model.roi_heads.update(
        _target_=CascadeROIHeads,
        box_heads=[
            L(FastRCNNConvFCHead)(
                input_shape=ShapeSpec(channels=256, height=7, width=7),
                conv_dims=[256, 256, 256, 256],
                fc_dims=[1024],
                conv_norm="LN",
            )
            for _ in range(3)
        ],
        box_predictors=[
            L(FastRCNNOutputLayers)(
                input_shape=ShapeSpec(channels=1024),
                test_score_thresh=0.05,
                box2box_transform=L(Box2BoxTransform)(weights=(w, w, w / 2, w / 2)),
                cls_agnostic_bbox_reg=True,
                num_classes="${...num_classes}",
            )
            for w in (10, 20, 30)
        ],
        proposal_matchers=[
            L(Matcher)(thresholds=[iou], labels=[0, 1], allow_low_quality_matches=False) for iou in (0.5, 0.6, 0.7)
        ],
    )
    return model
