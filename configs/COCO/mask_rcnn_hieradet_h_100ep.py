# Mask R-CNN, HieraDet-H: 100 epochs = 184375 iterations at batch 64, lr steps at 163889 / 177546.
# The HieraDet-B recipe (mask_rcnn_hieradet_b_100ep.py, where every value's source is given) at H size;
# drop_path_rate 0.5 and lr_decay_rate 0.9 are winpos's choice, unverified.
# Windows (8, 4, 14, 7), not SAM2-L's (8, 4, 16, 8): the stage-3 / 4 windows then span one 224-px pretraining image
# as in T / S / B / B+, so the paper recipe's recursive period is the 56x56 pretraining grid and the conversion of
# the init stays exact (with 16-token windows the period is 64 and the 56x56 residual is resized: lossy).
from .mask_rcnn_hieradet_b_100ep import dataloader, lr_multiplier, model, optimizer, train

model.backbone.bottom_up.net = "hieradet_h"
model.backbone.bottom_up.drop_path_rate = 0.5
optimizer.params.lr_decay_rate = 0.9
train.init_checkpoint = "https://dl.fbaipublicfiles.com/hiera/mae_hiera_huge_224.pth"
model.backbone.bottom_up.window_spec = (8, 4, 14, 7)
model.backbone.bottom_up.pos_base_hw = 56
