"""Bad inputs, part 2: arguments that were silently misread, tracebacks instead of one-line errors, messages that
name the problem and the fix, and residue a failed run must not leave. Part 1 (data loss, wrong files, random
weights) is tests/test_bad_inputs.py; docs/bad_inputs.md lists every input and what it gets.
"""
import json
import logging
import os
from pathlib import Path

import pytest
import torch
from PIL import Image

from tests.bad_inputs_helpers import (  # noqa: F401 (detector is a fixture)
    ROOT, CONFIG, VIT_CONFIG, tool, assert_one_line_error, detector, _images, _save_vit,
)


# -------------------------------------------------------------------------------- silently misread arguments


def test_doctor_uses_the_strict_override_loader():
    from winpos.d2.doctor import diagnose

    with pytest.raises(ValueError, match="no key 'nett'.*Did you mean 'model.backbone.net'"):
        diagnose(str(VIT_CONFIG), overrides=["model.backbone.nett.recipe=paper"])  # was: diagnosed 'original'
    with pytest.raises(ValueError, match="integer"):
        diagnose(str(VIT_CONFIG), overrides=["model.backbone.net.img_size=abc"])
    assert diagnose(str(VIT_CONFIG), overrides=["model.backbone.net.recipe=paper"]).ok  # a real key still works


def test_doctor_image_size_zero_is_an_error():
    res = tool("posemb_viz.py", "doctor", "vitdet_b", "--image-size", "0")
    assert res.returncode == 2 and "--image-size" in res.stderr, res.stderr[-2000:]
    from winpos.d2.doctor import diagnose

    with pytest.raises(ValueError, match="image"):
        diagnose("vitdet_b", 0)


def test_img_size_as_a_string_is_refused():
    from winpos.backbones import create

    with pytest.raises(ValueError, match="img_size"):
        create("vitdet_toy", img_size="64")
    with pytest.raises(ValueError, match="img_size"):
        create("hieradet_toy", img_size=[64, "96"])
    create("vitdet_toy", img_size=(64, 96))  # numbers still work


def test_convert_refuses_a_misspelled_suffix(tmp_path):
    src = tmp_path / "own.pth"
    _save_vit(src)
    res = tool("convert_checkpoint.py", "--input", src, "--output", tmp_path / "x.safetensor", "--to", "vitdet_toy")
    assert_one_line_error(res, ".safetensors")
    assert not (tmp_path / "x.safetensor").exists()


def test_setup_logs_winpos_messages_such_as_the_init_checkpoint_report(tmp_path):
    import argparse

    from winpos.d2.engine import setup

    args = argparse.Namespace(config_file=str(CONFIG), opts=[f"train.output_dir={tmp_path}", "train.device=cpu"],
                              eval_only=False, resume=False, dataset=[], random_weights=False)
    setup(args)
    logging.getLogger("winpos").info("load report marker")
    for h in logging.getLogger("winpos").handlers:
        h.flush()
    assert "load report marker" in (tmp_path / "log.txt").read_text()


# -------------------------------------------------------------------------------------------- tracebacks


def test_wrong_override_type_is_refused_when_parsed():
    from winpos.d2.config import load_config

    with pytest.raises(ValueError, match="train.max_iter.*integer"):
        load_config(CONFIG, ["train.max_iter=abc"])
    with pytest.raises(ValueError, match="integer"):
        load_config(CONFIG, ["train.max_iter=1.5"])
    assert load_config(CONFIG, ["train.max_iter=7"]).train.max_iter == 7


def test_missing_init_checkpoint_is_one_line_and_keeps_config_yaml(tmp_path):
    (tmp_path / "config.yaml").write_text("the run's own config\n")
    res = tool("train_net.py", "--config-file", CONFIG, "--resume", f"train.output_dir={tmp_path}", "train.device=cpu",
               f"train.init_checkpoint={tmp_path / 'missing.pth'}")
    assert_one_line_error(res, "missing.pth", "does not exist")
    assert (tmp_path / "config.yaml").read_text() == "the run's own config\n"  # a failed start changes nothing


def test_eval_coco_missing_checkpoint_is_one_line(tmp_path):
    res = tool("eval_coco.py", "--config-file", CONFIG, "--checkpoint", tmp_path / "missing.pth", "--output",
               tmp_path / "eval", "train.device=cpu")
    assert_one_line_error(res, "missing.pth", "does not exist")


def test_predict_skips_an_unreadable_image_and_keeps_the_others(detector, tmp_path):
    from winpos.d2.predict import predict_images

    cfg, model, _ = detector
    images = _images(tmp_path / "imgs", ["a.png", "c.png"])
    (images / "b.png").write_bytes(b"not an image")
    records = predict_images(cfg, model, [images], tmp_path / "out", 0.5)
    saved = json.loads((tmp_path / "out" / "predictions.json").read_text())
    assert [Path(r["file"]).name for r in saved] == ["a.png", "b.png", "c.png"]
    assert "error" in saved[1] and "drawing" in saved[0] and "drawing" in saved[2]
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if not p.name.startswith(".")) == \
        ["a.png", "c.png", "predictions.json"]
    assert len(records) == 3


def test_a_dataset_with_only_bad_entries_is_refused_when_registered(tmp_path):
    from winpos.d2.engine import register_cli_datasets

    _images(tmp_path / "imgs", ["a.png"])
    ann = {"images": [{"id": 1, "file_name": "a.png", "width": 64, "height": 64}],
           "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 0, 0], "area": 0,
                            "iscrowd": 0}],
           "categories": [{"id": 1, "name": "thing"}]}
    (tmp_path / "ann.json").write_text(json.dumps(ann))
    with pytest.raises(ValueError, match="no usable"):
        register_cli_datasets([f"allbad_{os.getpid()}={tmp_path / 'ann.json'}:{tmp_path / 'imgs'}"])


def test_get_dataset_dicts_on_an_empty_dataset_is_a_clear_error():
    from detectron2.data import DatasetCatalog

    from winpos.d2.data import get_dataset_dicts

    name = f"empty_{os.getpid()}"
    DatasetCatalog.register(name, lambda: [])
    with pytest.raises(ValueError, match="no usable images"):
        get_dataset_dicts(name)


def test_convert_output_that_is_a_folder_is_refused_before_the_work(tmp_path):
    src = tmp_path / "own.pth"
    _save_vit(src)
    res = tool("convert_checkpoint.py", "--input", src, "--output", tmp_path, "--to", "vitdet_toy")
    assert_one_line_error(res, "is a folder")
    assert "matched" not in res.stdout  # refused before the conversion ran


@pytest.mark.parametrize("args,needle", [
    (["--sizes", "abc"], "--sizes"),
    (["--sizes", "64"], "--sizes"),
    (["--preset", "vitdet_q"], "--preset"),
    (["--preset", "hieradet_b"], "--preset"),
    (["--threads", "0"], "--threads"),
    (["--warmup", "-1"], "--warmup"),
    (["--plot", "scaling.txt"], "--plot"),
])
def test_benchmark_scaling_refuses_bad_arguments(args, needle, tmp_path):
    res = tool("benchmark.py", "scaling", "--preset", "vitdet_toy", "--sizes", "64,128", "--repeats", "1",
               "--no-memory", *args, cwd=tmp_path, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert needle in res.stderr.strip().splitlines()[-1]


def test_doctor_on_a_python_file_that_is_no_config(tmp_path):
    res = tool("posemb_viz.py", "doctor", ROOT / "configs" / "common" / "optim.py")
    assert_one_line_error(res, "no winpos backbone")


# -------------------------------------------------------------------------------------------- clear messages


def test_eval_sizes_names_the_flag(tmp_path):
    res = tool("eval_coco.py", "--config-file", CONFIG, "--checkpoint", "x.pth", "--sizes", "abc")
    assert res.returncode == 2 and "--sizes" in res.stderr and "invalid literal" not in res.stderr


def test_png_renamed_to_pth_is_called_an_image(tmp_path):
    from winpos.checkpoints.io import load_checkpoint_object

    path = tmp_path / "weights.pth"
    Image.new("RGB", (8, 8)).save(path, format="PNG")
    with pytest.raises(ValueError, match="PNG image") as ei:
        load_checkpoint_object(path)
    assert "truncated" not in str(ei.value)


def test_doctor_on_a_file_that_is_no_preset_says_so():
    res = tool("posemb_viz.py", "doctor", ROOT / "README.md")
    assert_one_line_error(res, "neither a LazyConfig")


def test_a_flag_after_the_overrides_is_named(tmp_path):
    res = tool("train_net.py", "--config-file", CONFIG, f"train.output_dir={tmp_path}", "--eval-only")
    assert res.returncode == 2 and "--eval-only comes after the key=value overrides" in res.stderr, res.stderr
    from winpos.d2.config import load_config

    with pytest.raises(ValueError, match="--eval-only comes after"):
        load_config(CONFIG, ["train.max_iter=5", "--eval-only"])
    images = _images(tmp_path / "imgs", ["a.png"])  # an override between --input and the next flag
    res = tool("predict.py", "--config-file", CONFIG, "--input", images, "train.device=cpu", "--output",
               tmp_path / "out", "--checkpoint", tmp_path / "w.pth")
    assert_one_line_error(res, "--input", "train.device=cpu", "after every flag")


# ---------------------------------------------------------------------------------------------------- residue


def test_temp_files_of_a_killed_save_are_removed(tmp_path):
    from winpos.d2.checkpoint import WinposCheckpointer

    dead = 2 ** 22 + 12345  # above the default pid_max: no such process
    stale = tmp_path / f"model_0000009.pth.{dead}.tmp"
    stale.write_bytes(b"")
    live = tmp_path / f"model_0000019.pth.{os.getppid()}.tmp"  # a running process's save is left alone
    live.write_bytes(b"")
    WinposCheckpointer(torch.nn.Linear(2, 2), str(tmp_path))
    assert not stale.exists() and live.exists()


def test_cli_output_has_no_third_party_deprecation_warnings():
    res = tool("posemb_viz.py", "doctor", ROOT / "configs" / "COCO" / "mask_rcnn_vitdet_b_100ep.py", "--recipe", "paper")
    assert res.returncode == 0, res.stderr  # a config target: detectron2 is imported
    assert "deprecated" not in res.stderr, res.stderr


def test_posemb_viz_error_is_not_wrapped_in_progress_bar_fragments(tmp_path):
    bad = tmp_path / "notes.pth"
    bad.write_text("hello")
    res = tool("posemb_viz.py", "plot", bad, "--out", tmp_path / "viz")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [res.stderr.strip()] and res.stderr.startswith("error:"), res.stderr
