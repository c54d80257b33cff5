"""The training plan's 'lr schedule' row (winpos.d2.startup): what detectron2 will run, in this run's iterations."""
import pytest
import torch


@pytest.mark.parametrize("name, overrides", [("COCO/mask_rcnn_vitdet_b_100ep.py", ["train.max_iter=300"]),
                                             ("shapes/mask_rcnn_hieradet_toy_abswin.py", []),
                                             ("shapes/reproduce_hieradet.py", ["train.max_iter=977"])])
def test_the_plan_states_the_lr_schedule_detectron2_will_run(name, overrides):
    """The 'lr schedule' row against detectron2's own scheduler (LRMultiplier over the run's max_iter): the
    iteration at which each step begins, and the warm-up a max_iter override leaves."""
    import re

    from detectron2.config import instantiate
    from detectron2.solver import LRMultiplier

    from winpos.d2.config import load_config
    from winpos.d2.startup import start_up_block

    cfg = load_config(name, overrides + ["train.device=cpu"])
    row = next(ln for ln in start_up_block(cfg, 1, "cpu").splitlines() if "lr schedule" in ln)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = LRMultiplier(opt, instantiate(cfg.lr_multiplier), cfg.train.max_iter)
    lrs = []
    for _ in range(cfg.train.max_iter):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    changes = [i for i in range(1, len(lrs)) if lrs[i] < lrs[i - 1] * 0.5]  # the x0.1 steps
    stated = [int(x) for x in re.findall(r"from iteration (\d+)", row)]
    assert stated == changes, (row, changes)
    warm = float(re.search(r"warm-up ([\d.e+-]+) iterations", row).group(1))
    first_full = next(i for i, v in enumerate(lrs) if v >= 0.999)
    assert abs(first_full - warm) <= 1, (row, first_full)
    assert ("scaled with train.max_iter" in row) == (warm < 10)
