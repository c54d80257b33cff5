# Mask R-CNN, ViTDet-H: the ViTDet-B recipe with detectron2's ViTDet-H sizes.
from .mask_rcnn_vitdet_b_100ep import dataloader, lr_multiplier, model, optimizer, train

model.backbone.net.net = 'vitdet_h'
model.backbone.net.drop_path_rate = 0.5
optimizer.params.lr_decay_rate = 0.9
train.init_checkpoint = 'detectron2://ImageNetPretrained/MAE/mae_pretrain_vit_huge_p14to16.pth'

# detectron2's ViTDet-H recipe lets norms take weight decay. It also trains only 75 epochs
# (mask_rcnn_vitdet_h_75ep.py); for that, set train.max_iter = ITERS_100EP * 3 // 4 here and
# lr_multiplier = step_schedule(train.max_iter).
optimizer.params.weight_decay_norm = None
