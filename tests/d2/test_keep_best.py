"""train.keep_best (winpos.d2.best): the best evaluation's weights and record, across a resume, and what it refuses;
one short training run whose kept value is the largest its metrics.json recorded."""
import json

import pytest
import torch

from winpos.d2.best import BEST_RECORD, BEST_WEIGHTS, KeepBest, check_keep_best
from winpos.errors import WinposError


def _results(ap):
    return {"bbox": {"AP": ap, "AP50": ap + 10}, "segm": {"AP": ap - 5}}


def _weights(tmp_path):
    return torch.load(tmp_path / BEST_WEIGHTS, map_location="cpu", weights_only=True)


def test_the_best_weights_and_record_follow_the_highest_value(tmp_path):
    model = torch.nn.Linear(2, 2)
    keep = KeepBest(model, str(tmp_path), "bbox/AP")
    for i, ap in enumerate([10.0, 12.0, 11.0, 12.0], start=1):  # a tie keeps the earlier weights
        with torch.no_grad():
            model.weight.fill_(float(i))
        assert keep(_results(ap), 100 * i) == (i in (1, 2))
    assert json.loads((tmp_path / BEST_RECORD).read_text()) == {"metric": "bbox/AP", "value": 12.0, "iteration": 200}
    saved = _weights(tmp_path)
    assert saved["iteration"] == 200 and torch.equal(saved["model"]["weight"], torch.full((2, 2), 2.0))


def test_a_resume_continues_the_comparison_and_a_new_run_starts_over(tmp_path):
    model = torch.nn.Linear(2, 2)
    KeepBest(model, str(tmp_path), "segm/AP")(_results(20.0), 50)  # segm/AP 15
    resumed = KeepBest(model, str(tmp_path), "segm/AP", resume=True)
    assert resumed.best == {"metric": "segm/AP", "value": 15.0, "iteration": 50}
    assert not resumed(_results(19.0), 100) and resumed(_results(21.0), 150)
    with pytest.raises(WinposError, match="kept the best 'segm/AP', but train.keep_best=bbox/AP"):
        KeepBest(model, str(tmp_path), "bbox/AP", resume=True)
    fresh = KeepBest(model, str(tmp_path), "bbox/AP")  # not a resume: the earlier run's files go
    assert fresh.best is None and not (tmp_path / BEST_RECORD).exists() and not (tmp_path / BEST_WEIGHTS).exists()
    (tmp_path / BEST_RECORD).write_text("{not json")
    with pytest.raises(WinposError, match="not a best-weights record"):
        KeepBest(model, str(tmp_path), "bbox/AP", resume=True)


def test_a_metric_the_evaluation_does_not_give_is_named_with_those_it_does(tmp_path):
    keep = KeepBest(torch.nn.Linear(2, 2), str(tmp_path), "bbox/APm")
    with pytest.raises(WinposError, match=r"bbox/APm is not among the evaluation's results \(bbox/AP, bbox/AP50, "
                                          r"segm/AP\)"):
        keep(_results(1.0), 10)
    with pytest.raises(WinposError, match="nothing to compare"):
        KeepBest(torch.nn.Linear(2, 2), str(tmp_path), "bbox/AP")(_results(float("nan")), 10)


@pytest.mark.parametrize("overrides, message", [
    (["train.keep_best=bbox/AP"], "evaluates only after the last of 300 iterations; set train.eval_period below it"),
    (["train.keep_best=bbox/AP", "train.eval_period=300"], "train.eval_period=300 evaluates only after"),
    (["train.keep_best=AP", "train.eval_period=50"], "must name one evaluation result as task/metric"),
])
def test_settings_that_compare_nothing_are_refused(overrides, message):
    from winpos.d2.config import load_config

    cfg = load_config("shapes/small_data_hieradet.py", overrides)
    with pytest.raises(WinposError, match=message):
        check_keep_best(cfg)


def test_a_short_run_keeps_the_largest_value_its_metrics_recorded(tmp_path):
    from winpos.d2.config import load_config
    from winpos.d2.engine import do_train

    out = tmp_path / "run"
    cfg = load_config("shapes/small_data_hieradet.py", [
        f"train.output_dir={out}", "train.max_iter=4", "train.eval_period=2", "train.keep_best=bbox/AP50",
        "train.checkpointer.period=2"] + [f"dataloader.{split}.dataset.shapes.{key}={n}" for split in ("train", "test")
                                          for key, n in (("train_images", 4), ("val_images", 3))])
    do_train(cfg)
    record = json.loads((out / BEST_RECORD).read_text())
    evals = [json.loads(line) for line in (out / "metrics.json").read_text().splitlines()]
    seen = {min(e["iteration"] + 1, 4): e["bbox/AP50"] for e in evals if "bbox/AP50" in e}  # after training: 4
    assert sorted(seen) == [2, 4]  # the periodic evaluation and the one after training
    best_iter = max(seen, key=lambda i: (seen[i], -i))
    assert record == {"metric": "bbox/AP50", "value": pytest.approx(seen[best_iter]), "iteration": best_iter}
    assert _weights(out)["iteration"] == best_iter
