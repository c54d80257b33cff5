"""Test-wide settings: Triton's mode, deterministic seeds, a hypothesis profile sized for CI, and oracle imports that
fail loudly.

Triton fixes interpreter vs compiled mode once per process, when ``triton`` is first imported (its own
``tl.zeros`` / ``tl.sum`` are ``@triton.jit`` functions decorated then), and test modules outside ``tests/kernels``
import it too (timm does). This file is loaded before any test module, so it makes that first import: in
interpreter mode on a machine without CUDA (or with ``WINPOS_TRITON_INTERPRET=1``), so the kernel tests run on the
CPU in the same process as every other test; compiled on a CUDA machine, where they run on the GPU. Nothing else
launches Triton kernels on CPU tensors (``torch.compile`` on CPU generates C++), so the rest of the suite runs the
same in either mode.
"""
import importlib
import importlib.util
import os
import sys

import pytest
import torch
from hypothesis import HealthCheck, settings


def _import_triton_in_the_mode_of_the_kernel_tests() -> None:
    if "triton" in sys.modules or importlib.util.find_spec("triton") is None:
        return
    if torch.cuda.is_available() and os.environ.get("WINPOS_TRITON_INTERPRET") != "1":
        return  # compiled: the first import, wherever it happens, picks it
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton.language  # noqa: F401  (decorates triton's standard library in interpreter mode)
    finally:  # the variable itself must not reach the subprocesses that some tests start
        if previous is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = previous


_import_triton_in_the_mode_of_the_kernel_tests()

settings.register_profile(
    "winpos", max_examples=int(os.environ.get("WINPOS_HYPOTHESIS_EXAMPLES", "25")), deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("winpos")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def require(module: str):
    """Import an oracle package; a missing oracle is a test failure with the fix, never a skip."""
    try:
        return importlib.import_module(module)
    except ImportError as e:  # pragma: no cover - only when the environment is broken
        pytest.fail(f"oracle package {module!r} is not importable ({e}); run `bash tools/setup_env.sh`")
