# Mask R-CNN, ViTDet from EVA-02 L/14: 100 epochs = 184375 iterations at batch 64, lr steps at 163889 / 177546.
# mask_rcnn_vitdet_eva02_b_100ep.py at L size (24 blocks, lr decay 0.8).
# Weights: https://huggingface.co/timm/eva02_large_patch14_224.mim_in22k (model.safetensors) or the authors'
# eva02_L_pt_in21k_p14.pt (https://huggingface.co/Yuxin-CV/EVA-02, eva02/pt/).
from .mask_rcnn_vitdet_eva02_b_100ep import dataloader, lr_multiplier, model, optimizer, train

model.backbone.net.net = "vitdet_eva02_l"
model.backbone.net.drop_path_rate = 0.4
optimizer.params.lr_decay_rate = 0.8
train.init_checkpoint = "eva02_large_patch14_224.mim_in22k.safetensors"
