# Mask R-CNN, ViTDet from EVA-02 B/14 (MIM, IN-22k): 100 epochs = 184375 iterations at batch 64, lr steps at
# 163889 / 177546. EVA-02 (winpos.backbones.rope_vits) as the trunk of detectron2's ViTDet-B recipe: LSJ at 1024 px,
# the same heads and optimizer, layer-wise lr decay 0.7 over 12 blocks, windows of 16 tokens (EVA-02's own
# detector's). EVA-02's own positions (recipe "original"): its absolute embedding bicubic-resized to the grid, as
# EVA-02's detector does under windows (the abs-win bug: model.backbone.net.recipe=paper tiles it instead, exact
# since the window is the 16 x 16 pretraining grid) and RoPE positions rescaled into that grid.
#
# Patch 14 becomes stride 16: detectron2's SimpleFeaturePyramid builds strides 4-32 from a stride-16 map, so the
# 14 px kernel is resampled to 16 px on import; the 16 x 16 pretraining grid is then that of 256 px.
# Weights: https://huggingface.co/timm/eva02_base_patch14_224.mim_in22k (model.safetensors) or the authors'
# eva02_B_pt_in21k_p14.pt (https://huggingface.co/Yuxin-CV/EVA-02, eva02/pt/); both layouts are read.
from ..common.schedule import coco_schedule
from .mask_rcnn_vitdet_b_100ep import dataloader, model, optimizer, train

model.backbone.net.net = "vitdet_eva02_b"
model.backbone.net.recipe = "original"
model.backbone.net.drop_path_rate = 0.1
optimizer.params.lr_decay_rate = 0.7
train.max_iter, lr_multiplier = coco_schedule(100)
train.init_checkpoint = "eva02_base_patch14_224.mim_in22k.safetensors"  # the downloaded file (see above)
