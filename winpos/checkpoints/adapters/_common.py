"""Helpers the adapters share: container prefixes, flat absolute embeddings and abs-win pairs."""
from __future__ import annotations

import torch

from winpos.checkpoints.convert import Adapted, Position
from winpos.errors import WinposError
from winpos.posemb.interp import split_flat_embedding


def strip_prefix(adapted: Adapted, state_dict: dict, prefix: str, outside: str) -> dict[str, str]:
    """``{name inside the prefix: file key}``; when no key has ``prefix`` every key is inside (a bare trunk).

    Keys outside the prefix are reported with the reason ``outside`` and the prefix is recorded, so that a tensor
    under its own name inside the container counts as matched.
    """
    if not any(k.startswith(prefix) for k in state_dict):
        return {k: k for k in state_dict}
    adapted.prefix = prefix
    for k in state_dict:
        if not k.startswith(prefix):
            adapted.ignore(k, outside)
    return {k[len(prefix):]: k for k in state_dict if k.startswith(prefix)}


def flat_abs(key: str, value: torch.Tensor, has_cls: bool | None = None) -> Position:
    """``Position`` of a flat absolute embedding ``(1, [1+]N, C)`` stored under ``key`` (a cls row split off;
    ``has_cls`` None: detected from N)."""
    grid, cls = split_flat_embedding(value, key, has_cls=has_cls)
    return Position("abs", grid=grid, cls=cls, grid_key=key, stored_shape=tuple(value.shape))


def abswin_pair(found: dict[str, tuple[str, torch.Tensor]], antialias: bool) -> Position:
    """``Position`` of an abs-win pair found as ``{"global": (key, t), "window": (key, t)}``; both are required."""
    if "window" not in found or "global" not in found:
        have, lack = ("global", "window") if "global" in found else ("window", "global")
        raise WinposError(f"the checkpoint has the {have} part of an abs-win embedding ('{found[have][0]}') but no "
                          f"{lack} part; the file is incomplete")
    (gkey, g), (wkey, w) = found["global"], found["window"]
    return Position("abswin", global_embed=g, window_embed=w, global_key=gkey, window_key=wkey, antialias=antialias)
