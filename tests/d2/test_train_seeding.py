"""``do_train`` seeds the process's global RNGs from ``train.seed``, so one config trained twice gives the same
weights bit for bit, whatever state the caller left the global streams in (the reproduction's child processes
call ``do_train`` without ``setup``, and a fresh process starts torch's and numpy's streams from entropy).

The negative control shows that the check can fail: with the seeding switched off, the same two calls give
different weights (the RPN and ROI heads sample proposals with ``torch.randperm`` from the global stream).
About 30 s on 2 CPU cores (four 3-iteration runs of the toy detector)."""
import random
from pathlib import Path

import numpy as np
import pytest
import torch

import winpos.d2  # noqa: F401 - registrations
from winpos.d2 import engine
from winpos.d2.config import load_config
from winpos.errors import WinposError

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "shapes" / "mask_rcnn_hieradet_toy_abswin.py"


def _cfg(out, *extra):
    return load_config(CONFIG, [f"train.output_dir={out}", "train.device=cpu", "train.max_iter=3",
                                "train.checkpointer.period=100", "train.log_period=1", "train.eval_after_train=false",
                                "dataloader.train.total_batch_size=2", *extra])


def _train(out, scramble: int) -> dict:
    """Leave the global streams in a state of ``scramble``'s choosing, then train; the final weights."""
    torch.manual_seed(scramble)
    np.random.seed(scramble)
    random.seed(scramble)
    engine.do_train(_cfg(out))
    return torch.load(out / "model_final.pth", weights_only=True)["model"]


def _differing(a: dict, b: dict) -> list:
    assert a.keys() == b.keys()
    return [k for k in a if not torch.equal(a[k], b[k])]


def test_same_config_trained_twice_gives_the_same_weights(tmp_path):
    a = _train(tmp_path / "a", scramble=11)
    b = _train(tmp_path / "b", scramble=12345)
    assert _differing(a, b) == []


def test_without_the_seeding_the_global_streams_change_the_weights(tmp_path, monkeypatch):
    monkeypatch.setattr(engine, "seed_process", lambda cfg: None)
    a = _train(tmp_path / "a", scramble=11)
    b = _train(tmp_path / "b", scramble=12345)
    assert len(_differing(a, b)) > 0


@pytest.mark.parametrize("seed,message", [(-1, "is negative"), (1.5, "is not an integer"), (True, "is not an integer")])
def test_a_bad_seed_is_refused_by_seed_process(tmp_path, seed, message):
    cfg = _cfg(tmp_path / "run")
    cfg.train.seed = seed
    with pytest.raises(WinposError, match=message):
        engine.seed_process(cfg)


def test_seed_process_uses_seed_plus_rank_and_none_draws_afresh(tmp_path):
    cfg = _cfg(tmp_path / "run")
    cfg.train.seed = 7
    assert engine.seed_process(cfg) == 7  # one process: rank 0
    first = torch.rand(3)
    engine.seed_process(cfg)
    assert torch.equal(torch.rand(3), first)
    cfg.train.seed = None
    assert engine.seed_process(cfg) is None
