"""Starting training processes: on this machine, under a cluster's launcher (SLURM's ``srun``, ``torchrun``), and as
a SLURM job submitted through submitit that requeues and resumes itself.

- ``launch_main(args)`` runs ``winpos.d2.engine.main`` in the processes the command line and the environment ask
  for. Without a launcher: ``--num-gpus`` processes per machine through detectron2's ``launch`` (gloo on the CPU).
  Under a launcher, ``placement_from_env`` reads the rank, world size, local rank, node and rendezvous address
  (torchrun's ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE`` / ``MASTER_ADDR`` / ``MASTER_PORT``,
  else SLURM's ``SLURM_PROCID`` / ``SLURM_NTASKS`` / ``SLURM_LOCALID`` / ``SLURM_NODEID`` / ``SLURM_NNODES``, the
  first host of ``SLURM_STEP_NODELIST`` or ``SLURM_JOB_NODELIST``, and a port derived from ``SLURM_JOB_ID``;
  ``MASTER_ADDR`` / ``MASTER_PORT`` override them). One task per GPU: this process joins the group as its rank,
  as a process that detectron2's ``launch`` spawns would (same backend, same per-machine group). One task per
  node with ``--num-gpus G``: detectron2's ``launch`` spawns G processes with ``machine_rank`` = the node.
- Every process launched here runs through ``run_reporting``: an error becomes a note (rank, status, one line, a
  bug's traceback) that the parent's ``launched_failure`` turns into one ``ProcessFailed`` line.
- ``winpos.d2.slurm.submit(args, ...)`` sends the same run to SLURM (or, ``local=True``, to submitit's local executor): one task per
  GPU, the callable a ``TrainJob``. On a time-out or preemption signal submitit calls ``TrainJob.checkpoint``,
  which returns the same command with ``--resume`` (and without ``--force``); the requeued job continues from the
  run's last checkpoint under the resume rules of ``winpos.d2.run_dir.check_resume``, so the finished run equals an
  uninterrupted one. A job that SLURM requeues on its own (node failure: ``SLURM_RESTART_COUNT`` > 0) resumes too.
  That half lives in ``winpos.d2.slurm``; this module keeps the launching both halves share.
"""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from typing import Callable, Mapping

from winpos.errors import EXIT_FAILED, EXIT_USAGE, ProcessFailed, WinposError
from winpos.utils.cli import USAGE_ERRORS, error_line, one_line, quiet_third_party_warnings
from winpos.utils.outputs import atomic_write_json

__all__ = ["NOTES_ENV", "run_reporting", "launched_failure", "Placement", "placement_from_env", "first_host",
           "launch_main"]

NOTES_ENV = "WINPOS_PROCESS_NOTES"  # the folder where each launched process leaves its note (set by the parent)


# ------------------------------------------------------------------------------------- errors of launched processes


def run_reporting(main: Callable, *args):
    """Run ``main(*args)`` in a launched process; an exception becomes a note in ``$WINPOS_PROCESS_NOTES`` (the
    process's rank, exit status, one line, and for a bug its traceback) and ``SystemExit`` with that status, so
    the parent prints one line (``launched_failure``) instead of one traceback per process."""
    quiet_third_party_warnings()
    try:
        return main(*args)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 - every error ends as a note and a status
        import traceback

        bug = not isinstance(e, (OSError,) + USAGE_ERRORS)
        status = EXIT_USAGE if isinstance(e, USAGE_ERRORS) else EXIT_FAILED
        rank = _rank()
        note = {"rank": rank, "status": status, "line": error_line(e) if not bug else
                f"{type(e).__name__}: {one_line(e)}", "bug": bug,
                "traceback": "".join(traceback.format_exception(e)) if bug else ""}
        folder = os.environ.get(NOTES_ENV)
        if folder and os.path.isdir(folder):
            atomic_write_json(os.path.join(folder, f"rank{rank}.json"), note)
        else:
            print(f"error: {note['line']}", file=sys.stderr)
        raise SystemExit(status) from None


def _rank() -> int:
    try:
        import torch.distributed as dist

        return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    except Exception:  # noqa: BLE001 - before the process group exists
        return 0


def launched_failure(exc: BaseException, notes_folder) -> ProcessFailed:
    """The one-line ``ProcessFailed`` for ``exc``, the exception ``torch.multiprocessing`` raised in the parent
    when a launched process failed, read from the processes' notes in ``notes_folder``. The line of a bad input or
    write failure wins over the errors it caused in the other processes (a lost connection); a bug's traceback
    (one process's) is printed to stderr first; a process killed by a signal is named with it."""
    import json
    from pathlib import Path

    notes = []
    for p in sorted(Path(notes_folder).glob("rank*.json")):
        try:
            notes.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    if notes:
        note = min(notes, key=lambda n: (n["bug"], n["rank"]))
        if note["bug"]:
            sys.stderr.write(note["traceback"])
        prefix = f"rank {note['rank']}: " if note["bug"] else ""
        return ProcessFailed(prefix + note["line"], int(note["status"]))
    index = getattr(exc, "error_index", "?")
    signal_name = getattr(exc, "signal_name", None)
    if signal_name:
        return ProcessFailed(f"the process of rank {index} was killed by {signal_name}; the others were stopped. "
                             "A training run continues from its last checkpoint with --resume", EXIT_FAILED)
    code = getattr(exc, "exit_code", None)
    return ProcessFailed(f"the process of rank {index} ended with exit status {code} and left no message; the "
                         "others were stopped (see the run's log.txt)", EXIT_FAILED)


# ----------------------------------------------------------------------------------- where this process stands


@dataclass(frozen=True)
class Placement:
    """This process's place in a run that a launcher started: global ``rank`` of ``world_size``, ``local_rank`` of
    ``local_world_size`` on machine ``node`` of ``num_nodes``, and the rendezvous ``master_addr:master_port``."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node: int
    num_nodes: int
    master_addr: str
    master_port: int
    source: str  # "torchrun", "slurm" or "submitit"

    @property
    def dist_url(self) -> str:
        return f"tcp://{self.master_addr}:{self.master_port}"

    def check(self) -> "Placement":
        """Refuse a placement that is not one block of ``local_world_size`` ranks per node (detectron2's layout)."""
        ok = (self.world_size == self.num_nodes * self.local_world_size and 0 <= self.rank < self.world_size
              and 0 <= self.local_rank < self.local_world_size and 0 <= self.node < self.num_nodes
              and self.rank == self.node * self.local_world_size + self.local_rank)
        if not ok:
            fix = ("start the same number of tasks on every node in block order (srun --distribution=block, "
                   "--ntasks-per-node)" if self.source == "slurm" else "start the same number of processes on every "
                   "node (torchrun --nproc-per-node)")
            raise WinposError(f"{self.source} placed this process as rank {self.rank} of {self.world_size}, local "
                              f"rank {self.local_rank} of {self.local_world_size} on node {self.node} of "
                              f"{self.num_nodes}: not one block of ranks per node as detectron2 numbers them; {fix}")
        return self


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    value = env.get(name)
    if value is None or value == "":
        if default is None:
            raise WinposError(f"the environment sets the launcher's other variables but not {name}; start the "
                              "processes with the launcher (srun, torchrun), or unset its variables")
        return default
    try:
        return int(value)
    except ValueError:
        raise WinposError(f"{name}={value!r} is not an integer; start the processes with the launcher (srun, "
                          "torchrun), which sets it") from None


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: ``gpu[003-005,9],cpu1`` -> ``gpu003``, ``a1,b2`` -> ``a1``."""
    match = re.match(r"([^,\[]+)(?:\[([^\],]+?)(?:[-,][^\]]*)?\])?", nodelist.strip())
    if not match or not nodelist.strip():
        raise WinposError(f"SLURM_JOB_NODELIST={nodelist!r} names no host; set MASTER_ADDR to the first node's name")
    return match.group(1) + (match.group(2) or "")


def _tasks_per_node(env: Mapping[str, str], ntasks: int, nnodes: int) -> int:
    """Tasks per node from ``SLURM_STEP_TASKS_PER_NODE`` / ``SLURM_TASKS_PER_NODE`` (``4(x2)`` or ``4,4``); the
    same on every node, else refused."""
    text = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or ""
    counts = set()
    for part in filter(None, text.split(",")):
        m = re.fullmatch(r"(\d+)(?:\(x\d+\))?", part.strip())
        if m is None:
            counts = set()
            break
        counts.add(int(m.group(1)))
    if len(counts) > 1:
        raise WinposError(f"SLURM placed {text} tasks on the nodes: detectron2 needs the same number on every node; "
                          "pass --ntasks-per-node")
    if counts:
        return counts.pop()
    if ntasks % nnodes:
        raise WinposError(f"SLURM_NTASKS={ntasks} tasks over SLURM_NNODES={nnodes} nodes is not the same number on "
                          "every node; pass --ntasks-per-node")
    return ntasks // nnodes


def placement_from_env(env: Mapping[str, str] | None = None) -> Placement | None:
    """This process's ``Placement`` from torchrun's environment (first: torchrun inside a SLURM job sets its own) or
    SLURM's; None when neither launched it."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        world, rank = _int(env, "WORLD_SIZE"), _int(env, "RANK")
        local_world = _int(env, "LOCAL_WORLD_SIZE", world)
        local_rank = _int(env, "LOCAL_RANK", rank % max(local_world, 1))
        num_nodes = world // local_world if local_world and world % local_world == 0 else 0
        node = _int(env, "GROUP_RANK", rank // local_world if local_world else 0)
        return Placement(rank, world, local_rank, local_world, node, num_nodes, env.get("MASTER_ADDR", "127.0.0.1"),
                         _int(env, "MASTER_PORT", 29500), "torchrun").check()
    if "SLURM_PROCID" in env and ("SLURM_STEP_NUM_TASKS" in env or "SLURM_NTASKS" in env):
        world = _int(env, "SLURM_STEP_NUM_TASKS") if "SLURM_STEP_NUM_TASKS" in env else _int(env, "SLURM_NTASKS")
        nnodes = _int(env, "SLURM_STEP_NUM_NODES") if "SLURM_STEP_NUM_NODES" in env else \
            _int(env, "SLURM_NNODES", _int(env, "SLURM_JOB_NUM_NODES", 1))
        master = env.get("MASTER_ADDR") or first_host(env.get("SLURM_STEP_NODELIST") or
                                                      env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", ""))
        return Placement(_int(env, "SLURM_PROCID"), world, _int(env, "SLURM_LOCALID", 0),
                         _tasks_per_node(env, world, nnodes), _int(env, "SLURM_NODEID", 0), nnodes, master,
                         _int(env, "MASTER_PORT", _job_port(env.get("SLURM_JOB_ID", "0"))), "slurm").check()
    return None


def _job_port(job_id: str) -> int:
    """A port every task of a job derives alike from its id (no exchange needed): 20000..39999."""
    digits = re.sub(r"\D", "", str(job_id)) or "0"
    return 20000 + int(digits) % 20000


# ---------------------------------------------------------------------------------------------- launching


def _join_as_rank(placement: Placement, main_func: Callable, args) -> object:
    """Join the process group as ``placement.rank`` and run ``main_func(args)``: what each process that detectron2's
    ``launch`` spawns does (NCCL with a GPU, else gloo; detectron2's per-machine group; this process's GPU)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from detectron2.utils import comm

    cuda = torch.cuda.is_available()
    if cuda:
        count = torch.cuda.device_count()
        if count not in (1, placement.local_world_size) and count < placement.local_world_size:
            raise WinposError(f"{placement.local_world_size} processes on this node but {count} GPUs are visible to "
                              "each; give every task one GPU or all of the node's")
        torch.cuda.set_device(placement.local_rank if count >= placement.local_world_size else 0)
    print(f"rank {placement.rank} of {placement.world_size} ({placement.source}): joining at {placement.dist_url}",
          file=sys.stderr, flush=True)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=placement.dist_url,
                            world_size=placement.world_size, rank=placement.rank, timeout=timedelta(minutes=30))
    try:
        comm.create_local_process_group(placement.local_world_size)
        comm.synchronize()
        return main_func(args)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def launch_main(args, main_func: Callable | None = None, placement: Placement | None = None):
    """Run ``main_func(args)`` (default ``winpos.d2.engine.main``) in the processes asked for.

    ``placement`` (default: ``placement_from_env()``) of more than one process: each task is one rank (with
    ``--num-gpus 1``), or each task is one node and spawns ``--num-gpus`` processes through detectron2's ``launch``.
    Otherwise ``args.num_gpus`` processes per machine via detectron2's ``launch`` (gloo on the CPU). With several
    processes spawned here each runs through ``run_reporting``, and a failure raises one
    ``winpos.errors.ProcessFailed`` here (one line, the status of a bad input or of a failure while working)
    instead of the traceback of every process."""
    if main_func is None:
        from winpos.d2.engine import main as main_func
    if args.num_gpus < 1:
        raise WinposError(f"--num-gpus={args.num_gpus}: need at least 1 process per machine")
    placement = placement_from_env() if placement is None else placement
    common = dict(num_machines=args.num_machines, machine_rank=args.machine_rank, dist_url=args.dist_url)
    if placement is not None and placement.world_size > 1:
        if args.num_machines != 1 or args.machine_rank != 0:
            raise WinposError(f"--num-machines / --machine-rank given, but {placement.source} started this process "
                              f"as rank {placement.rank} of {placement.world_size}: drop them (the launcher says "
                              "where each process stands)")
        if args.dist_url != "auto":
            placement = _with_url(placement, args.dist_url)
        if args.num_gpus == 1:
            return _join_as_rank(placement, main_func, args)
        if placement.local_world_size != 1:
            raise WinposError(f"--num-gpus {args.num_gpus} under {placement.source} with {placement.local_world_size} "
                              "tasks per node: each task is already one process; drop --num-gpus, or start one task "
                              "per node")
        common = dict(num_machines=placement.num_nodes, machine_rank=placement.node, dist_url=placement.dist_url)
    import torch
    from detectron2.engine import launch

    if torch.cuda.is_available() and args.num_gpus > torch.cuda.device_count():
        raise WinposError(f"--num-gpus={args.num_gpus} but only {torch.cuda.device_count()} GPUs are visible")
    if args.num_gpus * common["num_machines"] == 1:  # in this process: run_cli reports its errors
        return launch(main_func, 1, args=(args,), **common)
    import tempfile

    from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

    with tempfile.TemporaryDirectory(prefix="winpos-notes-") as notes:
        before = os.environ.get("PYTHONWARNINGS")
        os.environ[NOTES_ENV] = notes  # the spawned processes inherit both
        # detectron2 warns of this on import, before a spawned process runs any winpos code
        os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [before, "ignore:`torch.jit.script` is deprecated"]))
        try:
            return launch(run_reporting, args.num_gpus, args=(main_func, args), **common)
        except (ProcessExitedException, ProcessRaisedException) as e:
            raise launched_failure(e, notes) from None
        finally:
            os.environ.pop(NOTES_ENV, None)
            if before is None:
                os.environ.pop("PYTHONWARNINGS", None)
            else:
                os.environ["PYTHONWARNINGS"] = before


def _with_url(placement: Placement, url: str) -> Placement:
    m = re.fullmatch(r"tcp://(.+):(\d+)", url)
    if m is None:
        raise WinposError(f"--dist-url {url} under {placement.source}: give tcp://HOST:PORT (or leave it out: the "
                          "first node and a port from the job id are used)")
    from dataclasses import replace

    return replace(placement, master_addr=m.group(1), master_port=int(m.group(2)))
