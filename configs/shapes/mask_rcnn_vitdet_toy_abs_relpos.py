# Tiny ViTDet + SimpleFeaturePyramid Mask R-CNN on the shapes dataset (CPU, minutes).
# Position encoding: detectron2's encoding: abs interpolated + relpos in every block.
from ..common.models.mask_rcnn_vitdet import model
from ..common.shapes import dataloader, lr_multiplier, optimizer, train, tiny_vitdet

model = tiny_vitdet(model, "original")
train.output_dir = "./output/shapes/mask_rcnn_vitdet_toy_abs_relpos"
