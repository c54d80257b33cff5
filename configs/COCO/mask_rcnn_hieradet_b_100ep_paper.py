# Mask R-CNN HieraDet-B 100ep with the 'paper' position-encoding recipe (see winpos.backbones RECIPES).
from .mask_rcnn_hieradet_b_100ep_original import dataloader, lr_multiplier, model, optimizer, train

model.backbone.bottom_up.recipe = 'paper'
