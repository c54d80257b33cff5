"""SLURM through submitit and the launchers' environments (``winpos.d2.launch``, ``winpos-train --slurm``).

The end-to-end test submits a 6-iteration shapes run (checkpoint every 2) through submitit's local executor, sends
the job's task the preemption signal SLURM sends (USR2) after a checkpoint is on disk and before the run ends, and
lets submitit do what it does on a cluster: call ``TrainJob.checkpoint``, requeue, rerun the returned command (the
same with ``--resume``). The oracle is the same run trained without interruption by plain ``winpos-train`` (the
local launch path): every tensor of both ``model_final.pth`` must be equal. The placement test starts two processes
with SLURM's variables and checks the process group they form. About 90 s on 2 cores at load 7 (mostly imports).
"""
import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import require
from winpos.errors import WinposError

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "shapes" / "reproduce_hieradet.py")
OPTS = ["train.device=cpu", "train.max_iter=6", "train.checkpointer.period=2", "train.log_period=1",
        "train.eval_after_train=false", "dataloader.train.total_batch_size=2", "dataloader.train.num_workers=0"]


def _args(out, *flags):
    from winpos.cli.train_net import SLURM_FLAGS, build_parser

    args = build_parser().parse_args([*flags, "--config-file", CONFIG, f"train.output_dir={out}", *OPTS])
    return argparse.Namespace(**{k: v for k, v in vars(args).items() if k != "slurm" and k not in SLURM_FLAGS})


def _tasks(folder: Path) -> list[int]:
    """The pids of the job's tasks: the processes running submitit's ``_submit`` on ``folder``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"submitit.core._submit" in argv and str(folder).encode() in argv:
            found.append(int(cmdline.parent.name))
    return found


def _last_checkpoint(out: Path) -> str:
    try:
        return (out / "last_checkpoint").read_text().strip()
    except OSError:
        return ""


def _logged_iterations(out: Path) -> int:
    try:
        return sum('"iteration"' in line for line in (out / "metrics.json").read_text().splitlines())
    except OSError:
        return 0


def test_a_preempted_job_is_requeued_and_ends_bit_identical_to_an_uninterrupted_run(tmp_path):
    """``winpos-train --slurm --slurm-local``, preempted (USR2) after iteration 2, against plain ``winpos-train``."""
    require("submitit")
    ref, out, folder = tmp_path / "uninterrupted", tmp_path / "preempted", tmp_path / "submitit"
    command = [sys.executable, str(ROOT / "tools" / "train_net.py"), "--slurm", "--slurm-local", "--slurm-time", "60",
               "--slurm-folder", str(folder), "--config-file", CONFIG, f"train.output_dir={out}", *OPTS]
    cli = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.time() + 240
        while _logged_iterations(out) < 3 and time.time() < deadline and cli.poll() is None:
            time.sleep(0.02)  # iteration 2 done: past the checkpoint of iteration 1, three iterations before the end
        signalled = _last_checkpoint(out)
        assert signalled.startswith("model_00000") and not (out / "model_final.pth").exists(), \
            f"the job ended or stalled before it could be preempted mid-run (last checkpoint {signalled!r})"
        tasks = _tasks(folder)
        assert len(tasks) == 1, tasks
        os.kill(tasks[0], signal.SIGUSR2)  # what SLURM sends on preemption or ahead of the time limit
        stdout, stderr = cli.communicate(timeout=300)
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode == 0 and "finished" in stdout, (stdout, stderr[-3000:])
    job_id = stdout.split("submitted job ", 1)[1].split(":", 1)[0]
    # the oracle: the same command without --slurm, in a process of its own with the job's thread count (in this
    # process an earlier test may have changed torch's threads, and 1 vs 2 threads sum in another order)
    plain = subprocess.run([sys.executable, str(ROOT / "tools" / "train_net.py"), "--config-file", CONFIG,
                            f"train.output_dir={ref}", *OPTS], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert plain.returncode == 0, plain.stderr[-3000:]
    log = "".join((folder / f"{job_id}_0_log.{s}").read_text() for s in ("out", "err"))
    assert "this job is preempted" in log and "Requeued job" in log, log[-3000:]
    run_log = (out / "log.txt").read_text()
    assert run_log.count("Command line arguments") == 2 and "resume=True" in run_log.split("Command line arguments")[2]
    starts = [int(line.rsplit(" ", 1)[1]) for line in run_log.splitlines() if "Starting training from iteration" in line]
    assert starts[0] == 0 and 2 <= starts[1] <= 4, starts  # resumed from the checkpoint of iteration 1 or 3
    print(f"preempted with {signalled} on disk; the requeued job started at iteration {starts[1]}")
    wa = torch.load(ref / "model_final.pth", weights_only=True)
    wb = torch.load(out / "model_final.pth", weights_only=True)
    assert wa["iteration"] == wb["iteration"] == 5
    assert len(wa["model"]) > 100 and [k for k in wa["model"] if not torch.equal(wa["model"][k], wb["model"][k])] == []


def test_the_requeued_command_resumes_and_never_forces():
    from winpos.d2.slurm import TrainJob

    submitit = require("submitit")
    args = argparse.Namespace(resume=False, force=True, eval_only=False, opts=["a=1"])
    delayed = TrainJob(args).checkpoint()
    assert isinstance(delayed, submitit.helpers.DelayedSubmission)
    again = delayed.function.args
    assert again.resume and not again.force and again.opts == ["a=1"] and not args.resume  # the original unchanged
    assert TrainJob(argparse.Namespace(resume=False, force=False, eval_only=True)).resumed().args.resume is False


def test_placement_from_slurm_and_torchrun_variables():
    from winpos.d2.launch import Placement, first_host, placement_from_env

    slurm = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
             "SLURM_NNODES": "2", "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_JOB_NODELIST": "gpu[017-018]",
             "SLURM_JOB_ID": "123456"}
    assert placement_from_env(slurm) == Placement(5, 8, 1, 4, 1, 2, "gpu017", 20000 + 123456 % 20000, "slurm")
    assert placement_from_env({**slurm, "MASTER_ADDR": "head", "MASTER_PORT": "4000"}).dist_url == "tcp://head:4000"
    torchrun = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
                "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400"}
    assert placement_from_env({**slurm, **torchrun}) == Placement(3, 4, 1, 2, 1, 2, "10.0.0.1", 29400, "torchrun")
    assert placement_from_env({"PATH": "/bin"}) is None
    assert [first_host(s) for s in ("a1", "n[003-005,9],c1", "n[7]", "x-1,y")] == ["a1", "n003", "n7", "x-1"]
    with pytest.raises(WinposError, match="block order"):  # srun --distribution=cyclic: rank 1 on node 1
        placement_from_env({**slurm, "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_NODEID": "1"})
    with pytest.raises(WinposError, match="same number on every node"):
        placement_from_env({**slurm, "SLURM_TASKS_PER_NODE": "5,3"})


WORKER = """
import sys
import torch.distributed as dist
from detectron2.utils import comm
from winpos.d2.launch import launch_main
import argparse

def main(args):
    import types
    from winpos.d2.hooks import StopRequested, StopWhenAsked, arm_stop, request_stop

    t = __import__("torch").tensor([comm.get_rank() + 1.0])
    dist.all_reduce(t)
    arm_stop()  # a preemption signal reaching rank 1 only: both ranks leave the loop before the same iteration
    hook = StopWhenAsked()
    hook.trainer = types.SimpleNamespace(iter=7)
    hook.before_step()  # no signal yet: goes on
    if comm.get_rank() == 1:
        request_stop(12)
    try:
        hook.before_step()
        stopped = "none"
    except StopRequested as stop:
        stopped = f"{stop.signum}@{stop.iteration}"
    print("PLACED", comm.get_rank(), comm.get_world_size(), comm.get_local_rank(), comm.get_local_size(), int(t),
          stopped)

launch_main(argparse.Namespace(num_gpus=1, num_machines=1, machine_rank=0, dist_url="auto"), main)
"""


def test_two_processes_placed_by_slurm_form_one_group():
    """Two tasks as srun starts them (torchrun's variables lead to the same ``Placement``, tested above) form one
    gloo group, and a stop asked of one of them stops both before the same iteration."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = {"SLURM_PROCID": str(rank), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(rank), "SLURM_NODEID": "0",
               "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "127.0.0.1", "MASTER_PORT": str(port)}
        base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_"))}
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER], env={**base, **env, "OMP_NUM_THREADS": "1"},
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT))
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for _, e in outs]
    placed = sorted(line.split()[1:] for o, _ in outs for line in o.splitlines() if line.startswith("PLACED"))
    # rank, world, local rank, local size, the all-reduced sum, where each stopped (signal 12 after iteration 6)
    assert placed == [["0", "2", "0", "2", "3", "12@6"], ["1", "2", "1", "2", "3", "12@6"]]


def test_launch_flags_beside_a_launcher_are_refused():
    from winpos.d2.launch import Placement, launch_main

    two = Placement(0, 2, 0, 2, 0, 1, "127.0.0.1", 1, "slurm")
    args = argparse.Namespace(num_gpus=1, num_machines=2, machine_rank=0, dist_url="auto")
    with pytest.raises(WinposError, match="drop them"):
        launch_main(args, print, placement=two)
    with pytest.raises(WinposError, match="each task is already one process"):
        launch_main(argparse.Namespace(**{**vars(args), "num_machines": 1, "num_gpus": 4}), print, placement=two)


def test_slurm_time():
    from winpos.d2.slurm import parse_slurm_time

    assert [parse_slurm_time(t) for t in ("90", "4:00:00", "30:30", "1-00:00:00", "2-3", "0:59:01")] == \
        [90, 240, 31, 1440, 2 * 1440 + 180, 60]
    with pytest.raises(WinposError, match="not a SLURM time"):
        parse_slurm_time("4h")


@pytest.mark.parametrize("argv, needles", [
    (["--slurm-partition", "gpu"], ["--slurm-partition without --slurm", "add --slurm"]),
    (["--slurm", "--slurm-local", "--num-machines", "2"], ["--slurm with --num-machines", "--slurm-nodes"]),
    (["--slurm", "--num-gpus", "8"], ["--slurm with --num-gpus", "--slurm-gpus-per-node"]),
    (["--slurm", "--slurm-time", "4h"], ["not a SLURM time"]),
    (["--slurm"], ["sbatch is not on PATH", "--slurm-local"]),
])
def test_bad_slurm_flags_are_one_line(argv, needles, capsys, monkeypatch):
    from winpos.cli.train_net import main

    monkeypatch.setenv("PATH", "/nonexistent")  # no sbatch here, whatever the machine has
    assert main([*argv, "--config-file", CONFIG]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and all(n in err[0] for n in needles), err


def test_slurm_without_submitit_is_one_line(capsys, monkeypatch):
    from winpos.cli.train_net import main

    monkeypatch.setitem(sys.modules, "submitit", None)  # as if not installed
    assert main(["--slurm", "--slurm-local", "--config-file", CONFIG]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs submitit" in err[0] and "pip install 'winpos[slurm]'" in err[0], err
