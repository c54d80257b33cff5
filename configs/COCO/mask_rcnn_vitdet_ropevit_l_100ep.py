# Mask R-CNN, ViTDet from RoPE-ViT-L/16: 100 epochs = 184375 iterations at batch 64, lr steps at 163889 / 177546.
# mask_rcnn_vitdet_ropevit_b_100ep.py at L size (24 blocks, lr
# decay 0.8). Weights: https://huggingface.co/timm/vit_large_patch16_rope_mixed_224.naver_in1k (model.safetensors)
# or the authors' rope_mixed_deit_large_patch16_LS (https://github.com/naver-ai/rope-vit).
from .mask_rcnn_vitdet_ropevit_b_100ep import dataloader, lr_multiplier, model, optimizer, train

model.backbone.net.net = "vitdet_ropevit_l"
model.backbone.net.drop_path_rate = 0.4
optimizer.params.lr_decay_rate = 0.8
train.init_checkpoint = "vit_large_patch16_rope_mixed_224.naver_in1k.safetensors"
