# Mask R-CNN, HieraDet-B, 100 epochs of COCO with LSJ at 1024 px: HieraDet as the bottom-up of FPN (MViTv2's
# recipe), the ViTDet data / optimizer / schedule.
#
# The position-encoding recipe is an override (winpos.backbones.hieradet.RECIPES), the same for every HieraDet config:
#   model.backbone.bottom_up.recipe=original  SAM2's abs-win embedding, no block terms (the default here)
#   model.backbone.bottom_up.recipe=paper     the paper's recursive abs-win (its period the pretraining grid),
#                                             relpos in the global blocks (Bolya et al. 2024)
#   model.backbone.bottom_up.recipe=rope      abs-win embedding + RoPE in every block
#   model.backbone.bottom_up.recipe=lookhere  no embedding, LookHere-45 direction masks and distance slopes
# e.g. tools/train_net.py --config-file configs/COCO/mask_rcnn_hieradet_b_100ep.py model.backbone.bottom_up.recipe=rope
# drop_path_rate and lr_decay_rate per size are starting points [unverified], not the paper's values.
from ..common.data.coco_lsj import dataloader
from ..common.models.mask_rcnn_hieradet import model
from ..common.optim import AdamW as optimizer
from ..common.schedule import ITERS_100EP, step_schedule
from ..common.train import train

model.backbone.bottom_up.net = "hieradet_b"
model.backbone.bottom_up.recipe = "original"
model.backbone.bottom_up.drop_path_rate = 0.2

train.max_iter = ITERS_100EP
lr_multiplier = step_schedule(train.max_iter)
train.amp.enabled = True
train.ddp.fp16_compression = True
# Official Hiera IN-1k weights (MAE + fine-tuned, q_pool=3 like HieraDet), converted by winpos.checkpoints.hiera
train.init_checkpoint = "https://dl.fbaipublicfiles.com/hiera/hiera_base_224.pth"

optimizer.params.lr_decay_rate = 0.8
