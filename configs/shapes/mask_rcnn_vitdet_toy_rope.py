# Tiny ViTDet + SimpleFeaturePyramid Mask R-CNN on the shapes dataset (CPU, minutes).
# Position encoding: abs-win + axial RoPE in every block.
from ..common.models.mask_rcnn_vitdet import model
from ..common.shapes import dataloader, lr_multiplier, optimizer, train, tiny_vitdet

model = tiny_vitdet(model, "rope")
train.output_dir = "./output/shapes/mask_rcnn_vitdet_toy_rope"
