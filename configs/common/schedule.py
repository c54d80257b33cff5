from detectron2.config import LazyCall as L
from detectron2.solver import WarmupParamScheduler
from fvcore.common.param_scheduler import MultiStepParamScheduler

# detectron2 ViTDet's schedule: 100 epochs of COCO at batch 64 = 184375 iterations, lr x0.1 at ~89% and ~96%,
# linear warmup over 250 iterations from 0.001.
ITERS_100EP = 184375


def step_schedule(max_iter, milestones_frac=(163889 / 184375, 177546 / 184375), warmup_iters=250):
    """Lr multiplier: 1 -> 0.1 -> 0.01 at ``milestones_frac`` of ``max_iter``, after a linear warmup."""
    return L(WarmupParamScheduler)(
        scheduler=L(MultiStepParamScheduler)(
            values=[1.0, 0.1, 0.01],
            milestones=[round(f * max_iter) for f in milestones_frac],
            num_updates=max_iter,
        ),
        warmup_length=warmup_iters / max_iter,
        warmup_factor=0.001,
    )


lr_multiplier_100ep = step_schedule(ITERS_100EP)
