# Tiny HieraDet + FPN Mask R-CNN on the shapes dataset (CPU, minutes).
# Position encoding: official Hiera's flat abs embedding, naively interpolated (the bug), no block terms.
from ..common.models.mask_rcnn_hieradet import model
from ..common.shapes import dataloader, lr_multiplier, optimizer, shrink_heads, train

model.backbone.bottom_up.net = "hieradet_tiny"
model.backbone.bottom_up.recipe = "original"
model.backbone.bottom_up.img_size = 256
model.backbone.bottom_up.drop_path_rate = 0.0
model.backbone.bottom_up.window_spec = (8, 4, 8, 4)
model.backbone.bottom_up.pos_embed = "abs"
model = shrink_heads(model)
train.output_dir = "./output/shapes/mask_rcnn_hieradet_tiny_abs"
