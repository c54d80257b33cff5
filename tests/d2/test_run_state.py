"""A training run's state across interruptions (issue 38): a run stopped before or during its final evaluation is
finished by ``--resume`` (same results), its final evaluation is tied to its config and weights by digests (an
edited result is refused), a resume that changes what defines the run is refused naming the key, a longer schedule
is said and recorded, and ``--eval-only`` never replaces a run's own evaluation without ``--force``.

The oracle for "same results" is the run's own first evaluation. One 2-iteration toy run (64 px, batch 2) on a
4-image evaluation set, trained once for the module: about 15 s on 2 busy CPU cores, each test a few more.
"""
import json
import shutil
import zipfile

import pytest

import winpos.d2  # noqa: F401 - registrations
from tests.bad_inputs_helpers import ROOT, assert_one_line_error, tool
from winpos.d2 import engine
from winpos.d2.config import load_config
from winpos.errors import WinposError

CONFIG = ROOT / "configs" / "shapes" / "reproduce_hieradet.py"
FINAL_RESULTS = "final_results.json"  # winpos.d2.run_dir.FINAL_RESULTS, written here so that the tests also run
# (and fail) against code from before it existed


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    """A 4-image one-class shapes set at 64 px, registered as ``mini``; returns its ``--dataset`` spec."""
    from winpos.d2.engine import register_cli_datasets
    from winpos.data.shapes import generate_shapes, one_class_json

    root = tmp_path_factory.mktemp("mini")
    ann = one_class_json(generate_shapes(root, "val", 4, image_size=64, seed=3, max_objects=3))
    spec = f"mini={ann}:{root / 'val'}"
    register_cli_datasets([spec])
    return spec


def _opts(out, *extra):
    return [f"train.output_dir={out}", "train.device=cpu", "train.max_iter=2", "train.checkpointer.period=1",
            "train.log_period=1", "dataloader.train.total_batch_size=2", "dataloader.test.dataset.names=mini", *extra]


def _cfg(out, *extra):
    return load_config(CONFIG, _opts(out, *extra))


@pytest.fixture(scope="module")
def finished(tmp_path_factory, mini):
    """A finished run (trained and evaluated) and its results."""
    out = tmp_path_factory.mktemp("run")
    results = engine.do_train(_cfg(out))
    from winpos.d2.run_dir import release_run_dir

    release_run_dir(out)
    return out, results


def _copy(finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished[0], out)
    return out


def _same(a: dict, b: dict) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # NaN == NaN here


def test_resume_of_a_run_stopped_before_its_final_evaluation_evaluates_it(finished, tmp_path):
    out = _copy(finished, tmp_path)
    (out / FINAL_RESULTS).unlink()  # trained to max_iter, killed before the evaluation was written
    shutil.rmtree(out / "inference")
    results = engine.do_train(_cfg(out), resume=True)
    assert results and _same(results, finished[1])
    assert (out / FINAL_RESULTS).is_file() and (out / "inference" / "coco_instances_results.json").is_file()


def test_resume_of_a_finished_run_returns_its_recorded_results(finished, tmp_path):
    out = _copy(finished, tmp_path)
    assert _same(engine.do_train(_cfg(out), resume=True), finished[1])


@pytest.mark.parametrize("edit,message", [
    (lambda d: d["results"]["bbox"].update(AP=99.9), "was edited"),
    (lambda d: d.update(config_sha256="0" * 64, digest=None), "was edited"),
])
def test_an_edited_final_result_is_refused(finished, tmp_path, edit, message):
    out = _copy(finished, tmp_path)
    data = json.loads((out / FINAL_RESULTS).read_text())
    edit(data)
    (out / FINAL_RESULTS).write_text(json.dumps(data))
    with pytest.raises(WinposError, match=message):
        engine.do_train(_cfg(out), resume=True)


def test_an_edited_config_of_a_finished_run_is_refused(finished, tmp_path):
    out = _copy(finished, tmp_path)
    (out / "config.yaml").write_text((out / "config.yaml").read_text() + "\n# edited\n")
    with pytest.raises(WinposError, match="config.yaml changed after the run's final evaluation"):
        engine.do_train(_cfg(out), resume=True)


@pytest.mark.parametrize("override,key", [
    ("train.seed=7", "train.seed=7"),
    ("optimizer.lr=0.5", "optimizer.lr=0.5"),
    ("dataloader.train.total_batch_size=4", "dataloader.train.total_batch_size=4"),
    ("model.backbone.bottom_up.pos_embed=abswin", "model.backbone.bottom_up.pos_embed='abswin'"),
    ("lr_multiplier.warmup_factor=0.5", "lr_multiplier.warmup_factor=0.5"),
    ("train.freeze=trunk", r"train.freeze=\['backbone.bottom_up'\]"),
])
def test_a_resume_that_changes_the_run_is_refused_naming_the_key(finished, tmp_path, override, key):
    out = _copy(finished, tmp_path)
    with pytest.raises(WinposError, match=f"--resume: {key} differs from the run in .* config.yaml has"):
        engine.do_train(_cfg(out, override), resume=True)
    assert (out / "config.yaml").read_bytes() == (finished[0] / "config.yaml").read_bytes()


def test_freeze_is_compared_as_prefixes_and_a_config_saved_without_it_froze_nothing(finished, tmp_path):
    from winpos.d2.run_dir import check_resume

    out = _copy(finished, tmp_path)
    text = (out / "config.yaml").read_text()
    assert "freeze: []" in text
    (out / "config.yaml").write_text(text.replace("freeze: []", "freeze: trunk"))
    assert check_resume(_cfg(out, "train.freeze=[backbone.bottom_up]"), out) == []  # the preset's module path
    (out / "config.yaml").write_text(text.replace("  freeze: []\n", ""))  # saved before train.freeze existed
    assert check_resume(_cfg(out), out) == []


def test_a_longer_schedule_is_said_and_the_earlier_config_kept(finished, tmp_path):
    from winpos.d2.run_dir import check_resume, keep_earlier_config

    out = _copy(finished, tmp_path)
    assert check_resume(_cfg(out), out) == []
    assert check_resume(_cfg(out, "train.max_iter=3"), out) == [("train.max_iter", 3, 2)]
    name = keep_earlier_config(out, 2)
    assert (out / name).read_bytes() == (out / "config.yaml").read_bytes()


def test_resume_with_a_longer_schedule_trains_on_and_config_yaml_says_so(finished, tmp_path):
    out = _copy(finished, tmp_path)
    engine.do_train(_cfg(out, "train.max_iter=3"), resume=True)
    assert "max_iter: 3" in (out / "config.yaml").read_text()
    assert "max_iter: 2" in (out / "config.until_0000002.yaml").read_text()
    assert json.loads((out / FINAL_RESULTS).read_text())["iteration"] == 3


def test_eval_only_with_another_checkpoint_does_not_replace_the_runs_evaluation(finished, mini, tmp_path):
    out = _copy(finished, tmp_path)
    before = {p.name: p.read_bytes() for p in (out / "inference").iterdir() if not p.name.startswith(".")}
    args = ["--config-file", CONFIG, "--dataset", mini, "--eval-only",
            *_opts(out, f"train.init_checkpoint={out / 'model_0000000.pth'}")]
    res = tool("train_net.py", *args)
    assert_one_line_error(res, "--eval-only output", "already holds", "--force")
    assert {p.name: p.read_bytes() for p in (out / "inference").iterdir() if not p.name.startswith(".")} == before
    res = tool("train_net.py", args[0], args[1], args[2], args[3], "--force", *args[4:])
    assert res.returncode == 0, res.stderr[-2000:]
    after = (out / "inference" / "instances_predictions.pth").read_bytes()
    assert after != before["instances_predictions.pth"]
    assert zipfile.is_zipfile(out / "inference" / "instances_predictions.pth")  # whole (a torch zip archive)


def test_a_run_whose_final_checkpoint_fails_is_not_evaluated(mini, tmp_path, monkeypatch):
    from winpos.d2.checkpoint import WinposCheckpointer
    from winpos.utils.outputs import WriteError

    save = WinposCheckpointer.save

    def full_disk(self, name, **kwargs):
        if name == "model_final":
            raise WriteError(28, f"could not write {self.save_dir}/model_final.pth (No space left on device)")
        return save(self, name, **kwargs)

    monkeypatch.setattr(WinposCheckpointer, "save", full_disk)
    evaluated = []
    monkeypatch.setattr(engine, "do_test", lambda cfg, model, progress=False: evaluated.append(1) or {"bbox": {}})
    with pytest.raises(WriteError, match="model_final.pth"):
        engine.do_train(_cfg(tmp_path / "run"))
    assert evaluated == [] and not (tmp_path / "run" / FINAL_RESULTS).exists()  # never-saved weights: no AP
