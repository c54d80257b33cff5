"""Kernel tests run the Triton kernels under the CPU interpreter (or compiled, on a CUDA machine).

``tests/conftest.py`` imports triton first, before any test module, in the mode these tests need (interpreter on
a machine without CUDA or with ``WINPOS_TRITON_INTERPRET=1``); ``winpos.kernels`` follows whatever mode the
process has (``winpos.kernels._jit``), and ``device`` says where the kernels run.
"""
import pytest
import torch

from winpos.kernels import _jit

INTERPRETING = _jit.interpreting()
RUN_HERE = INTERPRETING or torch.cuda.is_available()


@pytest.fixture(autouse=True)
def _triton_can_run_here():
    if not RUN_HERE:
        pytest.fail("Triton was imported in compiled mode before tests/conftest.py could import it in interpreter "
                    "mode, and there is no GPU: run pytest itself (`python -m pytest tests`), not from a process "
                    "that already imported triton (or timm), or set TRITON_INTERPRET=1 for the whole run",
                    pytrace=False)


@pytest.fixture(scope="session")
def device() -> str:
    return "cpu" if INTERPRETING else "cuda"


@pytest.fixture(autouse=True)
def _kernels_without_their_self_check():
    """These tests compare the kernels themselves with the reference: the first-use self-check
    (``winpos.kernels.self_check``, on by default for CUDA tensors) would serve a broken signature by the reference
    and hide it. ``test_self_check.py`` turns it on where it is the subject."""
    from winpos.kernels import self_check

    saved = self_check._MODE
    self_check.set_self_check(False)
    yield
    self_check.set_self_check(saved)
