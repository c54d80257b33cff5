# Cascade Mask R-CNN, ViTDet from SAM ViT-B: 100 epochs = 184375 iterations at batch 64, lr steps at 163889 / 177546.
# mask_rcnn_vitdet_sam_b_100ep.py (SAM's encoder as the trunk; weights there) with three box stages at IoU 0.5 / 0.6 /
# 0.7, as detectron2's cascade ViTDet recipes.
from ..common.models.cascade import to_cascade
from .mask_rcnn_vitdet_sam_b_100ep import dataloader, lr_multiplier, model, optimizer, train

model = to_cascade(model)
