# Mask R-CNN, ViTDet-B: 100 epochs = 184375 iterations at batch 64, lr steps at 163889 / 177546.
# detectron2's ViTDet recipe (projects/ViTDet mask_rcnn_vitdet_b_100ep.py) with winpos's ViTDet: the same model,
# heads, LSJ data at 1024 px, schedule, optimizer (configs/common/optim.py) and MAE init; fp16 AMP with a
# GradScaler as detectron2's AMPTrainer (train.amp.precision=bf16 on A100 / H100 is winpos's alternative).
#
# The position-encoding recipe is an override (winpos.backbones.vitdet.RECIPES), the same for every ViTDet config:
#   model.backbone.net.recipe=original  abs embedding interpolated from MAE's 14x14 + relpos in every block, as
#                                       detectron2 ships it (the default here)
#   model.backbone.net.recipe=paper     abs-win embedding, relpos only in the global blocks (Bolya et al. 2024)
#   model.backbone.net.recipe=rope      abs-win embedding + RoPE in every block
#   model.backbone.net.recipe=lookhere  no embedding, LookHere-45 direction masks and distance slopes
# e.g. tools/train_net.py --config-file configs/COCO/mask_rcnn_vitdet_b_100ep.py model.backbone.net.recipe=paper
# Batch and memory on fewer than 64 GPUs (train.grad_accum_steps, use_checkpoint): docs/recipes.md.
from ..common.data.coco_lsj import dataloader
from ..common.models.mask_rcnn_vitdet import model
from ..common.optim import AdamW as optimizer
from ..common.schedule import coco_schedule
from ..common.train import train

model.backbone.net.net = "vitdet_b"
model.backbone.net.recipe = "original"
model.backbone.net.drop_path_rate = 0.1

train.max_iter, lr_multiplier = coco_schedule(100)
train.amp.enabled = True
train.amp.precision = "fp16"
train.ddp.fp16_compression = True
# MAE ImageNet-1k weights (converted by winpos.checkpoints.vitdet for every recipe, e.g. abs -> abs-win)
train.init_checkpoint = "detectron2://ImageNetPretrained/MAE/mae_pretrain_vit_base.pth"

optimizer.params.lr_decay_rate = 0.7
