# Mask R-CNN, HieraDet-S: the HieraDet-B recipe at HieraDet-S size.
from .mask_rcnn_hieradet_b_100ep import dataloader, lr_multiplier, model, optimizer, train

model.backbone.bottom_up.net = 'hieradet_s'
model.backbone.bottom_up.drop_path_rate = 0.1
optimizer.params.lr_decay_rate = 0.75
train.init_checkpoint = "https://dl.fbaipublicfiles.com/hiera/hiera_small_224.pth"
