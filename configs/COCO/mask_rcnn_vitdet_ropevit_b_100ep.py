# Mask R-CNN, ViTDet from RoPE-ViT-B/16 (RoPE-Mixed, IN-1k): 100 epochs = 184375 iterations at batch 64, lr steps at
# 163889 / 177546. RoPE-ViT (Heo et al., ECCV 2024; winpos.backbones.rope_vits), whose authors released no detection
# code, as the trunk of detectron2's ViTDet-B recipe: LSJ at 1024 px, the same heads and optimizer, layer-wise lr
# decay 0.7 over 12 blocks. Its own positions (recipe "mixed"): the learned frequencies of every block and head on
# integer positions, local to each window (global blocks: positions up to 64 extrapolate beyond the 14 x 14 grid of
# pretraining). Axial weights (vit_base_patch16_rope_224): model.backbone.net.recipe=original.
#
# Weights: https://huggingface.co/timm/vit_base_patch16_rope_mixed_224.naver_in1k (model.safetensors) or the authors'
# rope_mixed_deit_base_patch16_LS (https://github.com/naver-ai/rope-vit); both layouts are read.
from ..common.schedule import coco_schedule
from .mask_rcnn_vitdet_b_100ep import dataloader, model, optimizer, train

model.backbone.net.net = "vitdet_ropevit_b"
model.backbone.net.recipe = "mixed"
model.backbone.net.drop_path_rate = 0.1
optimizer.params.lr_decay_rate = 0.7
# LayerScale gains take no weight decay, as in the family's own training (timm / DeiT-III: none on 1-D parameters);
# pos_embed and the learned frequencies (rope) are exempt already
optimizer.params.overrides = {**optimizer.params.overrides, ".gamma": {"weight_decay": 0.0}}
train.max_iter, lr_multiplier = coco_schedule(100)
train.init_checkpoint = "vit_base_patch16_rope_mixed_224.naver_in1k.safetensors"  # the downloaded file (see above)
