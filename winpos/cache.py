"""The one cache of winpos for values that depend on the token grid (interpolated embeddings, RoPE tables, LookHere
biases and tile classes).

One invalidation rule: an entry is keyed by the caller's key (grids, sizes) and by a fingerprint of every tensor it
is computed from (device, dtype, storage pointer and in-place version counter). Editing such a tensor in place,
loading a state dict into it, moving or casting the module all change the fingerprint, so a stale value is never
returned; nothing has to be cleared by hand. Nothing is cached, the value is simply computed, while autograd records
through one of those tensors (the value must carry the gradient) or while ``torch.compile`` or ``torch.jit.trace``
(``torch.onnx.export``, TorchScript) traces: the graph computes it from the parameters instead of holding one grid's
value, maybe left by an eager call, as a constant. Cached values never carry autograd history: tensors are stored detached.

Each cache is bounded (least recently used entry evicted first) and frees the entry it evicts before building the
new one, so a cache of size 1 never holds two large biases at once.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable

import torch

from winpos.errors import WinposError

__all__ = ["GridCache", "fingerprint"]

_MISSING = object()


def fingerprint(t: torch.Tensor) -> tuple:
    """What identifies a tensor's current contents: device, dtype, storage pointer and in-place version."""
    return t.device, t.dtype, t.data_ptr(), t._version


def _detached(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach() if value.requires_grad else value
    if isinstance(value, tuple):
        parts = [_detached(v) for v in value]
        return type(value)(*parts) if hasattr(value, "_fields") else tuple(parts)
    return value


class GridCache:
    """A bounded least-recently-used cache of per-grid values (see the module docstring for the rule).

    Args:
        size: entries kept (>= 1).
    """

    def __init__(self, size: int = 1):
        if not isinstance(size, int) or size < 1:
            raise WinposError(f"GridCache size={size!r} must be an int >= 1")
        self.size = size
        self._entries: OrderedDict[tuple, Any] = OrderedDict()

    def get(self, key: tuple, build: Callable[[], Any], *sources: torch.Tensor) -> Any:
        """``build()``, cached under ``key`` and the fingerprints of ``sources`` (the tensors it reads).

        On the per-call path of attention (position inputs of every call), so written for a hit in about a
        microsecond: one lookup, fingerprints inline."""
        if torch.compiler.is_compiling() or torch.jit.is_tracing():
            return build()
        if torch.is_grad_enabled():
            for s in sources:
                if s.requires_grad:
                    return build()
        full = (key, *[(s.device, s.dtype, s.data_ptr(), s._version) for s in sources])  # fingerprint(s)
        value = self._entries.get(full, _MISSING)
        if value is not _MISSING:
            self._entries.move_to_end(full)
            return value
        while len(self._entries) >= self.size:
            self._entries.popitem(last=False)  # free before building: a large value is never held twice
        value = self._entries[full] = _detached(build())
        return value

    def clear(self) -> None:
        """Drop every entry (frees memory; never needed for correctness)."""
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
