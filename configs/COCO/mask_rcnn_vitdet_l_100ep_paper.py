# Mask R-CNN ViTDet-L with the 'paper' position-encoding recipe (see winpos.backbones RECIPES).
from .mask_rcnn_vitdet_l_100ep_original import dataloader, lr_multiplier, model, optimizer, train

model.backbone.net.recipe = 'paper'
