# Mask R-CNN, HieraDet-B: 100 epochs = 184375 iterations at batch 64, lr steps at 163889 / 177546.
# HieraDet as the bottom-up of detectron2's FPN (detectron2's MViTv2 recipe) with ViTDet's data, optimizer and
# schedule; the base of every HieraDet config. Where each value comes from:
#   model, windows, global blocks   SAM2.1's Hiera image encoders (B: B+'s layout at B's width; winpos.backbones)
#   neck and heads                  detectron2's MViTv2 / ViTDet recipe (FPN with LN, 4conv1fc box head, LN mask head)
#   schedule, optimizer, data, AMP  detectron2's ViTDet recipe (the paper's detector settings are unverified)
#   drop_path_rate, lr_decay_rate   winpos's choice, unverified: ViTDet's values by block count (12 blocks 0.1 / 0.7,
#                                   24 blocks 0.4 / 0.8, 32 blocks 0.5 / 0.9), drop path lowered for the
#                                   narrower Hiera stages (B 0.2 / 0.8)
#   init                            MAE-pretrained Hiera (mae_hiera_*_224.pth, not classification-fine-tuned), as
#                                   detectron2's ViTDet starts from MAE weights and the paper from an MAE-pretrained
#                                   Hiera (its abs-win pretraining is not public); its last stage was pretrained
#                                   without query pooling (q_pool=2), HieraDet pools at all three transitions.
#                                   The fine-tuned IN-1k files (hiera_*_224.pth) are one override away.
#   pos_global_size=56              Hiera's 224-px pretraining grid (56x56 stride-4 tokens): the abs -> abs-win
#                                   conversion of the init is exact for every recipe (SAM2 keeps 7x7 / 14x14)
#
# The position-encoding recipe is an override (winpos.backbones.hieradet.RECIPES), the same for every HieraDet config:
#   model.backbone.bottom_up.recipe=original  SAM2's abs-win embedding, no block terms (the default here)
#   model.backbone.bottom_up.recipe=paper     the paper's recursive abs-win (period: the 56x56 pretraining grid),
#                                             relpos in the global blocks (Bolya et al. 2024): the recipe of the
#                                             paper's HieraDet table
#   model.backbone.bottom_up.recipe=rope      abs-win embedding + RoPE in every block
#   model.backbone.bottom_up.recipe=lookhere  no embedding, LookHere-45 direction masks and distance slopes
# e.g. tools/train_net.py --config-file configs/COCO/mask_rcnn_hieradet_b_100ep.py model.backbone.bottom_up.recipe=paper
# Batch and memory on fewer than 64 GPUs (train.grad_accum_steps, use_checkpoint): docs/recipes.md.
from ..common.data.coco_lsj import dataloader
from ..common.models.mask_rcnn_hieradet import model
from ..common.optim import AdamW as optimizer
from ..common.schedule import coco_schedule
from ..common.train import train

model.backbone.bottom_up.net = "hieradet_b"
model.backbone.bottom_up.recipe = "original"
model.backbone.bottom_up.pos_global_size = 56
model.backbone.bottom_up.drop_path_rate = 0.2

train.max_iter, lr_multiplier = coco_schedule(100)
train.amp.enabled = True
train.amp.precision = "fp16"
train.ddp.fp16_compression = True
train.init_checkpoint = "https://dl.fbaipublicfiles.com/hiera/mae_hiera_base_224.pth"

optimizer.params.lr_decay_rate = 0.8
