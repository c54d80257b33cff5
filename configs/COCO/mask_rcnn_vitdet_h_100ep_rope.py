# Mask R-CNN ViTDet-H with the 'rope' position-encoding recipe (see winpos.backbones RECIPES).
from .mask_rcnn_vitdet_h_100ep_original import dataloader, lr_multiplier, model, optimizer, train

model.backbone.net.recipe = 'rope'
