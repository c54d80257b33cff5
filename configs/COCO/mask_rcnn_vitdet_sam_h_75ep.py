# Mask R-CNN, ViTDet from SAM ViT-H: 75 epochs = 138281 iterations at batch 64, lr steps at 122916 / 133159.
# mask_rcnn_vitdet_sam_b_100ep.py at H size: detectron2's ViTDet-H recipe (32 blocks, global blocks 7 / 15 / 23 /
# 31, lr decay 0.9, drop path 0.5, 75 epochs) from sam_vit_h_4b8939.pth
# (https://dl.fbaipublicfiles.com/segment_anything/) or transformers' facebook/sam-vit-huge folder. SAM-H's patch is
# 16 px, so no kernel is resampled (MAE's ViT-H/14 needs p14to16).
from .mask_rcnn_vitdet_h_75ep import dataloader, lr_multiplier, model, optimizer, train

model.backbone.net.pretrain_img_size = 1024  # SAM's 64 x 64 embedding grid at 16 px
model.backbone.net.pretrain_use_cls_token = False
train.init_checkpoint = "sam_vit_h_4b8939.pth"
