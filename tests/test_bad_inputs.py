"""Bad inputs to the tools and APIs: each is refused in one line (exit status 2) or handled without losing data.

One test (or parametrized group) per finding of the bad-input review; docs/bad_inputs.md lists the inputs and what
each gets. The command-line checks run the tools in subprocesses (one thread) exactly as a user would.
"""
import json
import logging
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"
CONFIG = ROOT / "configs" / "shapes" / "mask_rcnn_hieradet_toy_abswin.py"
VIT_CONFIG = ROOT / "configs" / "COCO" / "mask_rcnn_vitdet_b_100ep.py"


def _env():
    return dict(os.environ, OMP_NUM_THREADS="1", TQDM_DISABLE="0")


def tool(name, *args, timeout=600, preexec_fn=None, cwd=None):
    return subprocess.run([sys.executable, str(TOOLS / name), *map(str, args)], capture_output=True, text=True,
                          env=_env(), timeout=timeout, preexec_fn=preexec_fn, cwd=cwd)


def assert_one_line_error(res, *needles, code=2):
    """Exit ``code``, no traceback, and the last stderr line is one ``error:`` line holding every needle."""
    assert res.returncode == code, (res.returncode, res.stderr[-2000:])
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    last = res.stderr.strip().splitlines()[-1]
    assert ("error:" in last) and all(n in last for n in needles), res.stderr[-2000:]


# --------------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def detector(tmp_path_factory):
    """The tiny shapes config, its model and a saved checkpoint of it (``{"model": state_dict}``)."""
    from winpos.d2.config import load_config
    from winpos.d2.engine import build_model

    cfg = load_config(CONFIG, ["train.device=cpu"])
    model = build_model(cfg).eval()
    path = tmp_path_factory.mktemp("ckpt") / "model_final.pth"
    torch.save({"model": model.state_dict()}, path)
    return cfg, model, path


def _images(folder, names, size=64):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name in names:
        Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(folder / name)
    return folder


def _bytes(folder):
    return {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir())}


def _vit(**kw):
    from winpos.backbones import create

    return create("vitdet_toy", img_size=64, window_size=7, **kw)


def _save_vit(path, **kw):
    from tests.helpers import randomize

    model = randomize(_vit(**kw))
    torch.save({"model": model.state_dict()}, path)
    return model


# ------------------------------------------------------------------------------------------------ data loss


def test_predict_refuses_an_output_folder_holding_the_inputs(detector, tmp_path):
    _, _, ckpt = detector
    images = _images(tmp_path / "imgs", ["a.png", "b.png"])
    before = _bytes(images)
    res = tool("predict.py", "--config-file", CONFIG, "--checkpoint", ckpt, "--input", images, "--output", images,
               "train.device=cpu")
    assert_one_line_error(res, "--output", "holds the input")
    assert _bytes(images) == before  # byte-identical, nothing added


def test_predict_gives_same_stem_inputs_distinct_drawings(detector, tmp_path):
    from winpos.d2.predict import predict_images

    cfg, model, _ = detector
    _images(tmp_path / "a", ["x.png"])
    _images(tmp_path / "b", ["x.png", "x.jpg"])
    out = tmp_path / "out"
    records = predict_images(cfg, model, [tmp_path / "a", tmp_path / "b"], out, 0.5)
    drawings = [r["drawing"] for r in records]
    assert len(set(drawings)) == 3 and all(Path(d).is_file() for d in drawings)
    assert sorted(p.name for p in out.iterdir()) == ["predictions.json", "x-2.png", "x-3.png", "x.png"]


def test_convert_refuses_output_equal_to_input(tmp_path):
    src = tmp_path / "own.pth"
    _save_vit(src)
    before = src.read_bytes()
    res = tool("convert_checkpoint.py", "--input", src, "--output", src, "--to", "vitdet_toy")
    assert_one_line_error(res, "--output", "input")
    assert src.read_bytes() == before


def test_convert_refuses_an_existing_output_unless_forced(tmp_path):
    src, out = tmp_path / "own.pth", tmp_path / "out.pth"
    _save_vit(src)
    out.write_bytes(b"my only copy")
    res = tool("convert_checkpoint.py", "--input", src, "--output", out, "--to", "vitdet_toy")
    assert_one_line_error(res, "already exists", "--force")
    assert out.read_bytes() == b"my only copy"
    res = tool("convert_checkpoint.py", "--input", src, "--output", out, "--to", "vitdet_toy", "--img-size", 64,
               "--force")
    assert res.returncode == 0, res.stderr
    assert len(torch.load(out, weights_only=True)["model"]) > 50


def test_convert_on_a_full_disk_keeps_the_previous_file(tmp_path):
    """``ulimit -f``: the write fails with EFBIG part-way; the previous output stays whole, no temp file is left."""
    src, out = tmp_path / "own.pth", tmp_path / "out.pth"
    _save_vit(src)
    previous = b"previous complete file"
    out.write_bytes(previous)
    limit = 64 * 1024  # bytes; the converted checkpoint is ~2 MB

    def small_file_limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    res = tool("convert_checkpoint.py", "--input", src, "--output", out, "--to", "vitdet_toy", "--img-size", 64,
               "--force", preexec_fn=small_file_limit)
    assert_one_line_error(res, "could not write", code=1)
    assert out.read_bytes() == previous
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.pth", "own.pth"]


def test_atomic_write_shows_no_partial_file_and_cleans_up(tmp_path):
    from winpos.outputs import atomic_write

    target = tmp_path / "w.bin"
    target.write_bytes(b"old")

    def write(f):
        f.write(b"new data")
        assert sorted(os.listdir(tmp_path)) == ["w.bin"] or sys.platform != "linux"  # O_TMPFILE: no name yet

    atomic_write(target, write)
    assert target.read_bytes() == b"new data"

    def fail(f):
        f.write(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, fail)
    assert target.read_bytes() == b"new data" and os.listdir(tmp_path) == ["w.bin"]


# -------------------------------------------------------------------------------------- wrong files, exit 0


def test_format_winpos_reads_a_whole_winpos_detector_checkpoint(detector, tmp_path):
    from winpos.d2.checkpoint import _winpos_net

    _, model, ckpt = detector
    out = tmp_path / "trunk.safetensors"
    res = tool("convert_checkpoint.py", "--input", ckpt, "--output", out, "--to", "hieradet_toy", "--format",
               "winpos", "--img-size", 256, "--pos-embed", "abswin")
    assert res.returncode == 0, res.stderr[-2000:]
    from safetensors.torch import load_file

    written = load_file(str(out))
    prefix, net = _winpos_net(model)
    assert set(written) == set(net.state_dict())
    for k, v in net.state_dict().items():
        torch.testing.assert_close(written[k], v, rtol=0, atol=0, msg=k)


def test_unrecognised_hiera_checkpoint_names_the_real_flag():
    from winpos.checkpoints.hiera import convert_hiera_checkpoint

    with pytest.raises(ValueError, match="--format") as ei:
        convert_hiera_checkpoint({"foo.weight": torch.zeros(2)})
    assert "source=" not in str(ei.value)


def test_output_with_no_tensor_of_the_target_is_an_error(tmp_path):
    src = tmp_path / "head_only.pth"
    torch.save({"model_state": {"head.weight": torch.ones(3, 3), "norm.weight": torch.ones(3)}}, src)
    res = tool("convert_checkpoint.py", "--input", src, "--output", tmp_path / "h.pth", "--to", "hieradet_toy",
               "--format", "hiera")
    assert_one_line_error(res, "none of the checkpoint's 2 tensors", "--format auto")
    assert not (tmp_path / "h.pth").exists()


POS = ["abs", "abswin", "abswin_recursive", "none"]


@pytest.mark.parametrize("family", ["vitdet", "hieradet"])
@pytest.mark.parametrize("fmt", ["auto", "winpos"])
@pytest.mark.parametrize("src_kind,dst_kind", [(a, b) for a in POS for b in POS])
def test_own_checkpoints_convert_between_every_pos_embed(family, fmt, src_kind, dst_kind):
    """Every target tensor is written (position terms missing only from a source without one), nothing of the
    source is dropped unless the target has no embedding, and the report accounts for every tensor truthfully."""
    from tests.helpers import randomize
    from winpos.backbones import create
    from winpos.checkpoints import load_external

    kw = dict(img_size=64, window_size=7) if family == "vitdet" else dict(img_size=64)
    preset = "vitdet_toy" if family == "vitdet" else "hieradet_toy"
    src = randomize(create(preset, pos_embed=src_kind, **kw))
    sd, report = load_external({"model": src.state_dict()}, preset, format=fmt, pos_embed=dst_kind, **kw)
    dst = create(preset, pos_embed=dst_kind, **kw)
    result = dst.load_state_dict(sd, strict=False)
    assert not result.unexpected_keys
    pos_missing = [k for k in result.missing_keys if k.startswith("pos_embed.")]
    assert [k for k in result.missing_keys if not k.startswith("pos_embed.")] == []
    assert bool(pos_missing) == (src_kind == "none" and dst_kind != "none")
    dropped = [k for k, _ in report.unexpected]
    assert bool(dropped) == (dst_kind == "none" and src_kind != "none"), report.summary()
    assert all(k.startswith("pos_embed.") for k in dropped)
    done = len(report.matched) + len(report.converted) + len(report.reshaped)
    assert done == len(sd)
    if src_kind != dst_kind and "none" not in (src_kind, dst_kind) and {src_kind, dst_kind} != {"abswin",
                                                                                                "abswin_recursive"}:
        assert report.converted or report.reshaped, report.summary()  # a change of form is never "matched"
    for k, v in sd.items():
        assert torch.isfinite(v).all(), k


def test_nan_weights_are_refused_by_name(tmp_path):
    from winpos.checkpoints import load_external

    sd = _vit().state_dict()
    sd["blocks.0.attn.qkv.weight"] = torch.full_like(sd["blocks.0.attn.qkv.weight"], float("nan"))
    with pytest.raises(ValueError, match=r"blocks\.0\.attn\.qkv\.weight"):
        load_external(sd, "vitdet_toy", img_size=64, window_size=7)
    torch.save(sd, tmp_path / "nan.pth")
    res = tool("convert_checkpoint.py", "--input", tmp_path / "nan.pth", "--output", tmp_path / "o.pth", "--to",
               "vitdet_toy", "--img-size", 64)
    assert_one_line_error(res, "NaN", "blocks.0.attn.qkv.weight")
    assert not (tmp_path / "o.pth").exists()


def test_nan_init_checkpoint_is_refused_before_training(detector, tmp_path):
    from winpos.d2.checkpoint import WinposCheckpointer, load_init_checkpoint

    _, model, _ = detector
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    key = next(k for k, v in sd.items() if v.is_floating_point() and v.dim() > 1)
    sd[key][0] = float("inf")
    torch.save({"model": sd}, tmp_path / "inf.pth")
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        load_init_checkpoint(WinposCheckpointer(model), str(tmp_path / "inf.pth"))


# ------------------------------------------------------------------------------------------ random weights


def test_predict_requires_weights(tmp_path):
    images = _images(tmp_path / "imgs", ["a.png"])
    res = tool("predict.py", "--config-file", CONFIG, "--input", images, "--output", tmp_path / "out",
               "train.device=cpu")
    assert_one_line_error(res, "--checkpoint", "--random-weights")
    assert not (tmp_path / "out").exists()


def test_eval_only_requires_weights(tmp_path):
    res = tool("train_net.py", "--config-file", CONFIG, "--eval-only", f"train.output_dir={tmp_path}",
               "train.device=cpu")
    assert_one_line_error(res, "--eval-only", "train.init_checkpoint", "--random-weights")


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
    res = tool("train_net.py", "--config-file", CONFIG, f"train.output_dir={tmp_path}", "train.device=cpu",
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
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a.png", "c.png", "predictions.json"]
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
