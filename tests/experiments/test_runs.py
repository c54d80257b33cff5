"""Runs of the reproduction (winpos.experiments.runs / child, tools/reproduce.py, tools/run_demo.py): every run is
identified by what made it and reused only when all of it matches; a failed run is a failure (exit 1) naming its
log; bad lists are refused before any work."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from winpos.errors import WinposError
from winpos.experiments import runs as R

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "shapes" / "reproduce_hieradet.py")
SMALL = dict(image_size=64, train_images=8, val_images=4, min_objects=1, max_objects=3)


def spec(tmp_path, **kw):
    base = dict(name="t", kind="detect", config=CONFIG, encoding="abs_planted", size=64, shapes=dict(SMALL), iters=2,
                seed=0, out=str(tmp_path / "run"), lr=1e-3, init="", threads=1, warmup=1)
    return {**base, **kw}


def test_identity_claims_a_folder_and_refuses_another_run(tmp_path):
    s = spec(tmp_path)
    ident = R.claim(s)
    assert ident["iters"] == 2 and len(ident["config_sha256"]) == 64 and ident["init_sha256"] is None
    assert "out" not in ident and "name" not in ident
    assert R.claim(dict(s, name="renamed")) == ident  # the name is not what made it
    with pytest.raises(WinposError, match=r"holds a run made with other settings \(iters 400 here, 2 there\)"):
        R.claim(dict(s, iters=400))
    with pytest.raises(WinposError, match="lr 0.5 here, 0.001 there"):
        R.finished(dict(s, lr=0.5))
    init = tmp_path / "init.pth"
    init.write_bytes(b"weights A")
    a = dict(s, init=str(init), out=str(tmp_path / "other"))
    R.claim(a)
    init.write_bytes(b"weights B")  # the same path, other weights: another run
    with pytest.raises(WinposError, match="init_sha256"):
        R.claim(a)
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "result.json").write_text("{}")
    with pytest.raises(WinposError, match="holds a result with no identity.json"):
        R.finished(dict(s, out=str(stray)))


def test_pool_refuses_a_run_listed_twice_before_any_work(tmp_path):
    s = spec(tmp_path)
    with pytest.raises(WinposError, match=r"lists a run twice: \['t'\]"):
        R.run_pool([s, dict(s)], 1, print)
    assert not Path(s["out"]).exists()


def test_one_run_in_its_own_process_reused_only_with_its_identity(tmp_path):
    s = spec(tmp_path)
    logs = []
    out = R.launch(s, logs.append)
    assert set(out["bbox"]) >= {"AP", "AP50"} and out["threads"] == 1 and out["spec"]["iters"] == 2
    assert logs[0] == "start t" and any("t: iteration 2/2" in m for m in logs) and logs[-1].startswith("done  t")
    assert json.loads((Path(s["out"]) / "result.json").read_text()) == out
    assert R.launch(s, logs.append) == out and logs[-1] == "reuse t (finished before, same identity)"
    with pytest.raises(WinposError, match="iters 3 here, 2 there"):  # never reported under other settings
        R.launch(dict(s, iters=3), logs.append)
    # the detector with its embedding zeroed (the study's diagnosis): AP, and what was zeroed, kept in the result
    from winpos.experiments.checkpoints import window_structure

    final = str(Path(s["out"]) / "model_final.pth")
    zeroed = R.launch(dict(s, name="z", iters=0, zero_embedding=True, init=final, out=str(tmp_path / "z")), logs.append)
    assert set(zeroed["bbox"]) >= {"AP", "AP50"} and zeroed["window_structure"] == window_structure(final)
    assert zeroed["window_structure"]["ws"] > 0.5  # the planted start's window pattern


def test_a_failed_run_names_its_log_and_the_tool_exits_1(tmp_path):
    bad = spec(tmp_path, encoding="abs_learned", init=str(tmp_path / "missing_backbone.pth"))
    with pytest.raises(R.RunFailed, match=r"run t failed \(exit 1\): .*; its log: .*run/log.txt"):
        R.launch(bad, lambda m: None)
    assert isinstance(R.RunFailed("x"), OSError)  # run_cli: OSError while working -> exit 1


def _tool(tool, args, tmp_path):
    return subprocess.run([sys.executable, str(ROOT / "tools" / tool), "--output", str(tmp_path / "o"), *args],
                          capture_output=True, text=True)


@pytest.mark.parametrize("args,message", [
    (["--rows", "naive,nope"], "unknown row(s) ['nope']"),
    (["--rows", ","], "has an empty name"),
    (["--seeds", "0,0"], "seeds lists ['0'] more than once"),
    (["--multipliers", "2,1.1"], "do not tile"),
    (["--conditions", "canvas,canvas"], "conditions lists ['canvas'] more than once"),
    (["--finetune-iters", "0"], "--finetune-iters"),
    (["--export-stage1", "abs"], "must be ENCODING:PATH"),
    (["--pretrain-lr", "0"], "pretrain_lr=0.0 must be a learning rate"),
])
def test_reproduce_cli_bad_input_is_one_line_and_writes_nothing(args, message, tmp_path):
    proc = _tool("reproduce.py", args, tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert message in proc.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args,message", [
    (["--lr", "0"], "finetune_lr=0.0 must be a learning rate"),
    (["--iters", "0"], "--iters"),
    (["--seeds", "1,1"], "seeds lists ['1'] more than once"),
    (["--multiplier", "1.1"], "do not tile"),
])
def test_demo_bad_arguments_are_one_line_and_write_nothing(args, message, tmp_path):
    proc = _tool("run_demo.py", args, tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert message in proc.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("what", ["missing", "corrupt"])
def test_demo_refuses_a_missing_or_corrupt_shipped_checkpoint(what, tmp_path):
    ckpt, manifest = tmp_path / "s.pth", tmp_path / "s.json"
    if what == "corrupt":
        ckpt.write_bytes(b"not the shipped weights")
        manifest.write_text(json.dumps({"sha256": "0" * 64}))
    proc = _tool("run_demo.py", ["--checkpoint", str(ckpt), "--manifest", str(manifest)], tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error: stage-1 checkpoint") and ("is missing" if what == "missing" else "corrupt") in line
    assert not (tmp_path / "o").exists()


def test_run_demo_force_removes_only_a_demo_folder(tmp_path):
    """--force starts the demo over, but only in a folder the demo or the reproduction made (protocol.json): any
    other folder is refused before anything is removed."""
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "run_demo.py"), "--output", str(other), "--force"],
                          capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert "--force removes only a folder made by the demo" in proc.stderr
    assert (other / "notes.txt").read_text() == "keep me"
