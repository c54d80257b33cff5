# Mask R-CNN, HieraDet-L: the HieraDet-B recipe at HieraDet-L size.
from .mask_rcnn_hieradet_b_100ep import dataloader, lr_multiplier, model, optimizer, train

model.backbone.bottom_up.net = 'hieradet_l'
model.backbone.bottom_up.drop_path_rate = 0.4
optimizer.params.lr_decay_rate = 0.9
train.init_checkpoint = "https://dl.fbaipublicfiles.com/hiera/hiera_large_224.pth"
