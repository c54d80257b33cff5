"""``winpos-export detector``: a shapes Mask R-CNN by config name to ONNX and TorchScript (through detectron2's
TracingAdapter) and ``.pt2`` (its exportable form), each run (onnxruntime, torch.jit.load, torch.export.load) and
compared with the eager detector's flattened outputs."""
import json

from tests.conftest import require
from winpos.cli.export import main
from winpos.d2.export import DETECTOR_TOLERANCE


def test_detector_by_config_name_exports_and_matches_eager(tmp_path, capsys):
    require("onnxruntime")
    require("detectron2")
    out = tmp_path / "out"
    assert main(["detector", "--config-file", "shapes/mask_rcnn_hieradet_toy_paper.py", "--random-weights",
                 "--sizes", "64x96", "--out", str(out)]) == 0
    assert "reference path" in capsys.readouterr().out
    stem = "mask_rcnn_hieradet_toy_paper"
    record = json.loads((out / f"{stem}_export.json").read_text())
    assert sorted(record["files"]) == [f"{stem}_64x96.onnx", f"{stem}_64x96.pt2", f"{stem}_64x96.ts"]
    assert record["tolerance"] == DETECTOR_TOLERANCE
    assert all(c["max_error"] <= DETECTOR_TOLERANCE for c in record["checks"]) and len(record["checks"]) == 3


def test_random_weights_leave_the_configs_init_checkpoint_unread_and_an_explicit_checkpoint_conflicts(tmp_path):
    """A COCO config names its pretrained trunk in train.init_checkpoint; --random-weights exports the untrained
    detector without reading it, and only an explicit --checkpoint beside --random-weights is refused."""
    import pytest

    from winpos.d2.export import build_detector
    from winpos.errors import WinposError

    require("detectron2")
    overrides = ["train.init_checkpoint=/nonexistent/pretrained_trunk.pth"]
    cfg, model = build_detector("shapes/mask_rcnn_vitdet_toy_rope.py", None, overrides, random_weights=True)
    assert cfg.train.init_checkpoint == "/nonexistent/pretrained_trunk.pth" and not model.training
    with pytest.raises(WinposError, match="--random-weights and --checkpoint"):
        build_detector("shapes/mask_rcnn_vitdet_toy_rope.py", str(tmp_path / "w.pth"), [], random_weights=True)
    with pytest.raises(FileNotFoundError):  # without --random-weights the config's init is what loads
        build_detector("shapes/mask_rcnn_vitdet_toy_rope.py", None, overrides)


def test_eval_only_random_weights_clears_the_configs_init_and_refuses_an_explicit_one():
    """winpos-train --eval-only --random-weights on a config that names a pretrained trunk: the trunk is not
    loaded (the config then says so); the same path given as an override beside --random-weights is refused."""
    import pytest

    from winpos.d2.config import load_config
    from winpos.d2.engine import check_weights
    from winpos.errors import WinposError

    require("detectron2")
    cfg = load_config("shapes/mask_rcnn_vitdet_toy_rope.py", [])
    cfg.train.init_checkpoint = "pretrained_trunk.pth"  # as a COCO config ships it
    check_weights(cfg, eval_only=True, random_weights=True, overrides=[])
    assert cfg.train.init_checkpoint == ""
    cfg.train.init_checkpoint = "mine.pth"
    with pytest.raises(WinposError, match="were both given"):
        check_weights(cfg, eval_only=True, random_weights=True, overrides=["train.init_checkpoint=mine.pth"])
