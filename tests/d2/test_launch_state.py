"""Several processes (``--num-gpus 2`` on the CPU: gloo), issue 38: a resume equals the uninterrupted run bit for bit
because every rank's RNG state is in the checkpoint, and a refusal or failure is one ``error:`` line with the exit
status of one process (2 bad input, 1 failed while working), not a traceback per process.

The oracle for the resume is the uninterrupted 2-process run itself (the run is deterministic: the audit found two
uninterrupted runs bit-identical). About 40 s on 2 busy CPU cores (three 2-process launches of the 64 px toy run, 2
iterations at one image per process).
"""
import shutil
import subprocess
import sys

import pytest
import torch

from tests.bad_inputs_helpers import ROOT, _env, assert_one_line_error
from winpos.errors import EXIT_FAILED, EXIT_USAGE

TRAIN = [sys.executable, str(ROOT / "tools" / "train_net.py"), "--config-file",
         str(ROOT / "configs" / "shapes" / "reproduce_hieradet.py")]
OPTS = ["train.device=cpu", "train.max_iter=2", "train.checkpointer.period=1", "train.log_period=1",
        "train.eval_after_train=false", "dataloader.train.total_batch_size=2"]


def _train(out, *flags):
    res = subprocess.run(TRAIN + ["--num-gpus", "2", *flags, f"train.output_dir={out}", *OPTS], env=_env(),
                         capture_output=True, text=True, timeout=300)
    return res


@pytest.mark.slow  # 70 s
def test_a_two_process_resume_equals_the_uninterrupted_run(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    res = _train(a)
    assert res.returncode == 0, res.stderr[-3000:]
    shutil.copytree(a, b)
    # as if killed during iteration 1: the last checkpoint is iteration 0 (each is written whole, atomically)
    for name in ("model_0000001.pth", "model_final.pth"):
        (b / name).unlink()
    (b / "last_checkpoint").write_text("model_0000000.pth")
    res = _train(b, "--resume")
    assert res.returncode == 0, res.stderr[-3000:]
    wa = torch.load(a / "model_final.pth", weights_only=True)["model"]
    wb = torch.load(b / "model_final.pth", weights_only=True)["model"]
    assert [k for k in wa if not torch.equal(wa[k], wb[k])] == []
    saved = torch.load(b / "model_0000000.pth", weights_only=True)["rng"]  # what makes it exact: both ranks' streams
    assert len(saved["ranks"]) == 2 and not torch.equal(saved["ranks"][0]["torch"], saved["ranks"][1]["torch"])


@pytest.mark.slow  # 33 s
def test_a_refusal_under_two_processes_is_one_error_line(tmp_path):
    (tmp_path / "config.yaml").write_text("earlier: run\n")  # the folder holds another run
    res = _train(tmp_path)
    assert_one_line_error(res, "holds another run", "--resume", "--force", code=EXIT_USAGE)
    assert res.stderr.count("error:") == 1 and "ProcessRaisedException" not in res.stderr


def _note(folder, rank, status, line, bug=False, traceback=""):
    import json

    (folder / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "status": status, "line": line, "bug": bug,
                                                         "traceback": traceback}))


def test_launched_failure_prefers_the_cause_over_the_errors_it_caused(tmp_path, capsys):
    from winpos.errors import ProcessFailed
    from winpos.d2.launch import launched_failure

    _note(tmp_path, 0, EXIT_FAILED, "RuntimeError: Connection closed by peer", bug=True, traceback="Traceback ...\n")
    _note(tmp_path, 1, EXIT_FAILED, "could not write /x/model_0000000.pth (File too large); nothing was written")
    failure = launched_failure(RuntimeError("process 1 terminated"), tmp_path)
    assert isinstance(failure, ProcessFailed) and failure.status == EXIT_FAILED
    assert str(failure).startswith("could not write /x/model_0000000.pth")
    assert capsys.readouterr().err == ""  # no traceback for a failure that is not a bug


def test_launched_failure_names_a_killed_process_and_a_bug_keeps_one_traceback(tmp_path, capsys):
    from torch.multiprocessing import ProcessExitedException

    from winpos.d2.launch import launched_failure

    killed = ProcessExitedException("process 1 terminated with signal SIGKILL", error_index=1, error_pid=7,
                                    exit_code=-9, signal_name="SIGKILL")
    failure = launched_failure(killed, tmp_path)
    assert failure.status == EXIT_FAILED
    assert "rank 1 was killed by SIGKILL" in str(failure) and "--resume" in str(failure)
    _note(tmp_path, 1, EXIT_FAILED, "KeyError: 'bbox'", bug=True, traceback="Traceback (most recent call last):\n")
    failure = launched_failure(killed, tmp_path)
    assert str(failure) == "rank 1: KeyError: 'bbox'" and capsys.readouterr().err.count("Traceback") == 1


def test_run_reporting_turns_an_error_into_a_note_and_a_status(tmp_path, monkeypatch):
    import json

    from winpos.errors import WinposError
    from winpos.d2.launch import NOTES_ENV, run_reporting

    def refuse():
        raise WinposError("train.seed=-1 is negative; set a seed >= 0")

    monkeypatch.setenv(NOTES_ENV, str(tmp_path))
    with pytest.raises(SystemExit) as stop:
        run_reporting(refuse)
    assert stop.value.code == EXIT_USAGE
    note = json.loads((tmp_path / "rank0.json").read_text())
    assert note["line"] == "train.seed=-1 is negative; set a seed >= 0" and not note["bug"]


def test_a_checkpoint_from_before_the_per_rank_states_still_resumes():
    from winpos.d2.checkpoint import RNGState

    torch.manual_seed(5)
    flat = RNGState().state_dict()["ranks"][0]  # the earlier layout: one process's states at the top level
    expected = torch.rand(3)
    torch.manual_seed(6)
    RNGState().load_state_dict(flat)
    assert torch.equal(torch.rand(3), expected)


def _write_to_a_full_disk(args):
    """A launched process's main: a write that fails with a real ``OSError(ENOSPC)`` (``/dev/full``)."""
    with open("/dev/full", "wb", buffering=0) as f:  # output-policy: a device that is always full, the fault
        f.write(b"x" * 4096)


def test_a_disk_error_in_a_launched_process_is_one_line():
    """A full disk in a process under ``launch`` (--num-gpus 2) ends in the one line of ``error_line`` (it ended
    in ``NameError: name 'errno' is not defined`` while the module lacked its import)."""
    import argparse
    import errno
    import os

    from winpos.d2.launch import launch_main
    from winpos.errors import ProcessFailed

    if not os.path.exists("/dev/full"):
        pytest.fail("this test needs /dev/full (Linux) for a real ENOSPC")
    with pytest.raises(OSError) as real:
        _write_to_a_full_disk(None)
    assert real.value.errno == errno.ENOSPC  # the real error, raised here and in each launched process
    args = argparse.Namespace(num_gpus=2, num_machines=1, machine_rank=0, dist_url="auto")
    with pytest.raises(ProcessFailed) as failed:
        launch_main(args, _write_to_a_full_disk)
    line = str(failed.value)
    assert failed.value.status == EXIT_FAILED and "\n" not in line
    assert "No space left on device" in line and "free disk space" in line and "NameError" not in line
