# CPU-sized recipe on the embedded shapes dataset (winpos.data.shapes: 256 px images, 4 classes, registered on
# first use as shapes_train / shapes_val): small pyramid and heads (2fc box head), LSJ at 256 px, 300 iterations.
# Telling the four outlines apart from scratch takes a tiny transformer thousands of iterations; the one-class view
# (dataloader.*.dataset.names=shapes1_train/shapes1_val, model.roi_heads.num_classes=1) learns within minutes.
# The files in configs/shapes/ add a tiny backbone with one position encoding each (see shrink_heads()).
from detectron2.layers import ShapeSpec

from .data.coco_lsj import dataloader
from .optim import AdamW as optimizer
from .schedule import step_schedule
from .train import train

IMAGE_SIZE = 256
dataloader.train.dataset.names = "shapes_train"
dataloader.train.mapper.image_size = IMAGE_SIZE
dataloader.train.mapper.min_scale = 0.5
dataloader.train.mapper.max_scale = 1.5
dataloader.train.total_batch_size = 4
dataloader.train.num_workers = 0
dataloader.test.dataset.names = "shapes_val"
dataloader.test.mapper.image_size = IMAGE_SIZE
dataloader.test.num_workers = 0

train.output_dir = "./output/shapes"
train.max_iter = 300
lr_multiplier = step_schedule(train.max_iter, warmup_iters=20)
train.checkpointer.period = 100
train.eval_period = 0  # evaluate once, after training
train.log_period = 20
optimizer.lr = 4e-4
optimizer.weight_decay = 0.05
# The shapes protocol keeps the rule its recorded results were trained with (not detectron2's): no weight decay on
# any position parameter (token embeddings, relpos tables, RoPE) nor on any norm, detectron2's LayerNorm included.
optimizer.params.overrides = {key: {"weight_decay": 0.0} for key in ("pos_embed", "rel_pos", "rope")}
optimizer.params.norm_layers = "all"


def shrink_heads(model, channels=64):
    """Shapes-sized detector around ``model.backbone``: a ``channels``-wide pyramid and heads, 4 classes,
    anchors 16-256 px for 256 px images, fewer proposals and sampled RoIs. Modifies ``model`` in place."""
    model.backbone.out_channels = channels
    model.backbone.square_pad = IMAGE_SIZE
    rpn = model.proposal_generator
    rpn.head.in_channels = channels
    rpn.anchor_generator.sizes = [[16], [32], [64], [128], [256]]
    rpn.batch_size_per_image = 128
    rpn.pre_nms_topk = (1000, 500)
    rpn.post_nms_topk = (500, 100)
    heads = model.roi_heads
    heads.num_classes = 4
    heads.batch_size_per_image = 64
    heads.box_head.input_shape = ShapeSpec(channels=channels, height=7, width=7)
    heads.box_head.conv_dims = []  # 2fc box head: convolutions on every sampled RoI dominate CPU time
    heads.box_head.fc_dims = [256, 256]
    heads.box_predictor.input_shape = ShapeSpec(channels=256)
    heads.box_predictor.test_topk_per_image = 20  # images hold <= 6 objects; fewer detections = faster mask head
    heads.mask_head.input_shape = ShapeSpec(channels=channels, width=14, height=14)
    heads.mask_head.conv_dims = [channels, channels]
    return model


def _tiny(model, net, preset, recipe, geometry, overrides):
    net.net, net.recipe, net.img_size, net.drop_path_rate = preset, recipe, IMAGE_SIZE, 0.0
    for key, value in {**geometry, **overrides}.items():
        setattr(net, key, value)
    return shrink_heads(model)


def tiny_hieradet(model, recipe, **overrides):
    """The shapes-sized HieraDet detector: ``hieradet_toy`` at 256 px, windows (8, 4, 8, 4), no drop path, small
    heads (``shrink_heads``); ``overrides`` set further backbone fields (position encodings)."""
    return _tiny(model, model.backbone.bottom_up, "hieradet_toy", recipe, {"window_spec": (8, 4, 8, 4)}, overrides)


def tiny_vitdet(model, recipe, **overrides):
    """The shapes-sized ViTDet detector: ``vitdet_toy`` at 256 px, 8-token windows, no drop path, small heads."""
    return _tiny(model, model.backbone.net, "vitdet_toy", recipe, {"window_size": 8}, overrides)
