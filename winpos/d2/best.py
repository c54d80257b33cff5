"""``train.keep_best``: keep the weights of the evaluation that scored best, not only the last ones.

With a small training set a detector can peak before its last iteration. ``train.keep_best="bbox/AP"`` (any key of
the evaluation's results, ``task/metric`` as detectron2's ``print_csv_format`` and ``metrics.json`` name them)
compares every periodic evaluation (``train.eval_period``) and the one after training, and keeps the best in
``output_dir/model_best.pth`` (the model's weights only, a detector checkpoint that ``train.init_checkpoint`` and
``winpos-eval --checkpoint`` read) with ``output_dir/best.json`` (metric, value, iteration). Both are written
atomically, and ``best.json`` carries the comparison across a ``--resume``. Higher is better; a tie keeps the
earlier weights. Choosing weights by the evaluation set makes that set's AP an optimistic estimate: evaluate the
kept weights on images the choice did not see.
"""
from __future__ import annotations

import json
import logging
import math
import os

import torch

from winpos.errors import WinposError
from winpos.utils.outputs import atomic_write, atomic_write_json

__all__ = ["KeepBest", "BEST_WEIGHTS", "BEST_RECORD", "check_keep_best"]

logger = logging.getLogger(__name__)

BEST_WEIGHTS, BEST_RECORD = "model_best.pth", "best.json"


def check_keep_best(cfg) -> str | None:
    """``train.keep_best`` of ``cfg`` (None when unset or empty); refused in one line without periodic evaluation."""
    from omegaconf import OmegaConf

    metric = OmegaConf.select(cfg, "train.keep_best", default=None)
    if metric in (None, ""):
        return None
    if not isinstance(metric, str) or "/" not in metric:
        raise WinposError(f"train.keep_best={metric!r} must name one evaluation result as task/metric, e.g. "
                          "train.keep_best=bbox/AP or segm/AP50")
    period = OmegaConf.select(cfg, "train.eval_period", default=0) or 0
    if period <= 0 or period >= cfg.train.max_iter:
        raise WinposError(f"train.keep_best={metric} compares periodic evaluations, but train.eval_period={period} "
                          f"evaluates only after the last of {cfg.train.max_iter} iterations; set train.eval_period "
                          f"below it, e.g. train.eval_period={max(cfg.train.max_iter // 5, 1)}")
    return metric


class KeepBest:
    """Called with each evaluation's results and the iterations done; keeps the best weights (see the module)."""

    def __init__(self, model, output_dir: str, metric: str, resume: bool = False):
        self.model, self.output_dir, self.metric = model, output_dir, metric
        self.best: dict | None = None
        record = os.path.join(output_dir, BEST_RECORD)
        if not resume:  # a new run (or one started over with --force): an earlier run's best is not this run's
            for name in (BEST_RECORD, BEST_WEIGHTS):
                if os.path.isfile(os.path.join(output_dir, name)):
                    os.remove(os.path.join(output_dir, name))
                    logger.info(f"removed {name} of an earlier run in {output_dir}")
        elif os.path.isfile(record):  # a resumed run: continue its comparison
            try:
                held = json.loads(open(record).read())
                value, iteration = float(held["value"]), int(held["iteration"])
            except (OSError, ValueError, KeyError, TypeError):
                raise WinposError(f"{record} is not a best-weights record of winpos; restore it, or delete it and "
                                  f"{BEST_WEIGHTS} to start the comparison over") from None
            if held.get("metric") != metric:
                raise WinposError(f"{record} kept the best {held.get('metric')!r}, but train.keep_best={metric}; "
                                  f"keep the same metric for a resume, or delete {BEST_RECORD} and {BEST_WEIGHTS}")
            self.best = {"metric": metric, "value": value, "iteration": iteration}

    def value_of(self, results: dict) -> float:
        task, _, name = self.metric.partition("/")
        try:
            value = float(results[task][name])
        except (KeyError, TypeError, ValueError):
            have = [f"{t}/{k}" for t, r in (results or {}).items() if isinstance(r, dict) for k in r]
            raise WinposError(f"train.keep_best={self.metric} is not among the evaluation's results ("
                              f"{', '.join(have[:12]) or 'none'}{', ...' if len(have) > 12 else ''})") from None
        if not math.isfinite(value):
            raise WinposError(f"the evaluation gave {self.metric}={value}; nothing to compare")
        return value

    def __call__(self, results: dict, iteration: int) -> bool:
        """Compare ``results`` (after ``iteration`` iterations) with the best so far; returns whether they were kept."""
        value = self.value_of(results)
        if self.best is not None and value <= self.best["value"]:
            logger.info(f"{self.metric} {value:.3f} at iteration {iteration}: the best stays {self.best['value']:.3f} "
                        f"(iteration {self.best['iteration']})")
            return False
        model = getattr(self.model, "module", self.model)  # DDP
        state = {"model": {k: v.detach().cpu() for k, v in model.state_dict().items()}, "iteration": iteration}
        atomic_write(os.path.join(self.output_dir, BEST_WEIGHTS), lambda f: torch.save(state, f), "wb")
        self.best = {"metric": self.metric, "value": value, "iteration": iteration}
        atomic_write_json(os.path.join(self.output_dir, BEST_RECORD), self.best)
        logger.info(f"{self.metric} {value:.3f} at iteration {iteration}: the best so far, kept in {BEST_WEIGHTS}")
        return True
