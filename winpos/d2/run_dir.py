"""The training output folder's policy: one run per ``train.output_dir``, never taken over, never shared.

``claim_run_dir(output_dir, resume=..., force=...)`` runs before a training run writes anything there (before its
``log.txt``):

- it takes the folder's lock, ``.winpos-run.lock``: an exclusive ``flock`` held until the process ends (the system
  releases it when the process dies, so a killed run leaves no stale lock). The file names the holder (pid, host,
  start time, command line), so a second run into the folder is refused naming the first;
- a folder that holds another run (``last_checkpoint``, ``model_*.pth``, ``metrics.json`` or ``config.yaml``) is
  refused unless ``resume`` (continue it) or ``force`` (replace it: the earlier run's files are removed first, so
  no old checkpoint, metrics line, log or TensorBoard event is left beside the new run).

Claiming a folder this process already holds returns at once, so both ``setup`` and ``do_train`` may call it.
"""
from __future__ import annotations

import datetime
import os
import shutil
import socket
import sys
from pathlib import Path

from winpos.errors import WinposError

__all__ = ["claim_run_dir", "run_files", "LOCK_NAME", "release_run_dir"]

LOCK_NAME = ".winpos-run.lock"
_RUN_FILES = ("last_checkpoint", "metrics.json", "config.yaml")  # what marks a run (an evaluation or a start that
_RUN_GLOBS = ("model_*.pth",)                                      # failed leaves only a log.txt)
_FORCE_ALSO = ("log.txt", "log.txt.rank*", "events.out.tfevents.*")  # removed too when a run is replaced
_held: dict[str, int] = {}  # resolved folder -> lock file descriptor, kept open for the life of the process


def run_files(folder) -> list[Path]:
    """The files that mark an earlier training run in ``folder``: checkpoints, ``metrics.json``, ``config.yaml``."""
    return _files(folder, _RUN_FILES, _RUN_GLOBS)


def _files(folder, names, patterns) -> list[Path]:
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [folder / n for n in names if (folder / n).is_file()]
    for pattern in patterns:
        found += sorted(p for p in folder.glob(pattern) if p.is_file())
    return found


def _holder() -> str:
    started = datetime.datetime.now().isoformat(timespec="seconds")
    return f"pid {os.getpid()} on {socket.gethostname()}, started {started}: {' '.join(sys.argv)[:300]}\n"


def _lock(folder: Path, flag: str) -> int:
    import fcntl

    path = folder / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # output-policy: the lock, a note, not an output
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise WinposError(f"{flag}={folder} is in use by another training run ({holder}); wait for it to end, or "
                          "choose another output_dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, _holder().encode(), 0)  # names the holder to the next claimant
    return fd


def claim_run_dir(output_dir, resume: bool = False, force: bool = False,
                  flag: str = "train.output_dir") -> Path:
    """Lock ``output_dir`` for this run and apply the policy above; returns the folder (created if missing).

    Raises WinposError when another process holds the folder, or when it holds another run and neither
    ``resume`` nor ``force`` is set.
    """
    folder = Path(output_dir)
    if folder.exists() and not folder.is_dir():
        raise WinposError(f"{flag}={folder} is a file, not a folder; choose a folder for the run's outputs")
    key = str(folder.resolve())
    if key in _held:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    fd = _lock(folder, flag)  # first, so a run in progress is named as such
    earlier = run_files(folder)
    if earlier and not (resume or force):
        os.close(fd)
        names = ", ".join(sorted({p.name for p in earlier})[:4])
        raise WinposError(f"{flag}={folder} holds another run ({names}); pass --resume to continue it, --force to "
                          "replace it, or choose a new output_dir")
    _held[key] = fd
    if force and not resume:
        for p in earlier + _files(folder, (), _FORCE_ALSO):
            p.unlink(missing_ok=True)
        shutil.rmtree(folder / "inference", ignore_errors=True)
    return folder


def release_run_dir(output_dir) -> None:
    """Release this process's lock on ``output_dir`` (the end of the process releases it too)."""
    fd = _held.pop(str(Path(output_dir).resolve()), None)
    if fd is not None:
        os.close(fd)
