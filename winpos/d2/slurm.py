"""SLURM through submitit: ``submit`` sends a ``winpos-train`` command line as a job of one task per GPU whose
callable, ``TrainJob``, runs ``winpos.d2.launch.launch_main`` in each task as its rank (``_submitit_placement``).

On a time-out or preemption signal submitit calls ``TrainJob.checkpoint``, which returns the same command with
``--resume`` (and without ``--force``); the requeued job continues from the run's last checkpoint under the resume
rules of ``winpos.d2.run_dir.check_resume``, so the finished run equals an uninterrupted one. The signal only asks
training to stop between two iterations (``winpos.d2.hooks.StopWhenAsked``), every rank at the same one; then
submitit's own handler checkpoints, requeues and exits.
"""
from __future__ import annotations

import argparse
import os
import re
import sys

from winpos.d2.launch import Placement, _job_port, launch_main
from winpos.errors import WinposError
from winpos.utils.cli import quiet_third_party_warnings

__all__ = ["TrainJob", "submit", "parse_slurm_time", "require_sbatch"]

def _submitit_placement() -> Placement:
    """The ``Placement`` of a task that submitit started (SLURM's variables, or its local executor's)."""
    import submitit

    job = submitit.JobEnvironment()
    per_node = job.num_tasks // max(job.num_nodes, 1)
    hosts = list(getattr(job, "hostnames", ()) or ["127.0.0.1"])
    master = os.environ.get("MASTER_ADDR") or ("127.0.0.1" if job.cluster in ("local", "debug") else hosts[0])
    port = int(os.environ.get("MASTER_PORT") or _job_port(job.job_id))
    return Placement(job.global_rank, job.num_tasks, job.local_rank, per_node, job.node, job.num_nodes, master, port,
                     "submitit").check()


class TrainJob:
    """The callable a submitted job runs: ``winpos.d2.engine.main`` in this task as its rank (``launch_main``).

    Checkpointable in submitit's sense: on a time-out or preemption signal submitit calls ``checkpoint``, dumps the
    ``DelayedSubmission`` it returns and requeues the job, which then runs that instead. The training run itself
    saves its checkpoints (``train.checkpointer.period``); the requeued command is the same with ``--resume``, which
    continues from the last one exactly. An evaluation (``--eval-only``) is rerun unchanged."""

    def __init__(self, args: argparse.Namespace):
        self.args = args

    def __call__(self):
        import signal

        from winpos.d2.hooks import StopRequested, arm_stop, request_stop

        quiet_third_party_warnings()
        args = self.args
        restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
        if restarts and not args.resume and not args.eval_only:  # requeued by SLURM (node failure), not by us
            print(f"SLURM requeued this job ({restarts}x): continuing the run with --resume", file=sys.stderr)
            args = self.resumed().args
        # submitit's handler (checkpoint, requeue, exit) would raise inside a training step; the step ends first
        preempt = _preemption_signal()
        submitit_handler = signal.getsignal(preempt)
        if callable(submitit_handler) and not args.eval_only:
            arm_stop()
            signal.signal(preempt, request_stop)
        try:
            return launch_main(args, placement=_submitit_placement())
        except StopRequested as stop:
            signal.signal(preempt, submitit_handler)
            submitit_handler(stop.signum, None)  # rank 0: checkpoint() -> this command with --resume; requeue; exit
            raise SystemExit(0) from None  # another rank: rank 0 requeues the job

    def resumed(self) -> "TrainJob":
        """The same command continuing its run: ``--resume`` without ``--force`` (which would remove it)."""
        if self.args.eval_only:
            return TrainJob(self.args)
        return TrainJob(argparse.Namespace(**{**vars(self.args), "resume": True, "force": False}))

    def checkpoint(self, *unused_args, **unused_kwargs):
        import submitit

        return submitit.helpers.DelayedSubmission(self.resumed())


def _preemption_signal() -> int:
    """The signal submitit asks SLURM for on preemption and ahead of the time limit (USR2 unless
    ``SUBMITIT_PREEMPT_SIGNAL`` says otherwise)."""
    import signal

    from submitit.core.job_environment import JobEnvironment

    return getattr(signal, "SIG" + JobEnvironment.USR_SIG)


def parse_slurm_time(text: str) -> int:
    """Minutes from SLURM's time formats: ``90``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``."""
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", str(text).strip())
    if m is None:
        raise WinposError(f"--slurm-time {text!r} is not a SLURM time; give minutes (240) or HH:MM:SS (4:00:00) or "
                          "D-HH:MM:SS (1-00:00:00)")
    days, a, b, c = m.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        minutes = int(days) * 1440 + int(a) * 60 + int(b or 0) + (int(c or 0) + 59) // 60
    elif c is not None:  # HH:MM:SS
        minutes = int(a) * 60 + int(b) + (int(c) + 59) // 60
    elif b is not None:  # MM:SS
        minutes = int(a) + (int(b) + 59) // 60
    else:
        minutes = int(a)
    if minutes < 1:
        raise WinposError(f"--slurm-time {text!r} is under a minute; give the job's time limit, e.g. 4:00:00")
    return minutes


def submit(args: argparse.Namespace, nodes: int = 1, gpus_per_node: int = 1, minutes: int = 60,
           partition: str | None = None, account: str | None = None, folder=None, local: bool = False,
           signal_delay_s: int = 120):
    """Submit ``args`` (a ``winpos-train`` command line, parsed) as a SLURM job of ``nodes`` x ``gpus_per_node``
    tasks (one per GPU) through submitit; returns submitit's job. ``local``: submitit's local executor instead (one
    node, ``gpus_per_node`` processes on this machine: a try without a cluster). submitit's logs and pickles go to
    ``folder`` (default: ``train.output_dir/submitit``). The run is checked first as a start here would be: a
    batch the world cannot make, a folder that holds another run without ``--resume`` / ``--force``."""
    from pathlib import Path

    try:
        import submitit
    except ImportError:
        raise WinposError("--slurm needs submitit, which is not installed: pip install 'winpos[slurm]' (or pip "
                          "install submitit)") from None
    from omegaconf import OmegaConf

    from winpos.d2.config import load_config
    from winpos.d2.run_dir import run_files
    from winpos.d2.startup import check_before_launch

    if local and nodes != 1:
        raise WinposError(f"--slurm-nodes {nodes} with --slurm-local: submitit's local executor runs one node; drop "
                          "--slurm-local to submit to SLURM")
    if not local:
        require_sbatch()
    world = nodes * gpus_per_node
    check_before_launch(argparse.Namespace(**{**vars(args), "num_gpus": gpus_per_node, "num_machines": nodes}))
    cfg = load_config(args.config_file, args.opts)
    output_dir = OmegaConf.select(cfg, "train.output_dir", default=None)
    if not args.eval_only and output_dir and run_files(output_dir) and not (args.resume or args.force):
        names = ", ".join(sorted({p.name for p in run_files(output_dir)})[:4])
        raise WinposError(f"train.output_dir={output_dir} holds another run ({names}); pass --resume to continue it, "
                          "--force to replace it, or choose a new output_dir")
    folder = Path(folder) if folder else Path(output_dir or ".") / "submitit"
    executor = submitit.AutoExecutor(folder=str(folder), cluster="local" if local else "slurm")
    params = dict(nodes=nodes, tasks_per_node=gpus_per_node, timeout_min=minutes, name="winpos-train",
                  stderr_to_stdout=False)
    if not local:  # one GPU per task, every task seeing the node's GPUs; the signal ahead of the time limit
        params.update(gpus_per_node=gpus_per_node, slurm_signal_delay_s=signal_delay_s,
                      **({"slurm_partition": partition} if partition else {}),
                      **({"slurm_account": account} if account else {}))
    elif _cuda_count() >= gpus_per_node:
        params["gpus_per_node"] = gpus_per_node
    executor.update_parameters(**params)
    job_args = argparse.Namespace(**{**vars(args), "num_gpus": 1, "num_machines": 1, "machine_rank": 0})
    job = executor.submit(TrainJob(job_args))
    print(f"submitted job {job.job_id}: {world} process(es), {nodes} node(s) x {gpus_per_node}, {minutes} min per "
          f"attempt, requeued with --resume on time-out or preemption; logs in {folder}", flush=True)
    return job


def require_sbatch() -> None:
    """Refuse a SLURM submission from a machine without ``sbatch`` on PATH."""
    import shutil

    if shutil.which("sbatch") is None:
        raise WinposError("--slurm but sbatch is not on PATH (not a SLURM login node); submit from a machine with "
                          "SLURM, or add --slurm-local to run the job here through submitit's local executor")


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
