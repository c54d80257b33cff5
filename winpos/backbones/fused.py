"""Fused CPU inference steps of the transformer blocks: linear + GELU and linear + residual add in one pass.

On CPU a block's MLP writes its hidden activation (4x the channels, the largest tensor of the block) three times
unfused: the linear's output, then GELU's, then the residual sum. oneDNN's linear with a post-op
(``torch.ops.mkldnn._linear_pointwise``, the op inductor's CPU freezing passes use) applies GELU or the residual add
while the output tile is still in cache, and each fused step also skips the allocation (and first-touch page faults)
of one activation-sized tensor. HieraDet-B+ at 1024^2 spends a tenth of its forward there; see docs/benchmarks.md.

The fused path runs only where it computes the same function: CPU, fp32 or bf16 inputs of the weights' dtype, no
gradient recorded (the op has no autograd formula), no CPU autocast (autocast would not cast the op's inputs), not
while torch.compile or torch.jit traces (inductor fuses on its own; the op has no fake implementation and its
argument types are outside TorchScript's), and oneDNN present. Everywhere else the plain modules run.
``WINPOS_FUSED_LINEAR=0`` in the environment, or the context manager ``fused_linear(False)``, turns it off, for
instance to reproduce a peer's result bit for bit: the fused GELU matches ATen's exactly in our tests, the fused add
rounds once instead of twice and differs by about one ulp (relative 1e-6 on a feature map).
"""
from __future__ import annotations

import os
from contextlib import contextmanager

import torch
import torch.nn as nn

__all__ = ["fused_enabled", "fused_linear", "linear_add", "linear_gelu", "residual_add"]

_DTYPES = (torch.float32, torch.bfloat16)


def _available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


_AVAILABLE = _available()


def _fused_op():
    return torch.ops.mkldnn._linear_pointwise

_ENABLED = os.environ.get("WINPOS_FUSED_LINEAR", "1") != "0"


@contextmanager
def fused_linear(enabled: bool):
    """Inside the ``with`` block the fused path (and the in-place residual add) is on or off, process-wide."""
    global _ENABLED
    before, _ENABLED = _ENABLED, bool(enabled)
    try:
        yield
    finally:
        _ENABLED = before


def fused_enabled(x: torch.Tensor, linear: nn.Linear) -> bool:
    """Whether ``linear`` applied to ``x`` may take oneDNN's fused path (see the module docstring)."""
    if not (_AVAILABLE and _ENABLED) or x.device.type != "cpu":
        return False
    if x.dtype not in _DTYPES or linear.weight.dtype != x.dtype or linear.bias is None:
        return False
    if torch.is_autocast_enabled("cpu") or torch.compiler.is_compiling() or torch.jit.is_tracing():
        return False  # autocast would not cast the op's inputs; compilers fuse on their own; tracers lack the op
    return not (torch.is_grad_enabled() and (x.requires_grad or linear.weight.requires_grad
                                             or linear.bias.requires_grad))


def linear_gelu(x: torch.Tensor, linear: nn.Linear, act: nn.Module) -> torch.Tensor:
    """``act(linear(x))``; one oneDNN pass when ``act`` is the exact (erf) GELU and the fused path applies."""
    if isinstance(act, nn.GELU) and act.approximate == "none" and fused_enabled(x, linear):
        return _fused_op()(x, linear.weight, linear.bias, "gelu", [], "none")
    return act(linear(x))


def linear_add(x: torch.Tensor, linear: nn.Linear, residual: torch.Tensor) -> torch.Tensor:
    """``residual + linear(x)``: the residual added in the linear's output pass where the fused path applies."""
    if (fused_enabled(x, linear) and x.is_contiguous() and residual.dtype == x.dtype and residual.is_contiguous()
            and residual.shape == x.shape[:-1] + (linear.out_features,)):
        return _fused_op().binary(x, residual, linear.weight, linear.bias, "add")
    return residual + linear(x)


def residual_add(shortcut: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
    """``shortcut + branch``, accumulated into ``branch`` when no gradient is recorded and ``branch`` is a
    contiguous tensor of the result's shape and dtype (a block's fresh output), saving one activation-sized
    allocation per block. ``shortcut`` is never written: it may be a stage output the caller keeps."""
    if _ENABLED and (not torch.is_grad_enabled() or not (shortcut.requires_grad or branch.requires_grad)) \
            and branch.is_contiguous() and branch.shape == shortcut.shape and branch.dtype == shortcut.dtype \
            and not torch.compiler.is_compiling() and branch.data_ptr() != shortcut.data_ptr():
        return branch.add_(shortcut)
    return shortcut + branch

