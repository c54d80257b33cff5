"""A run folder's ``config.yaml`` is data (issue 45, cases F05-F07): no YAML tag builds an object while it is read,
and no ``_target_`` outside the trusted modules is resolved or called, under ``winpos-train --resume``,
``winpos-eval --config-file config.yaml`` and ``winpos-predict``.

The oracle of "nothing ran" is a marker file that the payload would create (``touch``) and a module beside the
config that would write one when imported; the oracle of "benign configs still load" is detectron2's own
``LazyConfig.load`` on the same files.
"""
import shutil

import pytest
from detectron2.config import LazyConfig
from omegaconf import OmegaConf

import winpos.d2  # noqa: F401 - registrations
from tests.bad_inputs_helpers import ROOT, assert_one_line_error, tool
from winpos.d2.config import load_config
from winpos.d2.safe_config import check_target, load_yaml_config, read_yaml_as_data
from winpos.errors import WinposError

SHAPES = ROOT / "configs" / "shapes" / "mask_rcnn_hieradet_toy_abswin.py"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """``config.yaml`` of the tiny shapes config as ``winpos-train`` writes it (detectron2's ``LazyConfig.save``)."""
    folder = tmp_path_factory.mktemp("run")
    path = folder / "config.yaml"
    LazyConfig.save(load_config(SHAPES, ["train.device=cpu"]), str(path))
    return path


def _with(saved, tmp_path, old, new, name="config.yaml"):
    text = saved.read_text()
    assert old in text
    out = tmp_path / name
    out.write_text(text.replace(old, new, 1))
    return out


@pytest.mark.parametrize("name", ["shapes/mask_rcnn_vitdet_toy_rope.py", "shapes/reproduce_hieradet.py",
                                  "COCO/cascade_mask_rcnn_vitdet_b_100ep.py", "COCO/mask_rcnn_hieradet_l_100ep.py"])
def test_a_saved_config_reads_as_detectron2_reads_it(name, tmp_path):
    path = tmp_path / "config.yaml"
    LazyConfig.save(load_config(name), str(path))
    assert "!!python/object:detectron2.layers.shape_spec.ShapeSpec" in path.read_text()  # the tag it must know
    ours = OmegaConf.to_container(load_yaml_config(path), resolve=False)
    theirs = OmegaConf.to_container(LazyConfig.load(str(path)), resolve=False)
    assert ours == theirs
    data = read_yaml_as_data(path)  # plain containers and ShapeSpec objects; as a config, the same
    assert OmegaConf.to_container(OmegaConf.create(data, flags={"allow_objects": True}), resolve=False) == theirs


def test_a_python_tag_is_refused_and_runs_nothing(saved, tmp_path):
    marker = tmp_path / "ran"
    bad = tmp_path / "config.yaml"
    bad.write_text(f"payload: !!python/object/apply:os.system ['touch {marker}']\n" + saved.read_text())
    with pytest.raises(WinposError, match=r"holds the YAML tag .*python/object/apply:os.system.* \(line \d+\)"):
        load_config(bad)
    assert not marker.exists()
    tree = read_yaml_as_data(bad)  # for comparisons: an inert node, nothing built
    assert tree["payload"] == {"!!tag": "tag:yaml.org,2002:python/object/apply:os.system",
                               "value": [f"touch {marker}"]}
    assert not marker.exists()


def test_a_shape_spec_tag_takes_integer_fields_only(saved, tmp_path):
    bad = _with(saved, tmp_path, "{channels: 64,", "{channels: 64, extra: 1,")
    with pytest.raises(WinposError, match="ShapeSpec takes integer or null"):
        load_yaml_config(bad)


@pytest.mark.parametrize("target", ["os.system", "builtins.eval", "subprocess.Popen", "winpos.d2.config.load_config",
                                    "detectron2.config.LazyConfig.load", "torch.hub.load", "torch.load"])
def test_an_untrusted_target_is_refused_before_it_is_resolved(saved, tmp_path, target):
    bad = _with(saved, tmp_path, "_target_: winpos.d2.HieraDetBackbone", f"_target_: {target}")
    with pytest.raises(WinposError, match=r"model\.backbone\.bottom_up\._target_ .*(outside the trusted modules|resolves to)"):
        load_config(bad)


def test_a_module_beside_the_config_is_never_imported(saved, tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    (tmp_path / "evil_models.py").write_text(f"open({str(marker)!r}, 'w').close()\nclass Net: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    bad = _with(saved, tmp_path, "_target_: winpos.d2.HieraDetBackbone", "_target_: evil_models.Net")
    with pytest.raises(WinposError, match="WINPOS_TRUSTED_TARGETS"):
        load_config(bad)
    assert not marker.exists()
    monkeypatch.setenv("WINPOS_TRUSTED_TARGETS", "evil_models")  # the user's own, trusted code: allowed
    assert load_config(bad).model.backbone.bottom_up._target_ == "evil_models.Net"
    assert marker.exists()


def test_a_reexported_name_is_checked_where_it_lives():
    check_target("winpos.d2.HieraDetBackbone", "model.backbone", "x")  # lives in winpos.d2.backbone: trusted
    check_target("torch.optim.AdamW", "optimizer", "x")
    with pytest.raises(WinposError, match="resolves to"):
        check_target("torch.nn.modules.module.torch", "m", "x")  # a module object, not a class or function
    with pytest.raises(WinposError, match="not a dotted Python name"):
        check_target("os.system; rm -rf /", "m", "x")


# ------------------------------------------------------------------------------------ the three commands


@pytest.fixture(scope="module")
def payload_run(saved, tmp_path_factory):
    """A shared run folder: its ``config.yaml`` carries the YAML payload inside ``model`` (a key a resume
    compares), and ``last_checkpoint`` names a checkpoint, so ``--resume`` reads the config before anything else."""
    folder = tmp_path_factory.mktemp("shared_run")
    marker = folder / "ran"
    text = saved.read_text().replace("model:\n", f"model:\n  payload: !!python/object/apply:os.system "
                                                 f"['touch {marker}']\n", 1)
    (folder / "config.yaml").write_text(text)
    (folder / "last_checkpoint").write_text("model_0000009.pth")  # a run to resume: its config.yaml is compared
    return folder, marker


def test_eval_on_a_payload_config_runs_nothing(payload_run, tmp_path):
    folder, marker = payload_run
    res = tool("eval_coco.py", "--config-file", folder / "config.yaml", "--output", tmp_path / "out",
               "--no-progress", "train.device=cpu")
    assert_one_line_error(res, "holds the YAML tag", "python/object/apply:os.system")
    assert not marker.exists()


def test_predict_on_a_target_payload_runs_nothing(saved, tmp_path):
    marker = tmp_path / "ran"
    bad = _with(saved, tmp_path, "      _target_: winpos.d2.HieraDetBackbone\n",
                f"      _target_: os.system\n      command: touch {marker}\n")
    image = tmp_path / "img.png"
    shutil.copy(ROOT / "docs" / "figures" / next(p.name for p in (ROOT / "docs" / "figures").glob("*.png")), image)
    res = tool("predict.py", "--config-file", bad, "--random-weights", "--input", image, "--output",
               tmp_path / "preds", "train.device=cpu")
    assert_one_line_error(res, "model.backbone.bottom_up._target_ 'os.system' is outside the trusted modules")
    assert not marker.exists()


def test_resume_with_the_users_own_py_config_runs_nothing(payload_run):
    folder, marker = payload_run
    res = tool("train_net.py", "--config-file", SHAPES, "--resume", f"train.output_dir={folder}",
               "train.device=cpu", "train.max_iter=1")
    assert res.returncode != 0, res.stderr[-2000:]
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    assert "model.payload" in res.stderr.strip().splitlines()[-1], res.stderr[-2000:]
    assert not marker.exists()
