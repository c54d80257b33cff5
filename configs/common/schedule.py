# detectron2's ViTDet schedules at batch 64 (its projects/ViTDet COCO configs): 100 epochs of COCO = 184375
# iterations with lr x0.1 at 163889 and 177546; ViTDet-H's 75 epochs = 3/4 of each (138281; 122916, 133159);
# linear warmup over 250 iterations from 0.001. An epoch is 118000 images in detectron2's arithmetic
# (184375 x 64 / 118000 = 100.0).
from detectron2.config import LazyCall as L
from detectron2.solver import WarmupParamScheduler
from fvcore.common.param_scheduler import MultiStepParamScheduler

ITERS_100EP = 184375
STEPS_100EP = (163889, 177546)
COCO_EPOCH_IMAGES = 118000


def step_schedule(max_iter, milestones_frac=(163889 / 184375, 177546 / 184375), warmup_iters=250, milestones=None):
    """Lr multiplier: 1 -> 0.1 -> 0.01 at ``milestones`` (iterations), by default ``milestones_frac`` of
    ``max_iter``, after a linear warmup over ``warmup_iters`` from 0.001."""
    if milestones is None:
        milestones = [round(f * max_iter) for f in milestones_frac]
    return L(WarmupParamScheduler)(
        scheduler=L(MultiStepParamScheduler)(
            values=[1.0, 0.1, 0.01],
            milestones=list(milestones),
            num_updates=max_iter,
        ),
        warmup_length=warmup_iters / max_iter,
        warmup_factor=0.001,
    )


def coco_schedule(epochs):
    """``(max_iter, lr_multiplier)`` of detectron2's ViTDet schedule for 100 or 75 epochs at batch 64 (75 is 3/4 of
    100, rounded down as detectron2's ViTDet-H config does)."""
    if epochs == 100:
        max_iter, steps = ITERS_100EP, STEPS_100EP
    elif epochs == 75:
        max_iter, steps = ITERS_100EP * 3 // 4, tuple(s * 3 // 4 for s in STEPS_100EP)
    else:
        raise ValueError(f"epochs={epochs}: detectron2's ViTDet recipe has 100 or 75 epochs; for another length use "
                         "step_schedule(max_iter)")
    return max_iter, step_schedule(max_iter, milestones=steps)


lr_multiplier_100ep = step_schedule(ITERS_100EP)
