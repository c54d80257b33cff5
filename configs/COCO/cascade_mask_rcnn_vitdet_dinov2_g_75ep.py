# Cascade Mask R-CNN, ViTDet from DINOv2 g/14: 75 epochs = 138281 iterations at batch 64, lr steps at 122916 / 133159.
# mask_rcnn_vitdet_dinov2_g_75ep.py (trunk, weights and their download there) with three box stages at IoU
# 0.5 / 0.6 / 0.7, as detectron2's cascade ViTDet recipes.
from ..common.models.cascade import to_cascade
from .mask_rcnn_vitdet_dinov2_g_75ep import dataloader, lr_multiplier, model, optimizer, train

model = to_cascade(model)
