"""WinposTrainer: autocast on the CPU (detectron2's AMPTrainer asserts CUDA), bf16 without a scaler, fp16 with one,
gradient clipping, and the plain step equal to detectron2's SimpleTrainer."""
import itertools

import pytest
import torch
from detectron2.engine import SimpleTrainer
from detectron2.utils.events import EventStorage

from winpos.d2.train_loop import WinposTrainer


class LossModel(torch.nn.Module):
    """A 'detector' returning a loss dict; records the dtype its linear layer computed in."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)
        self.seen = []

    def forward(self, batch):
        y = self.fc(batch)
        self.seen.append(y.dtype)
        return {"loss_a": (y.float() ** 2).mean(), "loss_b": y.float().abs().mean()}


def _run(trainer_cls, steps=3, **kw):
    torch.manual_seed(0)
    model = LossModel()
    data = itertools.repeat(torch.randn(5, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = trainer_cls(model, data, opt, **kw)
    with EventStorage(0) as trainer.storage:
        for trainer.iter in range(steps):
            trainer.run_step()
    return model, trainer


def test_plain_step_equals_simple_trainer():
    a, _ = _run(SimpleTrainer)
    b, _ = _run(WinposTrainer)
    torch.testing.assert_close(a.fc.weight, b.fc.weight, rtol=0, atol=0)
    assert set(b.seen) == {torch.float32}


def test_bf16_autocast_on_cpu_without_scaler():
    model, trainer = _run(WinposTrainer, amp=True, precision="bf16")
    assert set(model.seen) == {torch.bfloat16} and trainer.grad_scaler is None
    assert model.fc.weight.dtype == torch.float32 and torch.isfinite(model.fc.weight).all()
    ref, _ = _run(SimpleTrainer)
    torch.testing.assert_close(model.fc.weight, ref.fc.weight, rtol=0.05, atol=0.02)  # bf16 is close to fp32


def test_fp16_uses_a_grad_scaler_and_state_roundtrips():
    model, trainer = _run(WinposTrainer, amp=True, precision="fp16")
    assert set(model.seen) == {torch.float16} and trainer.grad_scaler is not None
    state = trainer.state_dict()
    assert "grad_scaler" in state and "optimizer" in state
    _, other = _run(WinposTrainer, steps=1, amp=True, precision="fp16")
    other.load_state_dict(state)
    assert other.grad_scaler.get_scale() == trainer.grad_scaler.get_scale()


def test_gradient_clipping_bounds_the_update():
    torch.manual_seed(0)
    start = LossModel()  # the same initial weights _run builds
    model, _ = _run(WinposTrainer, steps=1, clip_grad=1e-3)
    unclipped, _ = _run(WinposTrainer, steps=1)
    with torch.no_grad():
        step = torch.cat([(model.fc.weight - start.fc.weight).flatten(), (model.fc.bias - start.fc.bias).flatten()])
        assert step.norm().item() == pytest.approx(0.1 * 1e-3, rel=1e-3)  # SGD lr x the clipped gradient norm
        assert (unclipped.fc.weight - start.fc.weight).norm().item() > 10 * step.norm().item()


def test_bad_precision():
    with pytest.raises(ValueError, match="precision"):
        WinposTrainer(LossModel(), [], torch.optim.SGD(LossModel().parameters(), lr=0.1), amp=True, precision="int8")
