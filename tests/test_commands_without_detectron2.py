"""Commands where detectron2 is missing, and the run geometry the doctor and the converter read without it.

A command that needs detectron2 (or a package of the ``[d2]`` extra) and cannot import it prints one ``error:`` line
naming the install command and exits 2 (``EXIT_ENVIRONMENT``), which no doctor verdict uses (0 OK, 1 BUG); any
other ImportError keeps its traceback. The installed commands themselves are run without detectron2 in
tests/test_wheel_install.py. The doctor reads a run's ``config.yaml``; winpos-convert builds the backbone the run
built (its window sizes and img_size) and records it and the training size in its output, where
``winpos-posemb plot`` finds the size.
"""
import json

import pytest
import torch

from winpos.backbones import create
from winpos.utils.cli import D2_INSTALL, EXIT_ENVIRONMENT, missing_d2_line, run_cli

RUN_WINDOWS = (8, 4, 8, 4)  # the shapes configs' HieraDet windows; the hieradet_toy preset's own are (8, 4, 14, 7)


def test_missing_detectron2_is_one_line_naming_the_install_command(monkeypatch):
    monkeypatch.setattr("sys.argv", ["/venv/bin/winpos-train"])
    line = missing_d2_line(ModuleNotFoundError("No module named 'detectron2'", name="detectron2"))
    assert line.startswith("winpos-train needs detectron2, which cannot be imported here") and line.endswith(D2_INSTALL)
    # a compiled part missing, and the form winpos.bench.blocked_imports raises (no module name on the error)
    assert "needs detectron2" in missing_d2_line(ModuleNotFoundError("No module named 'detectron2._C'",
                                                                     name="detectron2._C"))
    assert "needs detectron2" in missing_d2_line(ImportError("detectron2.config is blocked (WINPOS_BLOCK_IMPORTS)"))
    fvcore = missing_d2_line(ModuleNotFoundError("No module named 'fvcore'", name="fvcore"))
    assert "needs fvcore" in fvcore and "pip install 'winpos[d2]'" in fvcore
    assert "pip install hydra-core" in missing_d2_line(ModuleNotFoundError("x", name="hydra"))
    # not detectron2's stack, or a name missing from an installed package (a version mismatch): a traceback
    assert missing_d2_line(ModuleNotFoundError("No module named 'foo'", name="foo")) is None
    assert missing_d2_line(ImportError("cannot import name 'x' from 'detectron2.config'", name="detectron2.config")) \
        is None


def test_run_cli_exits_2_with_one_line_and_keeps_other_import_errors(capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["winpos-eval"])

    def needs_d2(argv):
        import importlib

        importlib.import_module("detectron2_is_not_here")  # stands for detectron2: same path through run_cli
        return 0

    def missing(argv):
        raise ModuleNotFoundError("No module named 'detectron2'", name="detectron2")

    assert run_cli(missing, []) == EXIT_ENVIRONMENT == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: winpos-eval needs detectron2") and err[0].endswith(D2_INSTALL)
    with pytest.raises(ModuleNotFoundError):  # not detectron2's: a bug, with its traceback
        run_cli(needs_d2, [])


def _run_folder(tmp_path, fmt="pth"):
    """A trained detector's output_dir as winpos-train leaves it: model_final.pth (the backbone under
    backbone.bottom_up.net., a head beside it) and config.yaml (plain data, with the ShapeSpec tag detectron2
    writes)."""
    run = tmp_path / "run"
    run.mkdir()
    net = create("hieradet_toy", recipe="original", window_spec=RUN_WINDOWS, img_size=256)
    torch.manual_seed(0)
    for p in net.parameters():
        p.data.normal_()
    sd = {f"backbone.bottom_up.net.{k}": v for k, v in net.state_dict().items()}
    sd["roi_heads.box_predictor.cls_score.weight"] = torch.zeros(3, 8)
    torch.save({"model": sd, "iteration": 10}, run / "model_final.pth")
    (run / "config.yaml").write_text(
        "dataloader:\n  train:\n    mapper: {image_size: 256, is_train: true}\n"
        "model:\n  backbone:\n    _target_: detectron2.modeling.FPN\n    bottom_up:\n"
        "      _target_: winpos.d2.HieraDetBackbone\n      drop_path_rate: 0.0\n      img_size: 256\n"
        "      net: hieradet_toy\n      out_features: [scale2, scale3, scale4, scale5]\n      recipe: original\n"
        "      window_spec: [8, 4, 8, 4]\n"
        "  roi_heads:\n    box_head:\n      input_shape: !!python/object:detectron2.layers.shape_spec.ShapeSpec "
        "{channels: 64, height: 7, stride: null, width: 7}\n")
    return run, net


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_convert_carries_the_runs_windows_and_image_size(tmp_path, capsys, suffix):
    from winpos.cli.convert_checkpoint import main
    from winpos.diagnostics.extract import effective_embeddings, native_size_from_config

    run, net = _run_folder(tmp_path)
    out = tmp_path / f"trunk{suffix}"
    assert main(["--input", str(run / "model_final.pth"), "--output", str(out), "--to", "hieradet_toy"]) == 0
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if x.startswith("load it with: "))
    assert "window_spec=(8, 4, 8, 4)" in line and "img_size=256" in line and "recipe='original'" in line, line
    # the printed line builds the run's backbone: the output loads into it strictly, equal to the run's weights
    built = eval(line[len("load it with: "):].split(".load_state_dict")[0], {"create": create})  # noqa: S307
    assert built.window_spec == RUN_WINDOWS != create("hieradet_toy").window_spec  # the run's, not the preset's
    if suffix == ".safetensors":
        from safetensors import safe_open
        from safetensors.torch import load_file

        sd = load_file(str(out))
        with safe_open(str(out), "pt") as f:
            meta = f.metadata()
    else:
        obj = torch.load(out, weights_only=True)
        sd, meta = obj["model"], {k: v for k, v in obj.items() if k != "model"}
    built.load_state_dict(sd, strict=True)
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in built.state_dict().items())
    assert meta["winpos_image_size"] == "256" and json.loads(meta["winpos_kwargs"]) == {
        "img_size": 256, "window_spec": list(RUN_WINDOWS)}
    # plot finds the training size in the converted file itself (no config.yaml beside it: it assumed 1024 px)
    info = effective_embeddings(out)[0]
    assert tuple(info.image_hw) == (256, 256) and "winpos_image_size" in info.native_from, info.native_from
    if suffix == ".safetensors":
        assert native_size_from_config(out)[0] == 256


def test_convert_without_the_run_uses_the_preset_and_flags_win(tmp_path, capsys):
    """A file with no config.yaml beside it converts as before (the preset's own windows); a run for another preset
    is named and not used; a flag beats the run's setting."""
    from winpos.cli.convert_checkpoint import main

    run, _ = _run_folder(tmp_path)
    assert main(["--input", str(run / "model_final.pth"), "--output", str(tmp_path / "a.safetensors"), "--to",
                 "hieradet_toy", "--img-size", "512"]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert "img_size=512" in line and "window_spec=(8, 4, 8, 4)" in line, line
    lone = tmp_path / "lone"
    lone.mkdir()
    torch.save({"model": create("hieradet_toy").state_dict()}, lone / "w.pth")
    assert main(["--input", str(lone / "w.pth"), "--output", str(tmp_path / "b.safetensors"), "--to",
                 "hieradet_toy"]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert line == "load it with: create('hieradet_toy', recipe='original').load_state_dict(sd, strict=False)", line
