# Cascade Mask R-CNN, HieraDet-L: 100 epochs = 184375 iterations at batch 64, lr steps at 163889 / 177546.
# mask_rcnn_hieradet_l_100ep.py with three box stages (IoU 0.5 / 0.6 / 0.7, detectron2's ViTDet cascade); the
# position-encoding recipe is the same override as there.
from ..common.models.cascade import to_cascade
from .mask_rcnn_hieradet_l_100ep import dataloader, lr_multiplier, model, optimizer, train

model = to_cascade(model)
