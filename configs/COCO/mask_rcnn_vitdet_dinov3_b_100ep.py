# Mask R-CNN, ViTDet from DINOv3 ViT-B/16: 100 epochs = 184375 iterations at batch 64, lr steps at 163889 / 177546.
# DINOv3 (Meta, 2025; winpos.backbones.rope_vits) as the trunk of detectron2's ViTDet-B recipe: LSJ at 1024 px, the
# same heads and optimizer, layer-wise lr decay 0.7 over 12 blocks. DINOv3's own positions (recipe "original"): no
# token embedding, axial RoPE on centered coordinates of each window (global blocks: of the grid).
#
# Weights: timm's vit_base_patch16_dinov3.lvd1689m (https://huggingface.co/timm/vit_base_patch16_dinov3.lvd1689m,
# model.safetensors), Meta's dinov3_vitb16_pretrain_lvd1689m-*.pth (https://github.com/facebookresearch/dinov3,
# access on request) or transformers' facebook/dinov3-vitb16-pretrain-lvd1689m (model.safetensors); all are read.
# Its four storage tokens have no place in a windowed trunk: the import drops them and reports it (winpos-convert
# says so and needs --allow-loss; here the path's ?allow_loss=True accepts that loss and no other: without it the
# run stops at the load). Check the file first with
#   winpos-convert --input model.safetensors --to vitdet_dinov3_b --output dinov3_b.pth --allow-loss
from ..common.schedule import coco_schedule
from .mask_rcnn_vitdet_b_100ep import dataloader, model, optimizer, train

model.backbone.net.net = "vitdet_dinov3_b"
model.backbone.net.recipe = "original"
model.backbone.net.drop_path_rate = 0.1
optimizer.params.lr_decay_rate = 0.7
# LayerScale gains take no weight decay, as in DINOv3's own training (none on 1-D parameters)
optimizer.params.overrides = {**optimizer.params.overrides, ".gamma": {"weight_decay": 0.0}}
train.max_iter, lr_multiplier = coco_schedule(100)
train.init_checkpoint = "vit_base_patch16_dinov3.lvd1689m.safetensors?allow_loss=True"  # the downloaded file
