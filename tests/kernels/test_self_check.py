"""The kernels' first-use self-check (``winpos.kernels.self_check``), under the interpreter with a kernel broken on
purpose (``_jit.FAULTS``, the test hook behind ``WINPOS_KERNEL_FAULT``): the broken signature falls back to the
reference with one warning and the answer stays right; healthy kernels pass and serve; the switch turns it off.
Oracle: ``winpos.attention.reference_attention``."""
import os
import subprocess
import sys
import warnings

import pytest
import torch

from tests.kernels.helpers import DEVICE
from winpos.attention import PositionTerms, reference_attention
from winpos.kernels import (KernelSelfCheckWarning, _jit, self_check, self_check_report, set_self_check,
                            window_attention)
from winpos.posemb.relpos import RelPosTables
from winpos.posemb.rope import RoPE


@pytest.fixture
def checked(monkeypatch):
    """The check on (the kernel tests' conftest turns it off), a clean record, the reference registered."""
    set_self_check(True)
    self_check.set_reference(reference_attention)
    self_check.reset()
    yield
    self_check.reset()


def _call(q, k, v, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = window_attention(q, k, v, **kwargs)
    return out, [w for w in caught if issubclass(w.category, KernelSelfCheckWarning)]


def _qkv(H=8, W=8, heads=2, D=32):
    return [torch.randn(1, H, W, heads, D, device=DEVICE, requires_grad=True) for _ in range(3)]


@pytest.mark.parametrize("broken,rope", [("fwd", False), ("dq", False), ("fwd", True)])
def test_a_broken_kernel_falls_back_with_one_warning_and_stays_right(broken, rope, checked, monkeypatch, device):
    """With RoPE and relpos, q and k are rotated before the kernels: the fallback must get the caller's."""
    monkeypatch.setattr(_jit, "FAULTS", frozenset({broken}))
    rel_pos = RelPosTables(32, 4, zero_init=False).to(DEVICE).tables()
    kwargs = dict(window=4, pos=PositionTerms(rel_pos=rel_pos, rope=RoPE(32, 2).to(DEVICE) if rope else None))
    q, k, v = _qkv()
    out, warned = _call(q, k, v, **kwargs)
    assert len(warned) == 1, warned
    message = str(warned[0].message)
    assert "float32 head_dim 32 window 4x4" in message and "relpos" in message and "report it" in message
    assert f"{'out' if broken == 'fwd' else 'dq'} off by" in message
    again, warned_again = _call(q, k, v, **kwargs)  # the same signature: served by the reference, no new warning
    assert warned_again == []
    grads = torch.autograd.grad((out * again).sum(), (q, k, v))
    ref_leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    ref = reference_attention(*ref_leaves, **kwargs)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)
    for got, want in zip(grads, torch.autograd.grad((ref * ref).sum(), ref_leaves)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    report = self_check_report()
    assert len(report["checked"]) == 1 and report["fell_back"] == [report["checked"][0]["signature"]]
    assert report["checked"][0]["errors"]["out" if broken == "fwd" else "dq"] > 0.1


def test_healthy_kernels_pass_and_serve_every_signature_once(checked, monkeypatch, device):
    calls = []
    real = self_check.run
    monkeypatch.setattr(self_check, "run", lambda *a, **kw: calls.append(a[0]) or real(*a, **kw))
    q, k, v = _qkv()
    out, warned = _call(q, k, v, window=4)
    _call(q, k, v, window=4)
    pooled, _ = _call(q.detach()[:, ::2, ::2].contiguous(), k, v, window=4)
    assert warned == [] and len(calls) == 2  # two signatures (plain, pooled), each checked once
    assert calls[1].pool == 2 and calls[0].pool == 1
    report = self_check_report()
    assert report["fell_back"] == [] and [c["ok"] for c in report["checked"]] == [True, True]
    assert all(c["seconds"] > 0 and max(c["errors"].values()) < 1e-4 for c in report["checked"])
    set_self_check(False)
    torch.testing.assert_close(out, window_attention(q, k, v, window=4), atol=0, rtol=0)  # the kernels' own answer


def test_the_switch_turns_the_check_off(checked, monkeypatch, device):
    monkeypatch.setattr(_jit, "FAULTS", frozenset({"fwd"}))
    set_self_check(False)
    q, k, v = _qkv()
    out, warned = _call(q, k, v, window=4)
    assert warned == [] and self_check_report()["checked"] == [] and self_check_report()["mode"] == "off"
    ref = reference_attention(q, k, v, window=4)
    assert (out - ref).abs().max() > 0.2  # unchecked, the broken kernel is served
    set_self_check(None)  # the default: CUDA tensors only
    assert self_check.enabled(q) is (q.device.type == "cuda")
    with pytest.raises(ValueError, match="True, False or None"):
        set_self_check("yes")


def test_the_environment_switch_is_read_at_import_and_validated():
    env = dict(os.environ, WINPOS_KERNEL_SELF_CHECK="0", OMP_NUM_THREADS="1")
    code = "from winpos.kernels import self_check_report; print(self_check_report()['mode'])"
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.stdout.strip() == "off", res.stderr
    res = subprocess.run([sys.executable, "-c", code], env=dict(env, WINPOS_KERNEL_SELF_CHECK="maybe"),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and "WINPOS_KERNEL_SELF_CHECK='maybe' must be 0 (off) or 1" in res.stderr


def test_under_inference_mode_the_forward_is_checked(checked, monkeypatch, device):
    """``torch.inference_mode`` allows no autograd: the check compares the forward alone, still catches a broken
    forward kernel, and passes healthy ones without a false alarm."""
    q, k, v = (t.detach() for t in _qkv())
    with torch.inference_mode():
        out, warned = _call(q, k, v, window=4)
    assert warned == [] and list(self_check_report()["checked"][0]["errors"]) == ["out"]
    monkeypatch.setattr(_jit, "FAULTS", frozenset({"fwd"}))
    with torch.inference_mode():
        broken, warned = _call(q, k, v, window=8)
    assert len(warned) == 1 and "out off by" in str(warned[0].message)
    torch.testing.assert_close(broken, reference_attention(q, k, v, window=8), atol=1e-6, rtol=1e-6)


def test_nothing_is_checked_while_torch_compile_traces(checked, device):
    """Tracing sees fake tensors: the check runs at the first eager call of a signature (a compiled model's eager
    warm-up), never inside a trace, where it would be a graph break and a host sync."""
    q, k, v = (t.detach() for t in _qkv())
    torch._dynamo.reset()
    fn = torch.compile(lambda q, k, v: window_attention(q, k, v, window=4), backend="eager")
    fn(q, k, v)
    assert self_check_report()["checked"] == []
    window_attention(q, k, v, window=4)  # eager: checked now
    assert [c["ok"] for c in self_check_report()["checked"]] == [True]
    torch._dynamo.reset()
