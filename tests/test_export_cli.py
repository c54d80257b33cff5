"""``winpos-export``: the files it writes, the checks it prints, and its bad input (one line, nothing written)."""
import json
import sys

import pytest

from tests.conftest import require
from winpos.cli.export import main


def _files(folder):
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) if folder.exists() else []


def test_backbone_export_writes_each_format_at_each_size_and_prints_the_checks(tmp_path, capsys):
    require("onnxruntime")
    out = tmp_path / "out"
    assert main(["backbone", "vitdet_toy", "--recipe", "rope", "--sizes", "64,64x96", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "reference path (PyTorch SDPA) forced" in printed and "tolerance: max |error| <= 0.0001" in printed
    stem = "vitdet_toy_rope"
    assert _files(out) == sorted([f"{stem}_{s}.{e}" for s in ("64x64", "64x96") for e in ("onnx", "pt2", "ts")]
                                 + [f"{stem}_export.json"])
    record = json.loads((out / f"{stem}_export.json").read_text())
    assert len(record["checks"]) == 6 and all(c["max_error"] <= record["tolerance"] for c in record["checks"])
    assert {c["format"] for c in record["checks"]} == {"onnx", "pt2", "torchscript"}
    # an earlier export is not replaced without --force, and the refusal comes before any work
    assert main(["backbone", "vitdet_toy", "--recipe", "rope", "--sizes", "64", "--out", str(out)]) == 2
    assert "already holds" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--sizes", "70"], "not a multiple of the patch stride 16"),
    (["--recipe", "abs"], "unknown export recipe='abs'"),
    (["--opset", "16"], "--opset 16 is below 17"),
    (["--set", "pos_antialias=True", "--formats", "onnx"], "cannot be exported to ONNX"),
    (["--formats", "onnx", "--tolerance", "1e-12"], "above the tolerance 1e-12; nothing was written"),
])
def test_bad_input_is_one_line_and_nothing_is_written(tmp_path, capsys, argv, message):
    require("onnxruntime")
    out = tmp_path / "out"
    status = main(["backbone", "vitdet_toy", "--recipe", "paper", "--out", str(out), *argv])
    err = capsys.readouterr().err.strip()
    assert status == (1 if "tolerance" in message else 2)
    assert message in err and len(err.splitlines()) == 1, err
    assert _files(out) == []


def test_onnxruntime_missing_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails as if not installed
    out = tmp_path / "out"
    assert main(["backbone", "vitdet_toy", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "pip install 'winpos[export]'" in err and "leave onnx out of --formats" in err
    assert len(err.splitlines()) == 1 and not out.exists()


def test_a_detector_goes_to_one_dynamic_pt2_program_up_to_its_square_padding(tmp_path, capsys):
    """The shapes detectors pad every image to a 256 px square, so one program takes every checked size."""
    import json

    out = tmp_path / "out"
    assert main(["detector", "--config-file", "shapes/mask_rcnn_vitdet_toy_rope.py", "--random-weights",
                 "--formats", "pt2", "--sizes", "64x96,128x64", "--out", str(out)]) == 0
    assert "one program with dynamic height and width (multiples of 32 up to 256)" in capsys.readouterr().out
    record = json.loads((out / "mask_rcnn_vitdet_toy_rope_export.json").read_text())
    assert record["files"] == {"mask_rcnn_vitdet_toy_rope.pt2": {"format": "pt2", "size": "dynamic"}}
    assert [c["size"] for c in record["checks"]] == [[64, 96], [128, 64]]
    assert all(c["max_error"] <= record["tolerance"] for c in record["checks"])


def test_a_detector_size_beyond_its_square_padding_is_one_line_before_any_work(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["detector", "--config-file", "shapes/mask_rcnn_vitdet_toy_rope.py", "--random-weights",
                 "--formats", "pt2", "--sizes", "288x64", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "larger than the detector's square padding 256x256" in err and len(err.splitlines()) == 1
    assert not out.exists()
