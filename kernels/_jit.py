"""Lazy, mode-consistent import of the Triton kernel sources.

Triton decides *once per process*, when ``triton`` is first imported, whether kernels are compiled or run by the
CPU interpreter (``TRITON_INTERPRET=1``): its own ``tl.zeros`` / ``tl.sum`` / ``tl.max`` are ``@triton.jit``
functions decorated at that moment. Our kernel modules must be decorated in the same mode, whatever the
environment variable says when they are imported later, so ``load`` reads the mode from triton's standard library
and forces it while our sources are imported. Nothing here runs at ``import winpos.kernels``: triton is imported
only when a kernel is first launched.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import threading

import torch
from torch.utils import _python_dispatch

_LOCK = threading.Lock()
_MODE = None  # interpreting(), once known (fixed for the process at the first ``import triton``)
_LOADED = {}  # source name -> module, after its first load: later calls touch no lock, environment or import
# Kernel sources in dependency order, and the kernels launched with ``kernel[grid](...)`` (the rest are helpers).
_SOURCES = ("tl_common", "tl_relpos", "tl_tiles", "tl_attention", "tl_rope")
_ENTRY_POINTS = {"attn_fwd", "attn_bwd_dq", "attn_bwd_dkdv", "rope_grid_kernel"}


def triton_available() -> bool:
    if _MODE is not None:
        return True
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def interpreting() -> bool:
    """Whether this process runs Triton in interpreter mode (fixed when triton was first imported)."""
    global _MODE
    if _MODE is None:
        import triton.language as tl
        from triton.runtime.interpreter import InterpretedFunction

        _MODE = isinstance(tl.zeros, InterpretedFunction)
    return _MODE


def _decorated_mode(module):
    """True/False if the module's jit functions are interpreted/compiled; None if it was already processed."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    if hasattr(module, "_winpos_interpreted"):
        return module._winpos_interpreted
    for value in vars(module).values():
        if isinstance(value, InterpretedFunction):
            return True
        if isinstance(value, JITFunction):
            return False
    return None


def _inline_helpers(module) -> None:
    """Interpreter only: call helper functions as plain (AST-rewritten) Python functions.

    An ``InterpretedFunction`` called from inside a kernel re-patches ``triton.language`` on every call (about
    2.5 ms each, a third of the interpreted run time here); the launch of the kernel has already patched it, so
    the rewritten function alone behaves the same.
    """
    from triton.runtime.interpreter import InterpretedFunction

    for name, value in list(vars(module).items()):
        if isinstance(value, InterpretedFunction) and name not in _ENTRY_POINTS:
            setattr(module, name, value.rewrite())


def load(name: str):
    """Import ``winpos.kernels.<name>`` with its ``@triton.jit`` functions in the process's Triton mode."""
    module = _LOADED.get(name)
    if module is not None:
        return module
    if name not in _SOURCES:
        raise ValueError(f"unknown kernel source {name!r}; expected one of {_SOURCES}")
    mode = interpreting()
    if mode:
        check_interpreter_numpy()
    with _LOCK:
        old = os.environ.get("TRITON_INTERPRET")
        os.environ["TRITON_INTERPRET"] = "1" if mode else "0"
        try:
            modules = [importlib.import_module(f"{__package__}.{src}") for src in _SOURCES]
            if any(_decorated_mode(m) != mode for m in modules):
                # Imported earlier in the other mode (directly, not through here): re-decorate, dependencies first.
                for m in modules:
                    m.__dict__.pop("_winpos_interpreted", None)
                modules = [importlib.reload(m) for m in modules]
            for m in modules:
                if not hasattr(m, "_winpos_interpreted"):
                    if mode:
                        _inline_helpers(m)
                    m._winpos_interpreted = mode
        finally:
            if old is None:
                os.environ.pop("TRITON_INTERPRET", None)
            else:
                os.environ["TRITON_INTERPRET"] = old
        _LOADED.update(zip(_SOURCES, modules))
    return modules[_SOURCES.index(name)]


def check_interpreter_numpy() -> None:
    """Triton's interpreter before 3.7 turns loop bounds into ints with ``int(array)`` on one-element arrays, an
    error since numpy 2.4 (every kernel loop would fail with "only 0-dimensional arrays can be converted"): refuse
    that pair with the fix. Compiled kernels (GPUs) are not affected."""
    import numpy
    import triton

    version = lambda v: tuple(int(x) for x in v.split("+")[0].split(".")[:2])
    if version(triton.__version__) < (3, 7) and version(numpy.__version__) >= (2, 4):
        raise ValueError(f"the Triton {triton.__version__} CPU interpreter cannot run with numpy {numpy.__version__}"
                         " (loop bounds fail on numpy >= 2.4); install numpy<2.4 or triton>=3.7 for TRITON_INTERPRET=1")


def launch(kernel, grid, **kwargs) -> None:
    """``kernel[grid](**kwargs)``.

    Under the interpreter, for the duration of the launch: ``TRITON_INTERPRET=1`` is set (triton modules imported
    lazily during a launch check it and must agree with the process's mode, even if the variable was only set
    around the first ``import triton``), and integer-overflow sanitizing is off (it re-checks every int32 add/mul
    in numpy, about 40% of the interpreted time; our large offsets are int64 anyway).
    """
    if not interpreting():
        kernel[grid](**kwargs)
        return
    import dataclasses

    from triton.runtime.interpreter import interpreter_builder

    with _LOCK:
        saved, old = interpreter_builder.options, os.environ.get("TRITON_INTERPRET")
        interpreter_builder.options = dataclasses.replace(saved, sanitize_overflow=False)
        os.environ["TRITON_INTERPRET"] = "1"
        try:
            kernel[grid](**kwargs)
        finally:
            interpreter_builder.options = saved
            if old is None:
                os.environ.pop("TRITON_INTERPRET", None)
            else:
                os.environ["TRITON_INTERPRET"] = old


def on_device(t: torch.Tensor):
    """A device guard for a launch on ``t``: Triton launches on the *current* CUDA device and its stream, so a
    tensor on cuda:1 while cuda:0 is current would be read by a kernel on the wrong device (an illegal address) or
    ordered on the wrong stream. A no-op off CUDA."""
    return torch.cuda.device(t.device) if t.device.type == "cuda" else contextlib.nullcontext()


# Test hook: a deliberately broken kernel. ``WINPOS_KERNEL_FAULT=<kernel>[,<kernel>...]`` (read at import; or set
# ``FAULTS``) perturbs the named kernels' outputs after each launch ("fwd": the forward's output, "dq", "dkdv": the
# backward's dq / dk, "rope": the standalone RoPE kernel's), so the self-check, the tests and the GPU check can be
# shown to catch a wrong kernel. Empty, the default, costs one set lookup per launch.
FAULT_KERNELS = ("fwd", "dq", "dkdv", "rope")
FAULTS = frozenset(k.strip() for k in os.environ.get("WINPOS_KERNEL_FAULT", "").split(",") if k.strip())
if FAULTS - set(FAULT_KERNELS):
    raise ValueError(f"WINPOS_KERNEL_FAULT={os.environ['WINPOS_KERNEL_FAULT']!r} names unknown kernels "
                     f"{sorted(FAULTS - set(FAULT_KERNELS))}; choose from {', '.join(FAULT_KERNELS)} or unset it")


def fault(kernel: str, out: torch.Tensor) -> None:
    """Perturb ``out`` in place when ``kernel`` is in ``FAULTS`` (the test hook above)."""
    if FAULTS and kernel in FAULTS:
        out.add_(0.25)


def eager(t: torch.Tensor) -> bool:
    """Whether a call on ``t`` may launch directly instead of through its custom op: plain tensors, no tracing
    (torch.compile, make_fx, fake or functional modes need the op and its fake implementation). The op's
    dispatch costs more host time than the rest of the call."""
    return (type(t) is torch.Tensor and not torch.compiler.is_compiling()
            and _python_dispatch._get_current_dispatch_mode() is None)


def check_launchable(*tensors: torch.Tensor) -> bool:
    """Raise unless the kernels can run on these tensors; return whether they run interpreted."""
    if not triton_available():
        raise ValueError("winpos.kernels needs the `triton` package; install it (pip install triton) or use "
                         "backend='reference'")
    mode = interpreting()
    for t in tensors:
        if t is None:
            continue
        if not mode and t.device.type != "cuda":
            raise ValueError(
                f"the Triton kernels need CUDA tensors, got a tensor on {t.device}; move the inputs to a GPU, use "
                "backend='reference', or set TRITON_INTERPRET=1 before triton is first imported (CPU interpreter, "
                "slow: for tests)"
            )
        if mode and t.dtype == torch.bfloat16:
            raise ValueError(
                "bfloat16 is not supported by the Triton CPU interpreter (it computes on the raw bits); use float16 "
                "or float32 under TRITON_INTERPRET=1, bfloat16 on a GPU"
            )
    return mode
