# Mask R-CNN, ViTDet-B, 100 epochs of COCO with LSJ at 1024 px: detectron2's ViTDet recipe with winpos' ViTDet
# (recipe "original" = abs pos_embed interpolated from MAE's 14x14 + relpos in every block, as detectron2).
from ..common.data.coco_lsj import dataloader
from ..common.models.mask_rcnn_vitdet import model
from ..common.optim import AdamW as optimizer
from ..common.schedule import ITERS_100EP, step_schedule
from ..common.train import train

model.backbone.net.net = "vitdet_b"
model.backbone.net.recipe = "original"
model.backbone.net.drop_path_rate = 0.1

train.max_iter = ITERS_100EP
lr_multiplier = step_schedule(train.max_iter)
train.amp.enabled = True
train.ddp.fp16_compression = True
# MAE ImageNet-1k weights (converted by winpos.checkpoints.vitdet for every recipe, e.g. abs -> abs-win)
train.init_checkpoint = "detectron2://ImageNetPretrained/MAE/mae_pretrain_vit_base.pth"

optimizer.params.lr_decay_rate = 0.7
