# Tiny HieraDet + FPN Mask R-CNN on the shapes dataset (CPU, minutes).
# Position encoding: abs embedding + decomposed relpos in every block (MViTv2 style).
from ..common.models.mask_rcnn_hieradet import model
from ..common.shapes import dataloader, lr_multiplier, optimizer, train, tiny_hieradet

model = tiny_hieradet(model, "original", pos_embed="abs", window_pos="relpos", global_pos="relpos")
train.output_dir = "./output/shapes/mask_rcnn_hieradet_toy_abs_relpos"
