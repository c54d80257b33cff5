# Mask R-CNN, ViTDet-SAM3: 100 epochs = 184375 iterations at batch 64, lr steps at 163889 / 177546.
# SAM3's image encoder (Meta, 2025: ViT-L/14, 32 blocks, 24-token windows, a tiled absolute embedding and RoPE
# rescaled into the window; winpos.backbones.sam3_encoder) as the ViTDet trunk of detectron2's ViTDet-L recipe:
# LSJ at 1024 px, the same heads and optimizer, layer-wise lr decay 0.9 for 32 blocks (detectron2's ViTDet-H).
#
# Weights: sam3.pt from https://huggingface.co/facebook/sam3 (request access there); winpos reads the encoder out of
# the whole file (detector.backbone.vision_backbone.trunk.*) and reports everything else. Check it first with
#   winpos-convert --input sam3.pt --to vitdet_sam3 --output sam3_vitdet.pth
#   winpos-posemb doctor vitdet_sam3 --checkpoint sam3_vitdet.pth --image-size 1512 --rope-trained-size 1008
#
# Patch 14 becomes stride 16: detectron2's SimpleFeaturePyramid builds strides 4-32 from a stride-16 map (14 would
# give 3.5 / 7 / 14 / 28), so SAM3's 14 px kernel is resampled to 16 px on import (as detectron2 did for MAE's
# ViT-H/14, mae_pretrain_vit_huge_p14to16.pth). Token-level positions stay SAM3's: 24 x 24 windows, the 24 x 24
# tiled embedding, RoPE positions rescaled into the window. A 1024 px image gives 64 x 64 tokens, padded to 72 x 72
# in window blocks (SAM3 pads its windows the same way).
from ..common.schedule import coco_schedule
from .mask_rcnn_vitdet_b_100ep import dataloader, model, optimizer, train

model.backbone.net.net = "vitdet_sam3"
model.backbone.net.recipe = "original"  # SAM3's own positions (the only recipe of this family)
model.backbone.net.patch_size = 16
model.backbone.net.pretrain_img_size = 384  # SAM3's 24 x 24 pretraining grid at 16 px
model.backbone.net.drop_path_rate = 0.5
optimizer.params.lr_decay_rate = 0.9
train.max_iter, lr_multiplier = coco_schedule(100)
train.init_checkpoint = "sam3.pt"  # the downloaded file (see above)
