"""The kernels check themselves before serving a launch signature for the first time in a process.

A launch signature is what selects a compiled kernel: dtype, head dim, query / key window (the grid for global
attention), query pooling, windows per program, the padding mask, the position terms (RoPE's rotated dims and
pairing, relpos, LookHere) and the tile shape. The first eager call of a signature runs a small problem of that
signature (batch 1, a few windows, the caller's heads and position modules, random inputs) through the kernels and
through the reference attention, forward and backward (out, dq, dk, dv; max error against ``TOL[dtype] * (1 +
|reference|)``; the forward alone under ``torch.inference_mode``, where nothing can record gradients). Within
tolerance, the kernels serve the signature from then on. Out of tolerance, or when the kernels raise, winpos warns
once (``KernelSelfCheckWarning``, naming the signature and how to report it) and every later call of that signature
is served by the reference: correct, slower.

Switch: ``WINPOS_KERNEL_SELF_CHECK=0`` (off) / ``1`` (on, the CPU interpreter included), read at import, or
``set_self_check(False / True / None)``; unset / None: on for CUDA tensors only. ``self_check_report()`` lists
what was checked and what fell back. The check is skipped (nothing recorded) while ``torch.compile`` traces, while
a CUDA graph is captured, and until ``winpos.attention`` has registered its reference (``set_reference``: this
package sits below ``winpos.attention`` and imports nothing from it).
"""
from __future__ import annotations

import os
import time
import warnings
from typing import Callable, NamedTuple, Optional

import torch

__all__ = ["KernelSelfCheckWarning", "Signature", "TOL", "self_check_report", "set_reference", "set_self_check"]

ENV = "WINPOS_KERNEL_SELF_CHECK"
TOL = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 4e-2}  # as the kernel tests (tests/kernels)
REPORT_HOW = ("report it on the winpos issue tracker with this message, the GPU, torch and triton versions and "
              "the output of `python tools/gpu_check.py OUT_DIR`")


class KernelSelfCheckWarning(UserWarning):
    """A launch signature failed the first-use self-check and is served by the reference attention."""


class Signature(NamedTuple):
    device: str
    dtype: str
    head_dim: int
    q_window: tuple
    k_window: tuple
    is_global: bool
    pool: int
    pack: int
    pad_mask: bool
    rope: str  # "", or "rot<dims>/<half|interleaved>"
    relpos: bool
    lookhere: bool
    blocks: tuple

    def __str__(self) -> str:
        terms = [t for t, on in ((self.rope, bool(self.rope)), ("relpos", self.relpos),
                                 ("lookhere", self.lookhere)) if on] or ["no terms"]
        where = "global" if self.is_global else f"window {self.k_window[0]}x{self.k_window[1]}"
        return (f"{self.device} {self.dtype} head_dim {self.head_dim} {where} (queries "
                f"{self.q_window[0]}x{self.q_window[1]}, pool {self.pool}), pack {self.pack}, "
                f"{'pad mask' if self.pad_mask else 'no pad mask'}, {' + '.join(terms)}, "
                f"blocks {self.blocks[0]}x{self.blocks[1]}")


class Verdict(NamedTuple):
    ok: bool
    errors: dict  # tensor name -> max |kernel - reference| / (1 + |reference|)
    tolerance: float
    seconds: float
    failure: str  # "" or why it failed


_REFERENCE: Optional[Callable] = None
_MODE: Optional[bool] = {"0": False, "1": True}.get(os.environ.get(ENV, "").strip())
if os.environ.get(ENV, "").strip() not in ("", "0", "1"):
    raise ValueError(f"{ENV}={os.environ[ENV]!r} must be 0 (off) or 1 (on everywhere); unset it for the default "
                     "(on for CUDA tensors)")
RESULTS: dict = {}  # signature -> Verdict


def set_reference(fn: Callable) -> None:
    """The reference attention the check compares with (``winpos.attention.reference_attention``'s signature)."""
    global _REFERENCE
    _REFERENCE = fn


def set_self_check(enabled: Optional[bool]) -> None:
    """True: check every signature (the CPU interpreter too); False: never; None: on for CUDA tensors only."""
    global _MODE
    if enabled not in (True, False, None):
        raise ValueError(f"set_self_check({enabled!r}): pass True, False or None (on for CUDA only)")
    _MODE = enabled


def enabled(t: torch.Tensor) -> bool:
    """Whether calls on ``t`` are checked (cheap: on the per-call path)."""
    return t.is_cuda if _MODE is None else _MODE


def self_check_report() -> dict:
    """What was checked in this process: ``{"mode", "checked": [{signature, ok, errors, tolerance, seconds,
    failure}], "fell_back": [signature]}``."""
    checked = [dict(signature=str(sig), ok=v.ok, errors=v.errors, tolerance=v.tolerance, seconds=v.seconds,
                    failure=v.failure) for sig, v in RESULTS.items()]
    return {"mode": {None: "cuda only", True: "on", False: "off"}[_MODE], "checked": checked,
            "fell_back": [c["signature"] for c in checked if not c["ok"]]}


def reset() -> None:
    """Forget every verdict (tests)."""
    RESULTS.clear()


def reference():
    return _REFERENCE


def should_check(q: torch.Tensor) -> bool:
    """A first call may be checked now: a reference is registered, nothing traces, no CUDA graph is captured."""
    if _REFERENCE is None or torch.compiler.is_compiling():
        return False
    return not (q.is_cuda and torch.cuda.is_current_stream_capturing())


def _problem(q, k, window, valid_hw, pad_mode, geometry, generator):
    """Small inputs of the same signature: batch 1, up to 2 x max(2, pack) windows (the whole grid when global),
    the padding of the last window kept."""
    n_wh, n_ww, q_win, k_win, pool, (pad_mask, _, _, kvh, kvw), _, pack = geometry
    Hk, Wk = k.shape[1:3]
    if window:
        rows, cols = min(n_wh, 2), min(n_ww, max(2, pack))
        grid = (rows * k_win[0], cols * k_win[1])
    else:
        grid = (Hk, Wk)
    small_valid = None
    if pad_mask:
        small_valid = (max(1, grid[0] - (Hk - kvh)), max(1, grid[1] - (Wk - kvw)))
    heads, D = q.shape[3:]

    def rnd(*shape):
        return torch.randn(*shape, generator=generator, device="cpu").to(device=q.device, dtype=q.dtype)

    qs = rnd(1, grid[0] // pool, grid[1] // pool, heads, D)
    ks, vs = rnd(1, *grid, heads, D), rnd(1, *grid, heads, D)
    return qs, ks, vs, dict(window=window, valid_hw=small_valid, pad_mode=pad_mode if pad_mask else "zeros")


def run(sig: Signature, q, k, window, pos, valid_hw, pad_mode, scale, geometry, fused: Callable) -> Verdict:
    """Check ``sig`` on a small problem (see the module docstring), record and return the verdict, warn once
    when it fails. ``fused(q, k, v, **kwargs)``: the kernels without this check."""
    start = time.perf_counter()
    tol = TOL[q.dtype]
    errors, failure = {}, ""
    blocks, pack = geometry[6], geometry[7]
    qs, ks, vs, kw = _problem(q, k, window, valid_hw, pad_mode, geometry, torch.Generator().manual_seed(0))
    ref_dtype = torch.float64 if q.dtype == torch.float32 else torch.float32
    # Under torch.inference_mode nothing can record autograd (the position tables it built are inference tensors):
    # the forward alone is checked there.
    backward = not torch.is_inference_mode_enabled()
    try:
        with torch.set_grad_enabled(backward), torch.autocast(q.device.type, enabled=False):
            leaves = [t.requires_grad_(backward) for t in (qs, ks, vs)]
            out = fused(*leaves, pos=pos, scale=scale, blocks=blocks, pack=pack, **kw)
            ref_leaves = [t.detach().to(ref_dtype).requires_grad_(backward) for t in (qs, ks, vs)]
            ref = _REFERENCE(*ref_leaves, pos=pos, scale=scale, **kw)
            got, want = [out], [ref]
            if backward:
                g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
                got += torch.autograd.grad(out, leaves, g)
                want += torch.autograd.grad(ref, ref_leaves, g.to(ref_dtype))
        for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
            a, b = a.detach().to(ref_dtype), b.detach()
            err = ((a - b).abs() / (1 + b.abs())).nan_to_num(nan=float("inf")).max().item()
            errors[name] = err
            if not err <= tol:
                failure = failure or f"{name} off by {err:.3g} (tolerance {tol:g})"
    except Exception as e:  # a kernel that does not compile or launch for this signature: the reference serves it
        failure = f"the kernels raised {type(e).__name__}: {str(e)[:300]}"
    verdict = Verdict(not failure, errors, tol, time.perf_counter() - start, failure)
    RESULTS[sig] = verdict
    if failure:
        warnings.warn(f"winpos.kernels: the fused kernels failed their first-use self-check for [{sig}]: {failure}; "
                      f"this signature is served by the reference attention from now on (correct, slower). Please "
                      f"{REPORT_HOW}. {ENV}=0 turns the check off.", KernelSelfCheckWarning, stacklevel=4)
    return verdict
