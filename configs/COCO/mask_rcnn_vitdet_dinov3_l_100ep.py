# Mask R-CNN, ViTDet from DINOv3 ViT-L/16: 100 epochs = 184375 iterations at batch 64, lr steps at 163889 / 177546.
# mask_rcnn_vitdet_dinov3_b_100ep.py at L size (24 blocks, lr decay 0.8).
# Weights: https://huggingface.co/timm/vit_large_patch16_dinov3.lvd1689m (model.safetensors) or Meta's
# dinov3_vitl16_pretrain_lvd1689m-*.pth (https://github.com/facebookresearch/dinov3, access on request) or
# transformers' facebook/dinov3-vitl16-pretrain-lvd1689m.
from .mask_rcnn_vitdet_dinov3_b_100ep import dataloader, lr_multiplier, model, optimizer, train

model.backbone.net.net = "vitdet_dinov3_l"
model.backbone.net.drop_path_rate = 0.4
optimizer.params.lr_decay_rate = 0.8
train.init_checkpoint = "vit_large_patch16_dinov3.lvd1689m.safetensors?allow_loss=True"  # storage tokens dropped
