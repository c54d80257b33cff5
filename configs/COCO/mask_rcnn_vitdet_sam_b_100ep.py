# Mask R-CNN, ViTDet from SAM ViT-B: 100 epochs = 184375 iterations at batch 64, lr steps at 163889 / 177546.
# detectron2's ViTDet-B recipe (mask_rcnn_vitdet_b_100ep.py: LSJ at 1024 px, heads, schedule, optimizer) with the
# trunk initialized from Segment Anything's image encoder (Kirillov et al. 2023), which is a ViTDet trunk already:
# 14-token windows, global blocks 2 / 5 / 8 / 11, relpos in every block, pretrained at 1024 px. Its absolute
# embedding is a 64 x 64 grid without a cls row (pretrain_img_size=1024, pretrain_use_cls_token=False below), so at
# COCO's 1024 px it is used as stored, never interpolated: the doctor says [OK] for the `original` recipe here, and
# [BUG] when the image size changes (`winpos-posemb doctor COCO/mask_rcnn_vitdet_sam_b_100ep.py --image-size 1536`).
# At another size use abs-win from SAM's own grid, exact at import:
#   model.backbone.net.recipe=paper model.backbone.net.pos_global_size=64   (the doctor at 1536 px: no [BUG])
#
# Weights: sam_vit_b_01ec64.pth from https://dl.fbaipublicfiles.com/segment_anything/ (the whole SAM model: winpos
# reads the encoder under image_encoder. and reports the prompt encoder and mask decoder), or transformers'
# facebook/sam-vit-base folder. Check it first with
#   winpos-convert --input sam_vit_b_01ec64.pth --output sam_b.safetensors   (the preset that fits: vitdet_b)
from .mask_rcnn_vitdet_b_100ep import dataloader, lr_multiplier, model, optimizer, train

model.backbone.net.pretrain_img_size = 1024  # SAM's 64 x 64 embedding grid at 16 px
model.backbone.net.pretrain_use_cls_token = False
train.init_checkpoint = "sam_vit_b_01ec64.pth"  # the downloaded file (see above)
