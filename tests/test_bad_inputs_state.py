"""Bad inputs, part 3: state and values. A training folder that holds (or is running) another run, writers that
replaced an existing output, and the output policy of every tool. Images read with their real range
(tests/test_bad_inputs_images.py) and values checked in the dtype they are used in (tests/test_bad_inputs_values.py)
are the other halves of the second audit; docs/bad_inputs.md lists every input and what it gets.
"""
import json
import subprocess
import sys
import time

import pytest

from tests.bad_inputs_helpers import CONFIG, ROOT, _env, _save_vit, assert_one_line_error, tool

# ------------------------------------------------------------------------------------ training output folders


def _earlier_run(folder):
    """A finished run's files, each with content that identifies it."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {"model_final.pth": b"earlier final", "model_0000003.pth": b"earlier iter 3",
             "last_checkpoint": b"model_final.pth", "config.yaml": b"earlier: config\n",
             "metrics.json": b'{"iteration": 0}\n{"iteration": 1}\n'}
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return files


def _bytes(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if not p.name.startswith(".")}


def test_train_net_refuses_a_folder_holding_another_run(tmp_path):
    files = _earlier_run(tmp_path / "run")
    res = tool("train_net.py", "--config-file", CONFIG, f"train.output_dir={tmp_path / 'run'}", "train.device=cpu")
    assert_one_line_error(res, "holds another run", "--resume", "--force")
    assert _bytes(tmp_path / "run") == files  # nothing replaced, nothing appended, no log.txt


def test_claim_run_dir_resume_keeps_and_force_replaces_the_earlier_run(tmp_path):
    from winpos.d2.run_dir import claim_run_dir, release_run_dir
    from winpos.errors import WinposError

    files = _earlier_run(tmp_path / "a")
    with pytest.raises(WinposError, match="holds another run"):
        claim_run_dir(tmp_path / "a")
    claim_run_dir(tmp_path / "a", resume=True)
    release_run_dir(tmp_path / "a")
    assert _bytes(tmp_path / "a") == files
    (tmp_path / "a" / "log.txt").write_text("earlier log\n")
    (tmp_path / "a" / "notes.md").write_text("mine\n")
    claim_run_dir(tmp_path / "a", force=True)
    release_run_dir(tmp_path / "a")
    assert _bytes(tmp_path / "a") == {"notes.md": b"mine\n"}  # the run's files only
    (tmp_path / "f").write_text("x")
    with pytest.raises(WinposError, match="is a file"):
        claim_run_dir(tmp_path / "f")


def test_a_second_training_run_into_a_folder_in_use_is_refused_naming_the_first(tmp_path):
    out = tmp_path / "busy"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from winpos.d2.run_dir import claim_run_dir; "
         f"claim_run_dir({str(out)!r}); print('held', flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE, text=True, env=_env())
    try:
        assert holder.stdout.readline().strip() == "held"
        from winpos.d2.run_dir import claim_run_dir
        from winpos.errors import WinposError

        with pytest.raises(WinposError, match=f"in use by another training run \\(pid {holder.pid} "):
            claim_run_dir(out, resume=True)
    finally:
        holder.kill()
        holder.wait()
    claim_run_dir(out)  # the lock died with its process: no stale lock


def test_train_net_while_another_train_net_runs_is_refused(tmp_path):
    """Two real train_net.py into one folder: the second is refused in one line, naming the first, while the first
    runs (it holds the folder's lock from its setup on)."""
    out = tmp_path / "run"
    args = ["--config-file", CONFIG, f"train.output_dir={out}", "train.device=cpu", "train.max_iter=400",
            "train.eval_after_train=False", "train.checkpointer.period=1000"]
    first = subprocess.Popen([sys.executable, str(ROOT / "tools" / "train_net.py"), *map(str, args)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        deadline, lock = time.time() + 240, out / ".winpos-run.lock"
        while not lock.is_file() or f"pid {first.pid} " not in lock.read_text():  # taken at setup, before log.txt
            assert first.poll() is None and time.time() < deadline, first.stderr.read()[-2000:]
            time.sleep(0.5)
        second = tool("train_net.py", "--config-file", CONFIG, f"train.output_dir={out}", "train.device=cpu",
                      "train.max_iter=2")
        assert_one_line_error(second, "in use by another training run", f"pid {first.pid}")
    finally:
        first.kill()
        first.wait()


def test_negative_seed_is_refused(tmp_path):
    import argparse

    from winpos.d2.engine import setup
    from winpos.errors import WinposError

    args = argparse.Namespace(config_file=str(CONFIG), opts=[f"train.output_dir={tmp_path}", "train.device=cpu",
                                                             "train.seed=-1"],
                              eval_only=False, resume=False, force=False, dataset=[], random_weights=False)
    with pytest.raises(WinposError, match="train.seed=-1 is negative"):
        setup(args)
    assert not any(tmp_path.iterdir())  # refused before the log or the lock


# ------------------------------------------------------------------------------------------ tool writers


def test_posemb_viz_refuses_an_earlier_report_and_force_leaves_only_the_new_figures(tmp_path):
    from winpos.diagnostics.plots import prepare_report_dir
    from winpos.diagnostics.report import run_posemb_viz

    a, b = tmp_path / "a.pth", tmp_path / "b.pth"
    _save_vit(a, recipe="paper")
    _save_vit(b, recipe="paper")
    out = tmp_path / "viz"
    run_posemb_viz([a], prepare_report_dir(out, [a]), [128], progress=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    res = tool("posemb_viz.py", "plot", b, "--sizes", "128", "--out", out)
    assert_one_line_error(res, "--out", "report.json", "--force")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    report = run_posemb_viz([b], prepare_report_dir(out, [b], force=True), [128], progress=False)
    listed = {p.split("/")[-1] for c in report["checkpoints"] for e in c["embeddings"] for p in e["plots"]}
    assert listed and {p.name for p in out.iterdir()} == listed | {"report.json"}  # a's figures are gone
    assert json.loads((out / "report.json").read_text())["checkpoints"][0]["path"] == str(b)


def test_benchmark_kernels_json_follows_the_output_policy(tmp_path):
    existing = tmp_path / "kern.json"
    existing.write_text('{"earlier": "results"}')
    res = tool("benchmark.py", "kernels", "--json", existing, "--budget", "20")
    assert_one_line_error(res, "--json", "already exists", "--force")
    assert existing.read_text() == '{"earlier": "results"}'  # before: replaced by dry-run CPU timings, exit 0


@pytest.mark.parametrize("flag,value,needle", [("--reps", "0", "--reps"), ("--batch", "0", "--batch"),
                                                ("--budget", "-1", "positive number of seconds")])
def test_benchmark_kernels_refuses_non_positive_reps_batch_budget(flag, value, needle, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("benchmark_tool", ROOT / "tools" / "benchmark.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    with pytest.raises(SystemExit) as exit_:  # before: accepted, every row skipped, exit 0
        bench.main(["kernels", flag, value])
    assert exit_.value.code == 2 and needle in capsys.readouterr().err
    assert bench._kernels_args(["--reps", "3", "--force", "--dry-run"]) == ["--reps", "3", "--dry-run"]
