"""The command-line policy every winpos command follows.

The commands run their ``main`` through ``run_cli``, which prints a ``WinposError`` (``winpos.errors``) or an
unusable path as one ``error: ...`` line on stderr and exits with ``EXIT_USAGE`` (2), the status argparse also uses
for bad arguments; a failure that is not the user's input (a full disk while writing) exits with ``EXIT_FAILED``
(1), a missing detectron2 with ``EXIT_ENVIRONMENT`` (2: never a doctor verdict) and Ctrl-C with
``EXIT_INTERRUPTED`` (130). ``error_line`` is that one line, for the commands and for launched processes alike.

The commands share one policy besides: they import torch and detectron2 only after parsing (``--help`` and argument
errors answer at once; this module imports neither), they parse with ``ArgumentParser`` and the argparse types
here, they refuse what they can before any work (outputs, class counts, sizes), a command that draws a progress bar
takes ``--no-progress``, and ``quiet_third_party_warnings`` is the one place where upstream warnings that a winpos
user cannot act on are filtered.

A command that starts N processes keeps the same contract: ``run_reporting`` (``winpos.d2.launch``) wraps the
function every process runs, turning an error into a short note for the parent and an exit status instead of a
traceback per process, and ``launched_failure`` reads those notes in the parent into one ``ProcessFailed`` (one
``error:`` line, exit 2 for bad input, 1 for a failure while working, a killed process named with its signal).
"""
from __future__ import annotations

import argparse
import errno
import math
import os
import re
import sys
import warnings
from typing import Callable

from winpos.errors import EXIT_FAILED, EXIT_USAGE, ProcessFailed, WinposError

__all__ = ["EXIT_ENVIRONMENT", "EXIT_INTERRUPTED", "USAGE_ERRORS", "D2_INSTALL", "run_cli", "one_line",
           "error_line", "missing_d2_line", "quiet_third_party_warnings", "ArgumentParser", "late_flags",
           "positive_int", "nonnegative_int", "finite_float", "int_list", "number_list", "seed_list",
           "constructor_overrides"]

EXIT_ENVIRONMENT = EXIT_USAGE  # a package missing here (detectron2): never a verdict (the doctor: 0 OK, 1 BUG)
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), as a shell reports a process it interrupted

# The packages winpos.d2 imports (detectron2 and the [d2] extra's). A command that meets one missing says so in one
# line with the command that installs it, instead of a traceback; any other ImportError keeps its traceback.
D2_STACK = ("detectron2", "fvcore", "iopath", "omegaconf", "hydra", "yacs", "termcolor", "tabulate", "cloudpickle",
            "torchvision", "shapely", "tensorboard", "pkg_resources")
# Errors of the user's input (exit EXIT_USAGE); any other OSError happened while working (EXIT_FAILED)
USAGE_ERRORS = (WinposError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)
D2_INSTALL = "python -m winpos.install_d2 (detectron2's pure-Python part and the [d2] extra; no compiler needed)"

# Upstream warnings that say nothing a winpos user can act on: (message regex, category). Each names the package
# that prints it; anything not listed here is still shown.
QUIET_WARNINGS = (
    (r".*torch\.jit\.script.* is deprecated", FutureWarning),  # detectron2 on import
    (r".*torch\.jit\.script.* is deprecated", DeprecationWarning),
    (r"torch\.meshgrid: in an upcoming release", UserWarning),  # detectron2's anchor generator
    (r"Importing from timm\.models\.layers is deprecated", FutureWarning),  # hiera-transformer imports old timm
    (r"`broadcast_buffers` is deprecated", FutureWarning),  # detectron2's create_ddp_model (several processes)
)
QUIET_LOGGERS = {"torch.fx._symbolic_trace": "is_fx_tracing will return true",  # detectron2's fx wrap check
                 "torch.utils.cpp_extension": "No CUDA runtime is found",  # detectron2's environment collection
                 "torch.multiprocessing.spawn": "Terminating process"}  # a failed process's siblings (said by us)


class _DropMessage:
    def __init__(self, start: str):
        self.start = start

    def filter(self, record) -> bool:
        return not str(record.msg).startswith(self.start)


def quiet_third_party_warnings() -> None:
    """Hide the upstream warnings in ``QUIET_WARNINGS`` / ``QUIET_LOGGERS`` (deprecations inside detectron2, torch
    and hiera-transformer), which every tool would otherwise print before its own output. The one place they are
    filtered; safe to call more than once."""
    import logging

    for message, category in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    for name, start in QUIET_LOGGERS.items():
        log = logging.getLogger(name)
        if not any(isinstance(f, _DropMessage) and f.start == start for f in log.filters):
            log.addFilter(_DropMessage(start))


def one_line(text) -> str:
    """``text`` (or an exception's message) with every run of whitespace, newlines included, as one space."""
    return " ".join(str(text).split())


def error_line(e: BaseException) -> str:
    """The one line that reports ``e``: its message, an ``OSError`` with the path it concerns, and for a full disk
    or a file size limit the fix. ``run_cli`` prints it after ``error:``; a launched process leaves it in its note."""
    text = str(e) if not isinstance(e, OSError) or e.filename is None or str(e.filename) in str(e) \
        else f"{e.strerror or e}: {e.filename}"
    full = (errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", -1))
    if isinstance(e, OSError) and e.errno in full and "free" not in text:
        text += "; free disk space (or raise the file size limit, ulimit -f) and run again"
    return one_line(text)


def run_cli(main: Callable[..., int | None], argv=None, failed_status: int = EXIT_FAILED) -> int:
    """Run a tool's ``main(argv)`` and turn errors into one line on stderr and an exit status.

    ``WinposError`` (every check of winpos raises it) and missing or unusable paths are bad input:
    ``EXIT_USAGE`` (2). Any other ``OSError`` (disk full, file size limit) happened while working:
    ``failed_status`` (``EXIT_FAILED``, 1; a command whose 1 is a verdict, the doctor's [BUG], passes
    ``EXIT_ENVIRONMENT``). Ctrl-C is one ``interrupted:`` line and ``EXIT_INTERRUPTED`` (130): every output is published only once it
    is complete, so what an interrupted command was writing is absent and the earlier files are as they were. Any
    other exception is a bug and keeps its traceback. The returned status of ``main`` (None meaning 0) is passed
    through otherwise.
    """
    quiet_third_party_warnings()
    try:
        status = main(argv)
    except ProcessFailed as e:
        _print_error(e)
        return e.status
    except ImportError as e:
        line = missing_d2_line(e)
        if line is None:
            raise
        _print_error(WinposError(line))
        return EXIT_ENVIRONMENT
    except USAGE_ERRORS as e:
        _print_error(e)
        return EXIT_USAGE
    except OSError as e:
        _print_error(e)
        return failed_status
    except KeyboardInterrupt:
        sys.stdout.flush()
        print("\ninterrupted (Ctrl-C): nothing it was writing was published and earlier outputs are unchanged; run "
              "the command again (a training run continues with --resume)", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0 if status is None else int(status)


def missing_d2_line(e: ImportError) -> str | None:
    """The one line for an ImportError of detectron2 or of a package of the ``[d2]`` extra (``D2_STACK``), naming
    the command that installs it; None for any other ImportError (a bug, or a name missing from an installed
    package, a version mismatch: those keep their traceback)."""
    text = str(e)
    if text.startswith("cannot import name"):
        return None
    found = re.match(r"(?:No module named )?'?([A-Za-z_][\w.]*)", text)
    name = getattr(e, "name", None) or (found.group(1) if found else "")
    top = name.split(".")[0]
    if top not in D2_STACK:
        return None
    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    command = prog or "this command"  # winpos-train, or tools/train_net.py, train_net.py (python -m)
    if top == "detectron2":
        return (f"{command} needs detectron2, which cannot be imported here ({one_line(text)}); install it: "
                f"{D2_INSTALL}")
    package = {"hydra": "hydra-core", "pkg_resources": "'setuptools<81'"}.get(top, top)
    return (f"{command} needs {top} (a dependency of winpos's detectron2 layer), which cannot be imported here "
            f"({one_line(text)}); install it: pip install 'winpos[d2]' (or pip install {package})")


def _print_error(e: BaseException) -> None:
    sys.stdout.flush()
    line = f"error: {error_line(e)}"
    # start on a fresh line: a progress bar may have left the cursor mid-line
    print(f"\n{line}" if _stderr_mid_line() else line, file=sys.stderr)


def _stderr_mid_line() -> bool:
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


_OVERRIDE = re.compile(r"^\+{0,2}[A-Za-z_][\w-]*(\.[\w-]+)*=")


def late_flags(tokens) -> list[str]:
    """Flags (``--x``) that come after the first ``key=value`` override in ``tokens``."""
    tokens = list(tokens)
    first = next((i for i, t in enumerate(tokens) if _OVERRIDE.match(t) and "." in t.split("=", 1)[0]), None)
    if first is None:
        return []
    return [t for t in tokens[first:] if t.startswith("-") and len(t) > 1 and not _is_number(t)]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` that says when a flag was placed after the ``key=value`` overrides (which take
    the rest of the command line), instead of a bare "required argument" or "unrecognized argument" error."""

    def parse_args(self, args=None, namespace=None):
        self._winpos_argv = list(sys.argv[1:] if args is None else args)
        ns = super().parse_args(args, namespace)
        opts = getattr(ns, "opts", None) or getattr(ns, "overrides", None) or []
        late = late_flags(opts) or [t for t in opts if isinstance(t, str) and t.startswith("--")]
        if late:
            self.error(_late_message(late))
        return ns

    def error(self, message):
        late = late_flags(getattr(self, "_winpos_argv", []))
        if late and "after the key=value overrides" not in message:
            message = f"{message} ({_late_message(late)})"
        super().error(message)


def _late_message(late) -> str:
    return (f"{', '.join(late)} comes after the key=value overrides, which take the rest of the command line; "
            "put every flag before the overrides")


def _int_at_least(text: str, low: int, expected: str) -> int:
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be {expected}, got {value}")
    return value


def constructor_overrides(items) -> dict:
    """``--set KEY=VALUE`` items as backbone constructor arguments; values are Python literals (``True``, ``8``,
    ``(1, 3)``, read with ``ast.literal_eval``, never run) or else strings."""
    import ast

    out = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.isidentifier():
            raise WinposError(f"--set {item!r} is not KEY=VALUE; e.g. --set pos_antialias=True")
        try:
            out[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            out[key] = text
    return out


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (argparse names the flag in its error)."""
    return _int_at_least(text, 1, "a positive integer (at least 1)")


def nonnegative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _int_at_least(text, 0, "an integer >= 0")


def finite_float(text: str) -> float:
    """argparse type: a finite number."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def int_list(text: str) -> list[int]:
    """argparse type: comma-separated positive integers such as ``512,768,1024`` (at least one)."""
    items = [s.strip() for s in str(text).split(",") if s.strip()]
    try:
        values = [int(s) for s in items]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers such as 512,768,1024, got "
                                         f"{text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers such as 512,768,1024, got "
                                         f"{text!r}")
    return values


def number_list(text: str) -> list[float | int]:
    """argparse type: comma-separated numbers such as ``2,4`` or ``1.5,2`` (at least one; whole ones as int)."""
    try:
        values = [float(s) for s in str(text).split(",") if s.strip()]
    except ValueError:
        values = []
    if not values or not all(math.isfinite(v) for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers such as 2,4, got {text!r}")
    return [int(v) if v == int(v) else v for v in values]


def seed_list(text: str) -> list[int]:
    """argparse type: comma-separated integer seeds such as ``0,1,2`` (at least one)."""
    try:
        values = [int(s) for s in str(text).split(",") if s.strip()]
    except ValueError:
        values = []
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated integer seeds such as 0,1,2, got {text!r}")
    return values
