"""Errors of launched processes: under detectron2's ``launch`` every process runs through ``run_reporting``,
which turns an error into a short note (rank, exit status, one line, and for a bug its traceback) in the folder
``NOTES_ENV`` names, and the parent's ``launched_failure`` turns those notes into one ``ProcessFailed`` line (exit 2
for bad input, 1 for a failure), preferring the original cause over the errors it triggered in the other processes.
Kept apart from ``winpos.errors`` because it writes files (``winpos.outputs``), which itself uses those errors.
"""
from __future__ import annotations

import errno
import sys
from typing import Callable

from winpos.errors import (EXIT_FAILED, EXIT_USAGE, ProcessFailed, WinposError, _one_line,
                           quiet_third_party_warnings)
from winpos.outputs import atomic_write_json

NOTES_ENV = "WINPOS_PROCESS_NOTES"  # the folder where each launched process leaves its note (set by the parent)
_USAGE_ERRORS = (WinposError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)


def _error_text(e: BaseException) -> str:
    text = str(e) if not isinstance(e, OSError) or e.filename is None or str(e.filename) in str(e) \
        else f"{e.strerror or e}: {e.filename}"
    full = (errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", -1))
    if isinstance(e, OSError) and e.errno in full and "free" not in text:
        text += "; free disk space (or raise the file size limit, ulimit -f) and run again"
    return _one_line(text)


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
        import os
        import traceback

        bug = not isinstance(e, (OSError,) + _USAGE_ERRORS)
        status = EXIT_USAGE if isinstance(e, _USAGE_ERRORS) else EXIT_FAILED
        rank = _rank()
        note = {"rank": rank, "status": status, "line": _error_text(e) if not bug else
                f"{type(e).__name__}: {_one_line(e)}", "bug": bug,
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
