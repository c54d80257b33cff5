"""Evaluation outputs under the output policy (issue 38): detectron2's result files reach the folder whole or not at
all (a write past the file-size limit leaves the previous evaluation byte for byte, in one line), a folder being
written is locked, and ``--force`` replaces exactly what the earlier evaluation wrote (its manifest).

The oracle is the earlier evaluation's own bytes. The model is the untrained 64 px reproduction detector with a
score threshold of 0, so every image yields 100 detections (files of ~50-90 KB); the test set is 4 images.
"""
import resource
import subprocess
import sys

import pytest
import torch

import winpos.d2  # noqa: F401 - registrations
from tests.bad_inputs_helpers import ROOT, _env, assert_one_line_error, tool

CONFIG = ROOT / "configs" / "shapes" / "reproduce_hieradet.py"
EVAL_FILES = ("instances_predictions.pth", "coco_instances_results.json", "results.json")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(arguments of eval_coco.py before --output, the folder for outputs)."""
    from winpos.d2.config import load_config
    from winpos.d2.engine import build_model
    from winpos.data.shapes import generate_shapes, one_class_json

    root = tmp_path_factory.mktemp("mini")
    ann = one_class_json(generate_shapes(root, "val", 4, image_size=64, seed=3, max_objects=3))
    torch.manual_seed(0)
    model = build_model(load_config(CONFIG, ["train.device=cpu"]))
    weights = root / "model.pth"
    torch.save({"model": model.state_dict()}, weights)
    args = ["--config-file", CONFIG, "--checkpoint", weights, "--dataset", f"mini={ann}:{root / 'val'}",
            "--test-dataset", "mini", "--no-progress"]
    return args, ["train.device=cpu", "model.roi_heads.box_predictor.test_score_thresh=0.0"]


def _files(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.name.startswith(".")}


def _limit_file_size(limit):
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def test_a_failed_evaluation_write_leaves_the_previous_files_and_says_so(setup, tmp_path):
    args, opts = setup
    out = tmp_path / "ev"
    res = tool("eval_coco.py", *args, "--output", out, *opts)
    assert res.returncode == 0, res.stderr[-2000:]
    before = _files(out)
    assert set(EVAL_FILES) <= set(before) and len(before["instances_predictions.pth"]) > 20_000
    res = tool("eval_coco.py", *args, "--output", out, "--force", *opts, preexec_fn=_limit_file_size(20_000))
    assert_one_line_error(res, f"could not write the evaluation files into {out}", "the previous files there are "
                          "unchanged", "ulimit -f", code=1)
    assert _files(out) == before  # byte for byte
    assert not [p for p in out.iterdir() if p.name.startswith(".staging")]
    res = tool("eval_coco.py", *args, "--output", out, "--force", *opts)  # space freed: the rerun completes
    assert res.returncode == 0, res.stderr[-2000:]
    assert set(_files(out)) == set(before)


def test_a_second_evaluation_into_a_folder_being_written_is_refused(setup, tmp_path):
    args, opts = setup
    out = tmp_path / "busy"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import time; from winpos.utils.output_folders import claim_output_dir; "
         f"claim_output_dir({str(out)!r}); print('held', flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE, text=True, env=_env())
    try:
        assert holder.stdout.readline().strip() == "held"
        res = tool("eval_coco.py", *args, "--output", out, *opts)
    finally:
        holder.kill()
        holder.wait()
    assert_one_line_error(res, f"--output {out} is in use by another process (pid {holder.pid} ")
    assert _files(out) == {}


def test_force_replaces_exactly_what_the_earlier_evaluation_wrote(tmp_path):
    from winpos.errors import WinposError
    from winpos.utils.output_folders import claim_output_dir, release_output_dir
    from winpos.utils.outputs import MANIFEST_NAME, atomic_write_text

    out = tmp_path / "sweep"
    claim = claim_output_dir(out, planned=["resolution_sweep.json"])
    for name in ("resolution_sweep.json", "size_64/coco_instances_results.json", "size_96/coco_instances_results.json"):
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / name, "earlier\n")
    claim.finish()
    release_output_dir(out)
    (out / "notes.md").write_text("mine\n")
    with pytest.raises(WinposError, match="already holds the outputs of an earlier run \\(3 files"):
        claim_output_dir(out)
    claim = claim_output_dir(out, planned=["resolution_sweep.json"], force=True)
    atomic_write_text(out / "resolution_sweep.json", "new\n")
    atomic_write_text(out / "size_64" / "coco_instances_results.json", "new\n")
    assert (out / "size_96").is_dir()  # the earlier files stay until the new outputs are complete
    assert claim.finish() == ["size_96/coco_instances_results.json"]
    release_output_dir(out)
    assert _files(out) == {"notes.md": b"mine\n", "resolution_sweep.json": b"new\n",
                           "size_64/coco_instances_results.json": b"new\n"}
    assert (out / MANIFEST_NAME).is_file() and not (out / "size_96").exists()
