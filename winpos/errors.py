"""Shared validation helpers: every check raises a ``ValueError`` whose message names the problem and a fix."""
from __future__ import annotations

from typing import Iterable

import torch


def check_choice(name: str, value: str, choices: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``choices``, else raise a ValueError listing them."""
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"unknown {name}={value!r}; choose one of {', '.join(repr(c) for c in choices)}")
    return value


def check_finite(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """Raise if ``tensor`` holds NaN or inf (a corrupt or diverged embedding would otherwise spread silently)."""
    if not torch.isfinite(tensor).all():
        bad = int((~torch.isfinite(tensor)).sum())
        raise ValueError(
            f"{name} has {bad} non-finite values (NaN/inf); the checkpoint is corrupt or training diverged: "
            "reload the weights or re-initialize this embedding"
        )
    return tensor


def as_hw(value, name: str = "size") -> tuple[int, int]:
    """Normalize an int or a pair to ``(h, w)`` of positive ints."""
    if isinstance(value, int):
        hw = (value, value)
    else:
        hw = tuple(int(v) for v in value)
        if len(hw) != 2:
            raise ValueError(f"{name} must be an int or a (height, width) pair, got {value!r}")
    if hw[0] <= 0 or hw[1] <= 0:
        raise ValueError(f"{name}={value!r} must be positive; an image or token grid of zero size has nothing to embed")
    return hw
