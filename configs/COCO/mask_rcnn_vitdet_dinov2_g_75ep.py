# Mask R-CNN, ViTDet from DINOv2 ViT-g/14: 75 epochs = 138281 iterations at batch 64, lr steps at 122916 / 133159.
# mask_rcnn_vitdet_dinov2_b_100ep.py at g size (40 blocks of width 1536, SwiGLU MLP; global attention in blocks
# 9, 19, 29, 39), on ViTDet-H's schedule and rates: 3/4 of the 100-epoch schedule, layer-wise lr decay 0.9, drop path
# 0.5 (detectron2's mask_rcnn_vitdet_h_75ep.py). About 1.1 B trunk parameters: for memory, see use_checkpoint and
# train.grad_accum_steps in docs/recipes.md.
# Weights: https://huggingface.co/timm/vit_giant_patch14_dinov2.lvd142m (model.safetensors), Meta's
# dinov2_vitg14_pretrain.pth or transformers' facebook/dinov2-giant.
from ..common.schedule import coco_schedule
from .mask_rcnn_vitdet_dinov2_b_100ep import dataloader, model, optimizer, train

model.backbone.net.net = "vitdet_dinov2_g"
model.backbone.net.drop_path_rate = 0.5
optimizer.params.lr_decay_rate = 0.9
train.max_iter, lr_multiplier = coco_schedule(75)
train.init_checkpoint = "vit_giant_patch14_dinov2.lvd142m.safetensors"
