"""detectron2's Mask R-CNN inference written so that ``torch.export`` can take it: the ``.pt2`` form of a detector.

``torch.export`` traces with symbolic sizes and refuses a Python branch on a value it cannot know when exporting:
the number of proposals left after the finite-box filter, the empty-box filter and NMS, or of detections above the
score threshold. detectron2's inference branches on exactly those (``if not valid_mask.all()``, ``if
keep.sum().item() != len(boxes)``, ``Boxes``' empty check, torchvision's choice of NMS by box count, ``Instances``'
length check), and ``ImageList.from_tensors`` turns the image size into tensors. ``ExportableRCNN`` computes the same
inference without those branches, from the detector's own modules and settings:

- the image normalized and padded as ``ImageList.from_tensors`` pads it (square padding or size divisibility),
  with the sizes as Python numbers;
- the RPN's top-k per level, the finite and non-empty filters applied unconditionally (a filter that keeps every
  box is the branch detectron2 skips), clipping, NMS per level, the post-NMS top-k;
- the ROI heads (standard or cascade: the stages' scores averaged, the last stage's boxes), multi-level ROI
  pooling, the score threshold, NMS per class, the top-k per image, and the mask head's class-specific
  probabilities.

NMS per group runs torchvision's ``nms`` on each group in turn (a loop over the levels or classes, fixed when
exporting) and orders the kept boxes by score, as torchvision's ``batched_nms`` does for more than 1000 boxes on the
CPU; below that torchvision offsets the boxes by group instead, which can only differ where an IoU is within
float32 rounding of the threshold. The output is ``detectron2.export.TracingAdapter``'s for the same detector and
``model.inference(..., do_postprocess=False)``: ``(pred_boxes, pred_classes, pred_masks, scores, image_size)``
(the instances' fields in name order, then the size), boxes at the input's size, masks the ROI heads' 28x28
probabilities. ``tests/d2/test_export_program.py`` checks it against detectron2's own inference.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn as nn

from winpos.errors import WinposError

__all__ = ["ExportableRCNN", "nms_any_count", "padded_size"]


def padded_size(h: int, w: int, size_divisibility: int, padding_constraints: dict | None) -> tuple[int, int]:
    """The size ``ImageList.from_tensors`` pads one ``h x w`` image to; an image larger than the square padding
    (which detectron2 would crop) is refused."""
    padding_constraints = padding_constraints or {}
    square = padding_constraints.get("square_size", 0)
    if square > 0:
        if h > square or w > square:
            raise WinposError(f"a {h}x{w} image is larger than the detector's square padding {square}x{square} "
                              f"(detectron2 would crop it); use sizes up to {square}x{square}")
        h = w = square
    divisor = padding_constraints.get("size_divisibility", size_divisibility)
    if divisor > 1:
        h, w = -(-h // divisor) * divisor, -(-w // divisor) * divisor
    return h, w


@contextmanager
def nms_any_count():
    """While exporting, torchvision's ``nms`` may keep any number of boxes, 0 and 1 included.

    torchvision's shape rule for ``nms`` (0.29) declares the kept count with a lower bound of 2, so a program exported
    with it asserts at run time that every NMS keeps at least two boxes, and fails on an image where a class or level
    has a single candidate. This rule says only that the count lies between 0 and the number of boxes; it is
    registered for the block and removed after, torchvision's own coming back.
    """
    lib = torch.library.Library("torchvision", "FRAGMENT")  # holds the rule; destroying it removes the rule

    def kept_count(dets, scores, iou_threshold):
        torch._check(dets.dim() == 2 and dets.size(1) == 4, lambda: f"nms boxes must be (N, 4), not {tuple(dets.shape)}")
        torch._check(scores.dim() == 1 and scores.size(0) == dets.size(0),
                     lambda: f"nms scores must be (N,) for (N, 4) boxes, not {tuple(scores.shape)}")
        count = torch.library.get_ctx().new_dynamic_size(min=0)
        torch._check(count <= dets.size(0))
        return dets.new_empty(count, dtype=torch.long)

    torch.library.register_fake("torchvision::nms", kept_count, lib=lib)
    try:
        yield
    finally:
        lib._destroy()


def _clip(boxes: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """``Boxes.clip`` without its finiteness assertion (the callers drop non-finite boxes first)."""
    x1, y1, x2, y2 = boxes.unbind(-1)
    return torch.stack((x1.clamp(min=0, max=w), y1.clamp(min=0, max=h), x2.clamp(min=0, max=w),
                        y2.clamp(min=0, max=h)), dim=-1)


def _nms_per_group(boxes: torch.Tensor, scores: torch.Tensor, groups: torch.Tensor, num_groups: int,
                   threshold: float) -> torch.Tensor:
    """Indices of the boxes NMS keeps within each group ``0 .. num_groups-1``, by descending score."""
    from torchvision.ops import nms

    boxes = boxes.float()
    kept = torch.zeros_like(scores, dtype=torch.bool)
    for g in range(num_groups):
        members = torch.nonzero(groups == g).squeeze(1)
        chosen = members[nms(boxes[members], scores[members], threshold)]
        kept = kept.index_put((chosen,), torch.ones_like(chosen, dtype=torch.bool))
    keep = torch.nonzero(kept).squeeze(1)
    return keep[scores[keep].sort(descending=True)[1]]


def _pool(pooler, features: list[torch.Tensor], boxes: torch.Tensor) -> torch.Tensor:
    """``ROIPooler`` on one image's boxes: each box pooled from the pyramid level its size assigns it (FPN's
    rule), written back in the boxes' order."""
    rois = torch.cat([boxes.new_zeros(boxes.shape[0], 1), boxes], dim=1)
    if len(pooler.level_poolers) == 1:
        return pooler.level_poolers[0](features[0], rois)
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    level = torch.floor(pooler.canonical_level + torch.log2(torch.sqrt(area) / pooler.canonical_box_size + 1e-8))
    level = torch.clamp(level, min=pooler.min_level, max=pooler.max_level).to(torch.int64) - pooler.min_level
    out = rois.new_zeros(rois.shape[0], features[0].shape[1], *pooler.output_size)
    for i, level_pooler in enumerate(pooler.level_poolers):
        members = torch.nonzero(level == i).squeeze(1)
        out = out.index_put((members,), level_pooler(features[i], rois[members]))
    return out


class ExportableRCNN(nn.Module):
    """A ``GeneralizedRCNN`` (RPN, standard or cascade ROI heads, an optional mask head) as one module from a
    ``(3, H, W)`` image in the config's pixel format to ``TracingAdapter``'s flattened instances."""

    def __init__(self, model):
        super().__init__()
        from detectron2.modeling import GeneralizedRCNN
        from detectron2.modeling.proposal_generator import RPN
        from detectron2.modeling.roi_heads import CascadeROIHeads, StandardROIHeads

        if not isinstance(model, GeneralizedRCNN):
            raise WinposError(f"the config's model is a {type(model).__name__}; .pt2 export takes detectron2's "
                              "GeneralizedRCNN detectors: export the backbone instead (winpos-export backbone PRESET)")
        heads = model.roi_heads
        unsupported = [what for what, bad in [
            (f"the proposal generator {type(model.proposal_generator).__name__}",
             not isinstance(model.proposal_generator, RPN)),
            (f"the ROI heads {type(heads).__name__}", not isinstance(heads, StandardROIHeads)),
            ("a keypoint head", getattr(heads, "keypoint_on", False)),
            ("rotated boxes", type(heads.box_pooler.level_poolers[0]).__name__ == "ROIAlignRotated"),
        ] if bad]
        if unsupported:
            raise WinposError(f"the detector has {', '.join(unsupported)}, which the .pt2 form does not compute "
                              "(RPN with standard or cascade ROI heads, boxes and masks only); use --formats "
                              "onnx,torchscript")
        self.model = model
        self.cascade = isinstance(heads, CascadeROIHeads)

    def forward(self, image: torch.Tensor):
        m = self.model
        h, w = image.shape[-2], image.shape[-1]
        ph, pw = padded_size(h, w, m.backbone.size_divisibility, m.backbone.padding_constraints)
        x = (image.to(m.pixel_mean) - m.pixel_mean) / m.pixel_std
        x = nn.functional.pad(x, (0, pw - w, 0, ph - h))[None]
        features = m.backbone(x)
        proposals = self._proposals(features, h, w)
        boxes, scores, classes = self._detections(features, proposals, h, w)
        out = [boxes, classes]
        if m.roi_heads.mask_on:
            out.append(self._masks(features, boxes, classes))
        return (*out, scores, torch.tensor([h, w]))

    def _proposals(self, features, h: int, w: int) -> torch.Tensor:
        """``RPN.forward`` and ``find_top_rpn_proposals`` for one image at test time: the proposal boxes."""
        rpn = self.model.proposal_generator
        maps = [features[f] for f in rpn.in_features]
        anchors = rpn.anchor_generator(maps)
        logits, deltas = rpn.rpn_head(maps)
        pre_topk, post_topk = rpn.pre_nms_topk[False], rpn.post_nms_topk[False]
        level_boxes, level_scores, level_ids = [], [], []
        for i, (anchors_i, logits_i, deltas_i) in enumerate(zip(anchors, logits, deltas)):
            logits_i = logits_i.permute(0, 2, 3, 1).flatten()  # (Hi*Wi*A,), A fastest
            box_dim = rpn.anchor_generator.box_dim
            deltas_i = deltas_i.view(-1, box_dim, *deltas_i.shape[-2:]).permute(2, 3, 0, 1).reshape(-1, box_dim)
            boxes_i = rpn.box2box_transform.apply_deltas(deltas_i, anchors_i.tensor)
            k = min(logits_i.shape[0], pre_topk)
            scores_i, top = logits_i.topk(k)
            level_boxes.append(boxes_i[top])
            level_scores.append(scores_i)
            level_ids.append(torch.full((k,), i, dtype=torch.int64, device=logits_i.device))
        boxes, scores, ids = torch.cat(level_boxes), torch.cat(level_scores), torch.cat(level_ids)
        finite = torch.nonzero(torch.isfinite(boxes).all(dim=1) & torch.isfinite(scores)).squeeze(1)
        boxes, scores, ids = _clip(boxes[finite], h, w), scores[finite], ids[finite]
        size = rpn.min_box_size
        nonempty = torch.nonzero(((boxes[:, 2] - boxes[:, 0]) > size) & ((boxes[:, 3] - boxes[:, 1]) > size))
        boxes, scores, ids = boxes[nonempty.squeeze(1)], scores[nonempty.squeeze(1)], ids[nonempty.squeeze(1)]
        keep = _nms_per_group(boxes, scores, ids, len(maps), rpn.nms_thresh)[:post_topk]
        return boxes[keep]

    def _stage(self, features, boxes: torch.Tensor, stage: int | None):
        """One box head on ``boxes``: (class probabilities, class-specific or agnostic boxes)."""
        heads = self.model.roi_heads
        maps = [features[f] for f in heads.box_in_features]
        head = heads.box_head if stage is None else heads.box_head[stage]
        predictor = heads.box_predictor if stage is None else heads.box_predictor[stage]
        logits, deltas = predictor(head(_pool(heads.box_pooler, maps, boxes)))
        probs = logits.sigmoid() if predictor.use_sigmoid_ce else nn.functional.softmax(logits, dim=-1)
        return probs, predictor.box2box_transform.apply_deltas(deltas, boxes), predictor

    def _detections(self, features, proposals: torch.Tensor, h: int, w: int):
        """The ROI heads' box branch and ``fast_rcnn_inference_single_image``: boxes, scores, classes."""
        heads = self.model.roi_heads
        if self.cascade:
            stage_probs, boxes = [], proposals
            for k in range(heads.num_cascade_stages):
                if k > 0:
                    boxes = _clip(boxes.detach(), h, w)
                probs, predicted, predictor = self._stage(features, boxes, k)
                stage_probs.append(probs)
                boxes = predicted
            probs = sum(stage_probs) * (1.0 / heads.num_cascade_stages)
        else:
            probs, boxes, predictor = self._stage(features, proposals, None)
        finite = torch.nonzero(torch.isfinite(boxes).all(dim=1) & torch.isfinite(probs).all(dim=1)).squeeze(1)
        boxes, probs = boxes[finite], probs[finite][:, :-1]
        per_class = boxes.shape[1] // 4
        boxes = _clip(boxes.reshape(-1, 4), h, w).view(-1, per_class, 4)
        candidates = torch.nonzero(probs > predictor.test_score_thresh)  # (proposal, class), row-major
        boxes = boxes[candidates[:, 0], 0 if per_class == 1 else candidates[:, 1]]
        scores = probs[candidates[:, 0], candidates[:, 1]]
        keep = _nms_per_group(boxes, scores, candidates[:, 1], probs.shape[1], predictor.test_nms_thresh)
        if predictor.test_topk_per_image >= 0:
            keep = keep[:predictor.test_topk_per_image]
        return boxes[keep], scores[keep], candidates[keep, 1]

    def _masks(self, features, boxes: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
        """The mask head's probabilities for each detection's class, ``(N, 1, M, M)``."""
        heads = self.model.roi_heads
        maps = [features[f] for f in heads.mask_in_features]
        logits = heads.mask_head.layers(_pool(heads.mask_pooler, maps, boxes))
        if logits.shape[1] == 1:
            return logits.sigmoid()
        return logits[torch.arange(logits.shape[0], device=logits.device), classes][:, None].sigmoid()
