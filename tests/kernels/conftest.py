"""Kernel tests run the Triton kernels under the CPU interpreter (or compiled, on a CUDA machine).

Triton fixes interpreter vs compiled mode once per process, when ``triton`` is first imported (its own
``tl.zeros``/``tl.sum`` are ``@triton.jit`` functions decorated then); ``winpos.kernels`` follows whatever mode
the process has (``winpos.kernels._jit``). So:

* If triton is not imported yet: on a machine without CUDA (or with ``WINPOS_TRITON_INTERPRET=1``) set
  ``TRITON_INTERPRET=1``, import triton, and put the variable back as it was, so it does not reach other test
  directories' subprocesses or later imports. On a CUDA machine nothing is set: the kernels are compiled and
  tested on the GPU.
* If something imported triton first in compiled mode and there is no GPU (e.g. ``pytest tests/posemb
  tests/kernels``: timm imports triton), the kernel tests cannot run in this process. Each of them then reports
  the outcome of the same test in one child ``pytest`` run with ``TRITON_INTERPRET=1`` (run once, on first use).

In a combined run where this file imported triton first, the rest of that process also has interpreted Triton
(harmless without a GPU: nothing else launches Triton kernels on CPU tensors).
"""
import functools
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
_CHILD_FLAG = "WINPOS_KERNEL_TESTS_CHILD"

if "triton" not in sys.modules and (os.environ.get("WINPOS_TRITON_INTERPRET") == "1" or not torch.cuda.is_available()):
    _previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton.language  # noqa: F401  (decorates triton's standard library in interpreter mode)
    finally:
        if _previous is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = _previous

from winpos.kernels import _jit  # noqa: E402

INTERPRETING = _jit.interpreting()
RUN_HERE = INTERPRETING or torch.cuda.is_available()


class _ChildRun:
    """One ``pytest`` child process (interpreter on) for all kernel tests; outcomes looked up per test."""

    def __init__(self, nodeids, rootdir: Path):
        self.nodeids, self.rootdir = nodeids, rootdir
        self.results = None

    def _run(self):
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "report.xml"
            env = dict(os.environ, TRITON_INTERPRET="1", **{_CHILD_FLAG: "1"})
            proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                   f"--junitxml={report}", *self.nodeids],
                                  cwd=self.rootdir, env=env, capture_output=True, text=True)
            self.results = {}
            if report.exists():
                for case in ET.parse(report).getroot().iter("testcase"):
                    bad = [c for c in case if c.tag in ("failure", "error", "skipped")]
                    key = (case.get("classname"), case.get("name"))
                    self.results[key] = (bad[0].tag, (bad[0].get("message") or "") + "\n" + (bad[0].text or "")) \
                        if bad else ("passed", "")
            self.tail = (proc.stdout + proc.stderr)[-4000:]

    def check(self, item):
        if self.results is None:
            self._run()
        path, _, name = item.nodeid.partition("::")
        key = (path[:-3].replace("/", "."), name)
        outcome, message = self.results.get(key, ("missing", f"not reported by the child run:\n{self.tail}"))
        if outcome != "passed":
            pytest.fail(f"[run in a TRITON_INTERPRET=1 child process] {outcome}: {message}", pytrace=False)


def pytest_collection_modifyitems(config, items):
    if RUN_HERE or os.environ.get(_CHILD_FLAG) == "1":
        return
    mine = [item for item in items if HERE in Path(str(item.path)).resolve().parents]
    if mine:
        child = _ChildRun([item.nodeid for item in mine], config.rootpath)
        for item in mine:
            item.runtest = functools.partial(child.check, item)
            item.winpos_delegated = True


@pytest.fixture
def device(request) -> str:
    if getattr(request.node, "winpos_delegated", False):
        return "delegated"  # the body runs in the child process; this value is never used
    if not RUN_HERE:
        pytest.fail("Triton is compiled in this process but there is no GPU; this test should have been delegated "
                    "to a TRITON_INTERPRET=1 child process")
    return "cpu" if INTERPRETING else "cuda"
