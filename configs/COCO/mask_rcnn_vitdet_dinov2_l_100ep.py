# Mask R-CNN, ViTDet from DINOv2 ViT-L/14: 100 epochs = 184375 iterations at batch 64, lr steps at 163889 / 177546.
# mask_rcnn_vitdet_dinov2_b_100ep.py at L size (24 blocks, lr decay 0.8).
# Weights: https://huggingface.co/timm/vit_large_patch14_dinov2.lvd142m (model.safetensors), Meta's
# dinov2_vitl14_pretrain.pth or transformers' facebook/dinov2-large.
from .mask_rcnn_vitdet_dinov2_b_100ep import dataloader, lr_multiplier, model, optimizer, train

model.backbone.net.net = "vitdet_dinov2_l"
model.backbone.net.drop_path_rate = 0.4
optimizer.params.lr_decay_rate = 0.8
train.init_checkpoint = "vit_large_patch14_dinov2.lvd142m.safetensors"
