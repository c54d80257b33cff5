# Mask R-CNN, ViTDet from SAM ViT-L: 100 epochs = 184375 iterations at batch 64, lr steps at 163889 / 177546.
# mask_rcnn_vitdet_sam_b_100ep.py at L size: detectron2's ViTDet-L recipe (24 blocks, global blocks 5 / 11 / 17 /
# 23, lr decay 0.8, drop path 0.4) from sam_vit_l_0b3195.pth (https://dl.fbaipublicfiles.com/segment_anything/) or
# transformers' facebook/sam-vit-large folder.
from .mask_rcnn_vitdet_l_100ep import dataloader, lr_multiplier, model, optimizer, train

model.backbone.net.pretrain_img_size = 1024  # SAM's 64 x 64 embedding grid at 16 px
model.backbone.net.pretrain_use_cls_token = False
train.init_checkpoint = "sam_vit_l_0b3195.pth"
