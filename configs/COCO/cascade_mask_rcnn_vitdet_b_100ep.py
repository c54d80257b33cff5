# Cascade Mask R-CNN, ViTDet-B: 100 epochs = 184375 iterations at batch 64, lr steps at 163889 / 177546.
# detectron2's cascade_mask_rcnn_vitdet_b_100ep.py: mask_rcnn_vitdet_b_100ep.py with three box stages (IoU
# 0.5 / 0.6 / 0.7); the position-encoding recipe is the same override as there.
from ..common.models.cascade import to_cascade
from .mask_rcnn_vitdet_b_100ep import dataloader, lr_multiplier, model, optimizer, train

model = to_cascade(model)
