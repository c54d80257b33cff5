# Mask R-CNN ViTDet-B 100ep with the 'rope' position-encoding recipe (see winpos.backbones RECIPES).
from .mask_rcnn_vitdet_b_100ep_original import dataloader, lr_multiplier, model, optimizer, train

model.backbone.net.recipe = 'rope'
