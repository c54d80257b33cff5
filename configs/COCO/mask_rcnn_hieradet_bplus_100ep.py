# Mask R-CNN, HieraDet-B+: 100 epochs = 184375 iterations at batch 64, lr steps at 163889 / 177546.
# The HieraDet-B recipe (mask_rcnn_hieradet_b_100ep.py, where every value's source is given) at B+ size;
# drop_path_rate 0.2 and lr_decay_rate 0.8 are winpos's choice, unverified.
from .mask_rcnn_hieradet_b_100ep import dataloader, lr_multiplier, model, optimizer, train

model.backbone.bottom_up.net = "hieradet_bplus"
model.backbone.bottom_up.drop_path_rate = 0.2
optimizer.params.lr_decay_rate = 0.8
train.init_checkpoint = "https://dl.fbaipublicfiles.com/hiera/mae_hiera_base_plus_224.pth"
