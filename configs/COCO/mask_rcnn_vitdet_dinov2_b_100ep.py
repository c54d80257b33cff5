# Mask R-CNN, ViTDet from DINOv2 ViT-B/14: 100 epochs = 184375 iterations at batch 64, lr steps at 163889 / 177546.
# DINOv2 (Meta, 2023; winpos.backbones.dinov2) as the trunk of detectron2's ViTDet-B recipe: LSJ at 1024 px, the
# same heads and optimizer, layer-wise lr decay 0.7 over 12 blocks. DINOv2 learned an absolute embedding (37 x 37 at
# 518 px) without windows; recipe "paper" tiles it under ViTDet's 14 x 14 windows as the abs-win window embedding
# with its 37 x 37 global part interpolated (the import is exact); "original" would interpolate it whole, the
# window-attention bug (winpos-posemb doctor says [BUG]). Patch 14 becomes stride 16 on import (kernel resampled).
#
# Weights: timm's vit_base_patch14_dinov2.lvd142m (https://huggingface.co/timm/vit_base_patch14_dinov2.lvd142m,
# model.safetensors), Meta's dinov2_vitb14_pretrain.pth (https://github.com/facebookresearch/dinov2) or
# transformers' facebook/dinov2-base (model.safetensors); all three layouts are read. The *_reg4 models' register
# tokens have no place in a windowed trunk: their import reports the loss and needs ?allow_loss=True. Check the
# file first with
#   winpos-convert --input model.safetensors --to vitdet_dinov2_b --recipe paper --output dinov2_b.pth
from ..common.schedule import coco_schedule
from .mask_rcnn_vitdet_b_100ep import dataloader, model, optimizer, train

model.backbone.net.net = "vitdet_dinov2_b"
model.backbone.net.recipe = "paper"
model.backbone.net.drop_path_rate = 0.1
optimizer.params.lr_decay_rate = 0.7
# LayerScale gains take no weight decay (none on 1-D parameters, as in DINOv2's own training)
optimizer.params.overrides = {**optimizer.params.overrides, ".gamma": {"weight_decay": 0.0}}
train.max_iter, lr_multiplier = coco_schedule(100)
train.init_checkpoint = "vit_base_patch14_dinov2.lvd142m.safetensors"  # the downloaded file
