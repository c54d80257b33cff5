# Tiny HieraDet + FPN Mask R-CNN on the shapes dataset (CPU, minutes).
# Position encoding: abs-win + axial RoPE in every block.
from ..common.models.mask_rcnn_hieradet import model
from ..common.shapes import dataloader, lr_multiplier, optimizer, train, tiny_hieradet

model = tiny_hieradet(model, "rope")
train.output_dir = "./output/shapes/mask_rcnn_hieradet_toy_rope"
