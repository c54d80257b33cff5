# Cascade Mask R-CNN on top of mask_rcnn_hieradet_l_100ep.py (three box stages, IoU 0.5/0.6/0.7); the
# position-encoding recipe is the same override as there.
from ..common.models.cascade import to_cascade
from .mask_rcnn_hieradet_l_100ep import dataloader, lr_multiplier, model, optimizer, train

model = to_cascade(model)
