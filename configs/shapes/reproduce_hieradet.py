# The window-attention-bug protocol at CPU scale (tools/reproduce.py; winpos.experiments.protocol sets the fields marked
# "per run" through overrides): a small HieraDet Mask R-CNN on the one-class shapes data.
#
# Stage 1 pretrains it at 64 px: a 16x16 token grid at stride 4 attended in 4x4-token windows in stage 1 (16 px,
# like Hiera's 8-token mask units at 224 px), 2x2 in stage 2, then global stages (global at every size,
# so that only the position embedding can misalign with the windows). Stage 2 finetunes it at 2x
# (128 px, 32x32 tokens) and 4x (256 px, 64x64 tokens) with the windows unchanged, either on upscaled images
# (objects grow with the grid) or on a larger canvas holding objects of the 64 px size (only the grid grows).
from ..common.models.mask_rcnn_hieradet import model
from ..common.shapes import dataloader, lr_multiplier, optimizer, shrink_heads, train
from ..common.schedule import step_schedule

PRETRAIN_SIZE = 64

net = model.backbone.bottom_up
net.net, net.recipe, net.drop_path_rate = "hieradet_toy", "original", 0.0
net.embed_dim, net.num_heads = 48, 2  # 48 -> 384 channels, 2 -> 16 heads: stronger than the 32-channel toy
net.window_spec = (4, 2, 0, 2)  # 0: stages 3-4 attend globally at every size (at 64 px the same as 4)
net.img_size = PRETRAIN_SIZE  # per run: the training size (sizes global relpos tables)
net.pretrain_img_size = PRETRAIN_SIZE  # the abs embedding is stored at 16x16 tokens
net.pos_global_size = 4  # abs-win: 4x4 global embedding, 4x4 window embedding (window_spec[0])
net.pos_embed, net.window_pos, net.global_pos = "abs", "none", "none"  # per run
model = shrink_heads(model)
model.backbone.square_pad = PRETRAIN_SIZE  # per run
model.proposal_generator.anchor_generator.sizes = [[8], [16], [32], [64], [128]]
model.proposal_generator.post_nms_topk = (500, 300)
model.roi_heads.num_classes = 1
model.roi_heads.box_predictor.test_topk_per_image = 100  # a 4x canvas holds up to 96 objects

SHAPES = dict(image_size=PRETRAIN_SIZE, train_images=2000, val_images=200, min_objects=1, max_objects=6)
dataloader.train.dataset.names = "shapes1_train"
dataloader.train.dataset.shapes = dict(SHAPES)  # per run
dataloader.train.mapper.image_size = PRETRAIN_SIZE  # per run
dataloader.train.mapper.min_scale, dataloader.train.mapper.max_scale = 0.8, 1.25
dataloader.train.total_batch_size = 8
dataloader.test.dataset.names = "shapes1_val"
dataloader.test.dataset.shapes = dict(SHAPES)  # per run
dataloader.test.mapper.image_size = PRETRAIN_SIZE  # per run

train.output_dir = "./output/reproduce"
train.max_iter = 1000  # per run
lr_multiplier = step_schedule(train.max_iter, warmup_iters=50)
train.checkpointer.period = 250
train.log_period = 50
optimizer.lr = 1e-3  # per run
optimizer.weight_decay = 0.05
