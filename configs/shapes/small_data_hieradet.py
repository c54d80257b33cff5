# Small data on the embedded shapes (docs/small_data.md): the shipped one-class HieraDet Mask R-CNN (64 px) taught the
# four shape classes from 16 training images in 300 iterations, batch 8: one run of `winpos-reproduce --small-data`
# by name. train.freeze picks what trains ("none", "trunk", "heads": winpos.d2.freeze); the shapes dict the images
# (train_images, and seed = 1000 + the study's seed). The class layers start fresh (2 -> 5 scores); the rest loads.
from winpos.d2.hooks import warmup_step_schedule
from winpos.model_zoo import demo_checkpoint

from .reproduce_hieradet import PRETRAIN_SIZE, dataloader, model, optimizer, train

_SHAPES = dict(image_size=PRETRAIN_SIZE, train_images=16, val_images=300, min_objects=1, max_objects=6, seed=1000,
               val_seed=999)  # val_seed: one held-out set of its own, disjoint from every training set
dataloader.train.dataset.names, dataloader.test.dataset.names = "shapes_train", "shapes_val"
dataloader.train.dataset.shapes = dict(_SHAPES)
dataloader.test.dataset.shapes = dict(_SHAPES)
model.roi_heads.num_classes = 4

train.init_checkpoint = str(demo_checkpoint())
train.freeze = "heads"  # the study's recipes: [] (full), "trunk", "heads" (the best at 16 images, +3.6 box AP)
train.output_dir = "./output/small_data"
train.device = "cpu"
train.max_iter = 300
train.seed = 0
train.checkpointer.period = 75
train.eval_period = 0
lr_multiplier = warmup_step_schedule(train.max_iter, 20)  # 20 warm-up iterations, x0.1 for the last 15%
optimizer.lr = 2e-4
