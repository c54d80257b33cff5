"""The reference path's reused CPU mask buffer: one per thread and dtype, at most ``RELPOS_CHUNK_BYTES`` each.

A fresh allocation this large is mmap'ed and page-faulted on every call; writing each block of the bias into one
reused buffer avoids that (docs/benchmarks.md has the measurement). ``release_workspace`` frees this thread's
buffers. On CUDA the caching allocator already reuses memory, so a plain allocation is returned.
"""
from __future__ import annotations

import threading

import torch

__all__ = ["mask_buffer", "release_workspace"]

_WORKSPACE = threading.local()


def mask_buffer(numel: int, dtype, device) -> torch.Tensor:
    """A 1-D tensor of ``numel`` elements to write a mask block into (its contents are garbage)."""
    if device.type != "cpu":
        return torch.empty(numel, dtype=dtype, device=device)
    buffers = _WORKSPACE.__dict__.setdefault("buffers", {})
    buf = buffers.get(dtype)
    if buf is None or buf.numel() < numel:
        buffers[dtype] = None  # free the old buffer before allocating the larger one
        buf = buffers[dtype] = torch.empty(numel, dtype=dtype, device=device)
    return buf[:numel]


def release_workspace() -> None:
    """Free this thread's reused CPU mask buffers."""
    _WORKSPACE.__dict__.pop("buffers", None)
