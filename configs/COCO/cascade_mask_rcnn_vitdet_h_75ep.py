# Cascade Mask R-CNN, ViTDet-H: 75 epochs = 138281 iterations at batch 64, lr steps at 122916 / 133159.
# detectron2's cascade_mask_rcnn_vitdet_h_75ep.py (58.7 box AP): mask_rcnn_vitdet_h_75ep.py with three box stages
# (IoU 0.5 / 0.6 / 0.7); the position-encoding recipe is the same override as there.
from ..common.models.cascade import to_cascade
from .mask_rcnn_vitdet_h_75ep import dataloader, lr_multiplier, model, optimizer, train

model = to_cascade(model)
