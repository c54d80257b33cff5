"""A detectron2 trainer with mixed precision on any device.

detectron2's ``AMPTrainer`` asserts CUDA and uses the deprecated ``torch.cuda.amp`` API with a ``GradScaler``
even for bf16. ``WinposTrainer`` runs the forward pass under ``torch.autocast(device_type, dtype)`` on the
model's own device (CPU or CUDA), uses a ``GradScaler`` only for fp16 (bf16 has fp32's exponent range, so its
gradients need no scaling), can clip gradients, and can accumulate gradients over ``grad_accum_steps`` micro-batches
per optimizer step (the loader then yields micro-batches; DDP all-reduces once per step, on the last micro-batch).
Without AMP and accumulation it is detectron2's ``SimpleTrainer`` step.
"""
from __future__ import annotations

import contextlib
import time

import torch
from detectron2.engine import SimpleTrainer
from winpos.errors import WinposError

__all__ = ["WinposTrainer", "PRECISIONS", "eval_autocast", "precision_dtype"]

PRECISIONS = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}


def precision_dtype(precision: str) -> torch.dtype:
    """The autocast dtype of ``train.amp.precision``, or one line naming the choices."""
    if precision not in PRECISIONS:
        raise WinposError(f"train.amp.precision={precision!r}; choose 'bf16' (no grad scaling) or 'fp16'")
    return PRECISIONS[precision]


def eval_autocast(cfg, model):
    """The autocast context an evaluation of ``cfg`` runs ``model`` in, on the model's device: ``train.amp.precision``
    when ``train.amp.eval`` is true, else a disabled one (float32)."""
    from omegaconf import OmegaConf

    device_type = next(model.parameters()).device.type
    if not OmegaConf.select(cfg, "train.amp.eval", default=False):
        return torch.autocast(device_type, enabled=False)
    return torch.autocast(device_type, dtype=precision_dtype(OmegaConf.select(cfg, "train.amp.precision",
                                                                               default="bf16")))


class WinposTrainer(SimpleTrainer):
    """``SimpleTrainer`` + autocast on the model's device + optional fp16 grad scaling and gradient clipping.

    Args:
        model, data_loader, optimizer, gather_metric_period, zero_grad_before_forward, async_write_metrics:
            as ``SimpleTrainer`` (``data_loader`` may be set later, before ``train``: it is only iterated then).
        amp: run the forward pass under autocast.
        precision: ``"bf16"`` or ``"fp16"`` (only with ``amp``).
        clip_grad: max global L2 norm of the gradients, or None / <= 0 for no clipping.
        grad_scaler: a ``torch.amp.GradScaler`` for fp16 (made for the model's device when None).
        grad_accum_steps: micro-batches (items of ``data_loader``) per optimizer step; each micro-batch's loss is
            divided by it, so the step's gradient is the mean over the micro-batches (equal to the gradient of one
            batch of all their images when the losses are per-image means and no layer depends on the batch).
            Under DDP the inner micro-batches run in ``no_sync()``: one all-reduce per step.
    """

    def __init__(self, model, data_loader, optimizer, amp: bool = False, precision: str = "bf16",
                 clip_grad: float | None = None, gather_metric_period: int = 1,
                 zero_grad_before_forward: bool = False, async_write_metrics: bool = False, grad_scaler=None,
                 grad_accum_steps: int = 1):
        super().__init__(model, data_loader, optimizer, gather_metric_period, zero_grad_before_forward,
                         async_write_metrics)
        dtype = precision_dtype(precision)
        if not isinstance(grad_accum_steps, int) or grad_accum_steps < 1:
            raise WinposError(f"train.grad_accum_steps={grad_accum_steps!r} must be a positive integer (1: no "
                              "accumulation)")
        self.grad_accum_steps = grad_accum_steps
        self.amp, self.dtype = bool(amp), dtype
        self.device_type = next(model.parameters()).device.type
        self.clip_grad = clip_grad if clip_grad and clip_grad > 0 else None
        self.grad_scaler = None
        if self.amp and self.dtype == torch.float16:
            self.grad_scaler = grad_scaler or torch.amp.GradScaler(self.device_type)

    def run_step(self):
        if not self.model.training:
            raise RuntimeError("WinposTrainer: the model was switched to eval mode during training; call "
                               "model.train() after evaluating inside a hook")
        if self.zero_grad_before_forward:
            self.optimizer.zero_grad()
        data_time, sums = 0.0, {}
        for micro in range(self.grad_accum_steps):
            start = time.perf_counter()
            data = next(self._data_loader_iter)
            data_time += time.perf_counter() - start
            with self._sync_context(last=micro == self.grad_accum_steps - 1):
                with torch.autocast(self.device_type, dtype=self.dtype, enabled=self.amp):
                    loss_dict = self.model(data)
                    if isinstance(loss_dict, torch.Tensor):
                        losses, loss_dict = loss_dict, {"total_loss": loss_dict}
                    else:
                        losses = sum(loss_dict.values())
                if micro == 0 and not self.zero_grad_before_forward:
                    self.optimizer.zero_grad()
                losses = losses / self.grad_accum_steps if self.grad_accum_steps > 1 else losses
                if self.grad_scaler is not None:
                    self.grad_scaler.scale(losses).backward()
                else:
                    losses.backward()
            for k, v in loss_dict.items():  # the step's losses: means over its micro-batches
                sums[k] = sums.get(k, 0.0) + v.detach() / self.grad_accum_steps
        loss_dict = sums if self.grad_accum_steps > 1 else loss_dict
        self.after_backward()
        if self.clip_grad is not None:
            if self.grad_scaler is not None:
                self.grad_scaler.unscale_(self.optimizer)  # clip the true gradients, not the scaled ones
            params = [p for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
            torch.nn.utils.clip_grad_norm_(params, self.clip_grad)

        if self.async_write_metrics:
            self.concurrent_executor.submit(self._write_metrics, loss_dict, data_time, iter=self.iter)
        else:
            self._write_metrics(loss_dict, data_time)

        if self.grad_scaler is not None:
            self.grad_scaler.step(self.optimizer)
            self.grad_scaler.update()
        else:
            self.optimizer.step()

    def _sync_context(self, last: bool):
        """``model.no_sync()`` on a DDP model's inner micro-batches (their gradients stay local until the last)."""
        if last or not hasattr(self.model, "no_sync"):
            return contextlib.nullcontext()
        return self.model.no_sync()

    def state_dict(self):
        ret = super().state_dict()
        if self.grad_scaler is not None:
            ret["grad_scaler"] = self.grad_scaler.state_dict()
        return ret

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        if self.grad_scaler is not None and "grad_scaler" in state_dict:
            self.grad_scaler.load_state_dict(state_dict["grad_scaler"])
