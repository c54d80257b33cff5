"""The training hooks and schedule of winpos's detectron2 loop (``winpos.d2.engine.do_train``) and of the
reproduction's child runs (``winpos.experiments.child``).

* ``ResumableWriter``: detectron2's console / ``metrics.json`` / TensorBoard writers, created at the start of
  training so that a resumed run first drops what the killed run wrote after its last checkpoint
  (``trim_metrics``); the files then read like one uninterrupted run.
* ``FinalEvalHook``: the evaluation after training, only when training completed.
* ``ProgressHook``: one progress line every few iterations (iteration, median loss, rate).
* ``StopWhenAsked``: ends training between two iterations after ``request_stop`` (a job's preemption signal,
  ``winpos.d2.slurm.TrainJob``), every process at the same one, by raising ``StopRequested``.
* ``warmup_step_schedule``: a short run's learning-rate multiplier (linear warm-up, then x0.1 at the end).
* ``log_detectron2_to_file``: detectron2's log into a file only.
"""
from __future__ import annotations

import json
import logging
import os
import time

from detectron2.engine import hooks
from detectron2.utils.events import CommonMetricPrinter, JSONWriter, TensorboardXWriter

from winpos.utils.outputs import atomic_write

logger = logging.getLogger(__name__)


def trim_metrics(path: str, start_iter: int) -> int:
    """Drop lines of ``metrics.json`` with ``iteration >= start_iter`` (written after the checkpoint a run
    resumes from); returns how many were dropped. Rewritten atomically."""
    if not os.path.isfile(path):
        return 0
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    keep = []
    for line in lines:
        try:
            it = json.loads(line).get("iteration", -1)
        except json.JSONDecodeError:
            continue  # a line cut off when the run was killed
        if it < start_iter:
            keep.append(line if line.endswith("\n") else line + "\n")
    atomic_write(path, lambda f: f.writelines(keep), "w")
    return len(lines) - len(keep)


class ResumableWriter(hooks.PeriodicWriter):
    """detectron2's console / metrics.json / TensorBoard writers, created when training starts so a resumed
    run first trims what the killed run wrote after its last checkpoint."""

    def __init__(self, output_dir: str, max_iter: int, period: int = 20):
        super().__init__([], period)
        self._output_dir, self._max_iter = output_dir, max_iter

    def before_train(self):
        start = self.trainer.start_iter
        metrics = os.path.join(self._output_dir, "metrics.json")
        if trim_metrics(metrics, start):  # at 0: a resume with no checkpoint yet starts the file afresh
            logger.info(f"trimmed metrics.json to iterations < {start} (resumed run)")
        tb = {"purge_step": start} if start > 0 else {}
        self._writers = [CommonMetricPrinter(self._max_iter), JSONWriter(metrics),
                         TensorboardXWriter(self._output_dir, **tb)]


class FinalEvalHook(hooks.EvalHook):
    """detectron2's ``EvalHook``, except that the evaluation after training runs only when training completed:
    detectron2's also runs it after a failure in the last iteration (a final checkpoint that could not be written),
    evaluating weights that were never saved."""

    def after_train(self):
        if self.trainer.iter < self.trainer.max_iter:  # the loop ends with iter == max_iter only when it completed
            self._eval_after_train = False
        super().after_train()


def warmup_step_schedule(max_iter: int, warmup: int, last_fraction: float = 0.15):
    """A short run's lr multiplier (the reproduction's runs): linear warmup over ``warmup`` iterations (at most half
    the run) from 0.001, then 1, and x0.1 for the last ``last_fraction`` of the run when it has room for a step."""
    from detectron2.config import LazyCall as L
    from detectron2.solver import WarmupParamScheduler
    from fvcore.common.param_scheduler import MultiStepParamScheduler

    step = min(round((1 - last_fraction) * max_iter), max_iter - 1)
    values, milestones = ([1.0, 0.1], [step]) if step >= 1 else ([1.0], [])
    return L(WarmupParamScheduler)(
        scheduler=L(MultiStepParamScheduler)(values=values, milestones=milestones, num_updates=max_iter),
        warmup_length=min(warmup / max_iter, 0.5), warmup_factor=0.001)


class ProgressHook(hooks.HookBase):
    """Calls ``emit(line)`` every ``every`` iterations and at the last one with the iteration, the median loss of
    the last ``every`` iterations and the rate since the start of this process's training."""

    def __init__(self, every: int, emit):
        self.every, self.emit = max(int(every), 1), emit

    def before_train(self):
        self.t0 = time.time()

    def after_step(self):
        it = self.trainer.iter + 1
        if it % self.every == 0 or it == self.trainer.max_iter:
            storage = self.trainer.storage
            loss = storage.history("total_loss").median(self.every) if "total_loss" in storage.histories() \
                else float("nan")
            rate = (it - self.trainer.start_iter) / max(time.time() - self.t0, 1e-9)
            self.emit(f"iteration {it}/{self.trainer.max_iter}, loss {loss:.3f}, {rate:.2f} it/s")


class StopRequested(BaseException):
    """Training stopped at an iteration boundary because ``request_stop`` was called (a preemption or time-out
    signal). A ``BaseException``: detectron2's loop logs no error for it, runs its ``after_train`` hooks, and lets it
    through to whoever asked."""

    def __init__(self, signum: int, iteration: int):
        super().__init__(f"stopped after iteration {iteration} on signal {signum}")
        self.signum, self.iteration = signum, iteration


_stop = {"armed": False, "signum": 0}  # armed: StopWhenAsked checks (and, with several processes, agrees) each step


def arm_stop() -> None:
    """Let ``request_stop`` end the training of this process (every process of the run must arm it alike)."""
    _stop.update(armed=True, signum=0)


def request_stop(signum: int, frame=None) -> None:
    """A signal handler: ask the training loop to stop after the current iteration (nothing else happens in it)."""
    _stop["signum"] = int(signum)


class StopWhenAsked(hooks.HookBase):
    """Before each step, when armed (``arm_stop``): stop if any process was asked to (``request_stop``), so every
    process leaves the loop between the same two iterations (one integer all-reduced per step with several
    processes; nothing at all when not armed). Registered first, so no hook has begun the step it stops. Raising
    from a signal handler inside a step, or after a step that a writer has just logged, made detectron2's writers
    fail in ``after_train`` with another error (ZeroDivisionError in the ETA of an iteration already written)."""

    def before_step(self):
        if not _stop["armed"]:
            return
        signum = _stop["signum"]
        from detectron2.utils import comm

        if comm.get_world_size() > 1:
            import torch
            import torch.distributed as dist

            device = "cuda" if dist.get_backend() == "nccl" else "cpu"
            flag = torch.tensor([signum], dtype=torch.int64, device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            signum = int(flag.item())
        if signum:
            done = self.trainer.iter - 1
            logger.warning(f"signal {signum}: training stops after iteration {done} (the run continues from its last "
                           "checkpoint with --resume)")
            raise StopRequested(signum, done)


def log_detectron2_to_file(path: str) -> None:
    """detectron2's log of this process into ``path`` only (nothing on the console)."""
    from detectron2.utils.logger import setup_logger

    from winpos.utils.output_folders import refuse_links

    refuse_links(os.path.dirname(path) or ".", [os.path.basename(path)])  # it appends: never through a link
    setup_logger(output=path, name="detectron2", abbrev_name="d2", configure_stdout=False)
