"""Gradient accumulation (WinposTrainer grad_accum_steps), the batch plan and the start-up block.

Oracle for accumulation: one optimizer step on the whole batch. A model without batch-dependent layers and a
per-image mean loss has the same gradient whether the batch is seen at once or as equal micro-batches whose losses
are divided by their count. DDP (gloo, one process) must all-reduce once per optimizer step."""
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from detectron2.engine import SimpleTrainer
from detectron2.utils.events import EventStorage
from torch.nn.parallel import DistributedDataParallel

from tests.bad_inputs_helpers import assert_one_line_error, tool
from winpos.d2.config import load_config
from winpos.d2.startup import batch_plan, start_up_block
from winpos.d2.train_loop import WinposTrainer

COCO = Path(__file__).resolve().parents[2] / "configs" / "COCO"


class MeanLoss(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))

    def forward(self, batch):
        y = self.fc(batch)
        return {"loss_sq": (y ** 2).mean(), "loss_abs": y.abs().mean()}


def _batches(steps, total, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(total, 6, generator=g) for _ in range(steps)]


def _train(trainer_cls, data, model=None, **kw):
    torch.manual_seed(0)
    model = model or MeanLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)  # scale-sensitive, unlike Adam
    trainer = trainer_cls(model, iter(data), opt, **kw)
    with EventStorage(0) as trainer.storage:
        for trainer.iter in range(len(data) // kw.get("grad_accum_steps", 1)):
            trainer.run_step()
    return model, trainer


def test_accumulated_steps_equal_big_batch_steps():
    big = _batches(3, total=8)
    micro = [b for batch in big for b in batch.split(2)]  # each step's 8 images as 4 micro-batches of 2
    ref, ref_trainer = _train(SimpleTrainer, big)
    acc, acc_trainer = _train(WinposTrainer, micro, grad_accum_steps=4)
    for a, b in zip(acc.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    steps = [len(t.storage.history("loss_sq").values()) for t in (acc_trainer, ref_trainer)]
    assert steps == [3, 3]  # 3 optimizer steps, each logged once: the iteration count (lr schedule) is unchanged
    # the logged losses of a step are its micro-batch means, i.e. the big batch's losses
    want = ref_trainer.storage.history("loss_sq").latest()
    assert acc_trainer.storage.history("loss_sq").latest() == pytest.approx(want, rel=1e-5)
    # without dividing by the number of micro-batches the update would differ: the test can tell
    wrong, _ = _train(WinposTrainer, micro[:4])
    assert not torch.allclose(wrong.fc[0].weight, _train(SimpleTrainer, big[:1])[0].fc[0].weight, atol=1e-6)


@pytest.fixture
def gloo_world_of_one(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_ddp_all_reduces_once_per_step(gloo_world_of_one):
    calls = []

    def counting_hook(state, bucket):
        calls.append(bucket.index())
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    torch.manual_seed(0)
    ddp = DistributedDataParallel(MeanLoss())
    ddp.register_comm_hook(None, counting_hook)
    data = [b for batch in _batches(3, total=8) for b in batch.split(2)]
    model, _ = _train(WinposTrainer, data, model=ddp, grad_accum_steps=4)
    assert len(calls) == 3  # one all-reduce (one bucket) per optimizer step, none on the inner micro-batches
    ref, _ = _train(SimpleTrainer, _batches(3, total=8))
    for a, b in zip(model.module.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_batch_plan_and_refusal():
    plan = batch_plan(64, world_size=8, accum=4)
    assert (plan.per_gpu, plan.micro_total) == (2, 16)
    with pytest.raises(ValueError, match=r"total_batch_size=64 cannot be made by 8 processes x 3 accumulation steps.*"
                                         r"choose train.grad_accum_steps in \[1, 2, 4, 8\]"):
        batch_plan(64, world_size=8, accum=3)
    with pytest.raises(ValueError, match="grad_accum_steps=0 must be a positive integer"):
        batch_plan(64, world_size=8, accum=0)
    with pytest.raises(ValueError, match="grad_accum_steps"):
        WinposTrainer(MeanLoss(), [], torch.optim.SGD(MeanLoss().parameters(), lr=0.1), grad_accum_steps=0)


def test_start_up_block_for_8_gpus_2_images_4_steps():
    cfg = load_config(COCO / "mask_rcnn_vitdet_b_100ep.py", ["train.grad_accum_steps=4"])
    block = start_up_block(cfg, world_size=8, device="cuda")
    for row in ("8 GPUs", "images per GPU per micro-batch  2", "accumulation steps              4",
                "64 = 8 x 4 x 2", "iterations                      184375", "100.0 of 118000 images",
                "fp16 with a GradScaler", "mae_pretrain_vit_base.pth", "vitdet_b recipe=original"):
        assert row in block, (row, block)


def test_train_net_refuses_an_impossible_batch_before_launching():
    res = tool("train_net.py", "--config-file", COCO / "mask_rcnn_hieradet_t_100ep.py", "--num-gpus", "8",
               "train.grad_accum_steps=3", "train.device=cpu")
    assert_one_line_error(res, "total_batch_size=64 cannot be made by 8 processes x 3 accumulation steps")
