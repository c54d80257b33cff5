# Mask R-CNN, ViTDet-L: 100 epochs = 184375 iterations at batch 64, lr steps at 163889 / 177546.
# detectron2's ViTDet-L recipe (mask_rcnn_vitdet_l_100ep.py there): the ViTDet-B recipe at L size.
from .mask_rcnn_vitdet_b_100ep import dataloader, lr_multiplier, model, optimizer, train

model.backbone.net.net = "vitdet_l"
model.backbone.net.drop_path_rate = 0.4
optimizer.params.lr_decay_rate = 0.8
train.init_checkpoint = "detectron2://ImageNetPretrained/MAE/mae_pretrain_vit_large.pth"
