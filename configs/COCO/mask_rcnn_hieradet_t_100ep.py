# Mask R-CNN, HieraDet-T: 100 epochs = 184375 iterations at batch 64, lr steps at 163889 / 177546.
# The HieraDet-B recipe (mask_rcnn_hieradet_b_100ep.py, where every value's source is given) at T size;
# drop_path_rate 0.1 and lr_decay_rate 0.7 are winpos's choice, unverified.
from .mask_rcnn_hieradet_b_100ep import dataloader, lr_multiplier, model, optimizer, train

model.backbone.bottom_up.net = "hieradet_t"
model.backbone.bottom_up.drop_path_rate = 0.1
optimizer.params.lr_decay_rate = 0.7
train.init_checkpoint = "https://dl.fbaipublicfiles.com/hiera/mae_hiera_tiny_224.pth"
