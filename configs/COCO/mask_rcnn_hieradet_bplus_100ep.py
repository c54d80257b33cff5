# Mask R-CNN, HieraDet-B+: the HieraDet-B recipe at HieraDet-B+ size.
from .mask_rcnn_hieradet_b_100ep import dataloader, lr_multiplier, model, optimizer, train

model.backbone.bottom_up.net = 'hieradet_bplus'
model.backbone.bottom_up.drop_path_rate = 0.2
optimizer.params.lr_decay_rate = 0.8
train.init_checkpoint = "https://dl.fbaipublicfiles.com/hiera/hiera_base_plus_224.pth"
