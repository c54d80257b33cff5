# Mask R-CNN, ViTDet-H: 75 epochs = 138281 iterations at batch 64, lr steps at 122916 / 133159.
# detectron2's ViTDet-H recipe (mask_rcnn_vitdet_h_75ep.py there, 56.7 box AP): the ViTDet-B recipe at H size,
# 3/4 of the 100-epoch schedule, and no weight-decay exemptions (norms and pos_embed take 0.1; learned RoPE
# frequencies keep winpos's exemption, configs/common/optim.py).
from ..common.schedule import coco_schedule
from .mask_rcnn_vitdet_b_100ep import dataloader, model, optimizer, train

model.backbone.net.net = "vitdet_h"
model.backbone.net.drop_path_rate = 0.5
optimizer.params.lr_decay_rate = 0.9
optimizer.params.weight_decay_norm = None
optimizer.params.overrides = {"rope": {"weight_decay": 0.0}}
train.max_iter, lr_multiplier = coco_schedule(75)
train.init_checkpoint = "detectron2://ImageNetPretrained/MAE/mae_pretrain_vit_huge_p14to16.pth"
