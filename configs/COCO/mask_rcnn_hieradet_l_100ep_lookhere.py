# Mask R-CNN HieraDet-L with the 'lookhere' position-encoding recipe (see winpos.backbones RECIPES).
from .mask_rcnn_hieradet_l_100ep_original import dataloader, lr_multiplier, model, optimizer, train

model.backbone.bottom_up.recipe = 'lookhere'
