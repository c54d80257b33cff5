"""Error types and the validators that raise them.

Every check raises ``WinposError``, a ``ValueError`` whose message is one sentence naming the argument, the
problem and the fix; a missing input path is a ``MissingInputError`` (also a ``FileNotFoundError``), and a failed
launched process is one ``ProcessFailed`` line with its exit status. ``EXIT_USAGE`` (2, the status argparse also
uses for bad arguments) is the status of bad input, ``EXIT_FAILED`` (1) that of a failure that is not the user's
input (a full disk while writing).

How a command prints these (one ``error: ...`` line, the exit statuses, argparse types, the warning filters) is
``winpos.utils.cli``; this module imports nothing beyond the standard library (torch only inside
``check_finite``).
"""
from __future__ import annotations

from typing import Iterable

__all__ = ["WinposError", "MissingInputError", "ProcessFailed", "EXIT_USAGE", "EXIT_FAILED", "check_choice",
           "check_finite", "as_hw"]

EXIT_USAGE = 2
EXIT_FAILED = 1


class WinposError(ValueError):
    """Bad input to winpos: the message names the argument (or file), what is wrong with it and the fix.

    A ``ValueError``, so code that already catches ``ValueError`` keeps working.
    """


class MissingInputError(WinposError, FileNotFoundError):
    """An input path that does not exist: a ``WinposError`` that code catching ``FileNotFoundError`` also sees."""

    def __str__(self) -> str:
        return self.args[0] if self.args else ""


class ProcessFailed(Exception):
    """A launched process failed: the message is the one line to print, ``status`` the exit status."""

    def __init__(self, message: str, status: int = EXIT_FAILED):
        super().__init__(message)
        self.status = status


def check_choice(name: str, value: str, choices: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``choices``, else raise a WinposError listing them."""
    choices = tuple(choices)
    if value not in choices:
        raise WinposError(f"unknown {name}={value!r}; choose one of {', '.join(repr(c) for c in choices)}")
    return value


def check_finite(name: str, tensor):
    """Raise if ``tensor`` (a torch tensor) holds NaN or inf (a corrupt or diverged embedding would otherwise spread
    silently)."""
    import torch  # here, not at the top: the command-line tools import this module before parsing (fast --help)

    if not torch.isfinite(tensor).all():
        bad = int((~torch.isfinite(tensor)).sum())
        raise WinposError(
            f"{name} has {bad} non-finite values (NaN/inf); the checkpoint is corrupt or training diverged: "
            "reload the weights or re-initialize this embedding"
        )
    return tensor


def _as_int(v, name: str, whole) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
        if hasattr(v, "__index__") and not isinstance(v, bool):  # numpy / torch integer scalars
            return int(v.__index__())
        raise WinposError(f"{name}={whole!r} must be an int or a (height, width) pair of ints; pass numbers, "
                          f"e.g. {name}=224 or {name}=(224, 320), not {type(v).__name__}")
    return int(v)


def as_hw(value, name: str = "size") -> tuple[int, int]:
    """Normalize an int or a pair of ints to ``(h, w)`` of positive ints.

    Strings are refused: ``"64"`` would otherwise be read character by character as the pair ``(6, 4)``.
    """
    if type(value) is tuple and len(value) == 2 and type(value[0]) is int and type(value[1]) is int \
            and value[0] > 0 and value[1] > 0:
        return value  # already normalized (the per-call hot path: every attention asks its position modules)
    if isinstance(value, (str, bytes)):
        raise WinposError(f"{name}={value!r} is a string; pass a number, e.g. {name}=224, or a pair (224, 320)")
    if isinstance(value, (int, float)) or hasattr(value, "__index__"):
        hw = (_as_int(value, name, value),) * 2
    else:
        try:
            items = list(value)
        except TypeError:
            raise WinposError(f"{name}={value!r} must be an int or a (height, width) pair; pass e.g. "
                              f"{name}=224") from None
        if len(items) != 2:
            raise WinposError(f"{name} must be an int or a (height, width) pair, got {value!r}")
        hw = tuple(_as_int(v, name, value) for v in items)
    if hw[0] <= 0 or hw[1] <= 0:
        raise WinposError(f"{name}={value!r} must be positive; an image or token grid of zero size has nothing "
                          "to embed")
    return hw
