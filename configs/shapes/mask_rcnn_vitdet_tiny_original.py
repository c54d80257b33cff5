# Tiny ViTDet + SimpleFeaturePyramid Mask R-CNN on the shapes dataset (CPU, minutes).
# Position encoding: detectron2's encoding: abs interpolated + relpos in every block.
from ..common.models.mask_rcnn_vitdet import model
from ..common.shapes import dataloader, lr_multiplier, optimizer, shrink_heads, train

model.backbone.net.net = "vitdet_tiny"
model.backbone.net.recipe = "original"
model.backbone.net.img_size = 256
model.backbone.net.drop_path_rate = 0.0
model.backbone.net.window_size = 8
model = shrink_heads(model)
train.output_dir = "./output/shapes/mask_rcnn_vitdet_tiny_original"
