"""The kernels' public surface: input validation, layout fallbacks, LookHere tile skipping, the custom-op
registrations (``torch.library.opcheck``), the ``winpos.attention`` dispatch, and a cheap GPU-free import."""
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.library import opcheck

from tests.kernels.helpers import DEVICE
from winpos.attention import PositionTerms, attention, reference_attention
from winpos.kernels import Plan, rope_grid, window_attention
from winpos.posemb.lookhere import LookHere
from winpos.posemb.rope import RoPE

ROOT = Path(__file__).resolve().parents[2]


def _qkv(H=8, W=8, heads=2, D=32, dtype=torch.float32, pool=1):
    q = torch.randn(1, H // pool, W // pool, heads, D, device=DEVICE, dtype=dtype)
    k = torch.randn(1, H, W, heads, D, device=DEVICE, dtype=dtype)
    return q, k, torch.randn_like(k)


@pytest.mark.parametrize("mutate,kwargs,match", [
    (lambda q, k, v: (q[0], k, v), {}, "token grid"),
    (lambda q, k, v: (q.double(), k.double(), v.double()), {}, "dtype"),
    (lambda q, k, v: (q, k, v[..., :16]), {}, "disagree"),
    (lambda q, k, v: (q[..., :8], k[..., :8], v[..., :8]), {}, "head_dim=8 is not supported"),
    (lambda q, k, v: (q, k.to("meta"), v), {}, "different devices"),
    (lambda q, k, v: (q[:, :, :6], k, v), {}, "pooled by one integer stride"),
    (lambda q, k, v: (q, k, v), {"window": 3}, "does not tile"),
    (lambda q, k, v: (q, k, v), {"window": 4, "pad_mode": "reflect"}, "pad_mode"),
    (lambda q, k, v: (q, k, v), {"valid_hw": (9, 8), "pad_mode": "mask"}, "inside the padded"),
    (lambda q, k, v: (q, k, v), {"blocks": (8, 16)}, "powers of two >= 16"),
    (lambda q, k, v: (q, k, v), {"window": 4, "pack": 3}, "power of two >= 1"),
    (lambda q, k, v: (q, k, v), {"window": 8, "blocks": (16, 16), "pack": 2}, "inside one 16 x 16 block"),
    (lambda q, k, v: (q, k, v), {"pos": PositionTerms(lookhere=LookHere(3, "45"))}, "built for 3 heads"),
    (lambda q, k, v: (q, k, v), {"pos": PositionTerms(rel_pos=(torch.zeros(15, 16), torch.zeros(15, 16)))},
     "head_dim=32"),
])
def test_bad_inputs_raise_value_errors(mutate, kwargs, match, device):
    q, k, v = mutate(*_qkv())
    with pytest.raises(ValueError, match=match):
        window_attention(q, k, v, **kwargs)


def test_rope_tables_for_another_window_are_rejected(device):
    class WrongWindow:
        def tables(self, q_hw, k_hw):
            return RoPE(32, 2).to(device).tables((4, 4), (4, 4))

    q, k, v = _qkv()
    with pytest.raises(ValueError, match="does not fit 64 window tokens"):
        window_attention(q, k, v, window=8, pos=PositionTerms(rope=WrongWindow()))


@pytest.mark.skipif(DEVICE != "cpu", reason="bf16 is rejected only by the CPU interpreter; GPUs run it")
def test_bf16_is_refused_by_the_interpreter(device):
    q, k, v = _qkv(dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="bfloat16 is not supported by the Triton CPU interpreter"):
        window_attention(q, k, v, window=4)


def test_head_dim_with_a_stride_falls_back_to_a_contiguous_copy(device):
    q, k, v = (t.transpose(-1, -2).contiguous().transpose(-1, -2) for t in _qkv(D=16, heads=16))
    assert q.stride(-1) != 1
    out = window_attention(q, k, v, window=4, blocks=(16, 16))
    ref = window_attention(q.contiguous(), k.contiguous(), v.contiguous(), window=4, blocks=(16, 16))
    torch.testing.assert_close(out, ref, atol=0, rtol=0)


def test_lookhere_tiles_are_skipped_from_the_class_table(device):
    """The kernels visit only tiles the class table marks non-empty: the exact table has empty tiles for a 45-degree
    layout, a table of all 'partial' gives the same result (the mask alone is exact), and an all-empty table
    leaves every query with nothing to attend to (output 0, zero gradients)."""
    lh = LookHere(4, "45").to(device)
    classes = lh.tile_classes((8, 8), (8, 8), 16, 16)
    assert (classes == 0).any() and (classes == 1).any()
    q, k, v = (t.requires_grad_() for t in _qkv(heads=4))
    exact = window_attention(q, k, v, pos=PositionTerms(lookhere=lh), blocks=(16, 16))

    def provider(table):
        return SimpleNamespace(fov=lh.fov, slopes=lh.slopes, tile_classes=lambda *args: table)

    dense = window_attention(q, k, v, pos=PositionTerms(lookhere=provider(torch.full_like(classes, 2))),
                             blocks=(16, 16))
    torch.testing.assert_close(exact, dense, atol=1e-6, rtol=1e-6)
    nothing = window_attention(q, k, v, pos=PositionTerms(lookhere=provider(torch.zeros_like(classes))),
                               blocks=(16, 16))
    assert nothing.abs().max() == 0
    grads = torch.autograd.grad(nothing, (q, k, v), torch.ones_like(nothing))
    assert all(g.abs().max() == 0 for g in grads)


def test_custom_ops_pass_opcheck(device):
    """The ops are the tracing primitives (schema, fake implementation); autograd is WindowAttentionFunction's and
    RopeGridFunction's alone, so the ops are checked on tensors that need no grad."""
    q, k, v = _qkv(H=4, W=4, heads=1, D=16)
    geom = Plan(1, 1, 4, 4, 4, 4, 1, 4, 4, 4, 4, 0, 0, 0, 16, 16).as_list()
    nones = (None,) * 8
    opcheck(torch.ops.winpos.window_attention_fwd.default, (q, k, v, *nones, geom, 0.25))
    out, lse = torch.ops.winpos.window_attention_fwd(q, k, v, *nones, geom, 0.25)
    opcheck(torch.ops.winpos.window_attention_bwd.default,
            (torch.randn_like(out), q, k, v, out, lse, *nones, geom, 0.25))
    t = RoPE(16, 1).to(device).tables((4, 4), (4, 4))
    opcheck(torch.ops.winpos.rope_grid.default, (q, t.cos_k, t.sin_k, t.rot_dims, True, 4, 4, False))


def test_one_autograd_path_traces_under_compile(device):
    """torch.compile (fullgraph, aot_eager: the autograd.Function and the custom ops traced, no code generation)
    gives the eager kernels' outputs and gradients, window attention with RoPE and the RoPE grid op alike."""
    q, k, v = (t.requires_grad_() for t in _qkv(H=8, W=8, heads=2, D=16))
    rope = RoPE(16, 2).to(device)
    pos = PositionTerms(rope=rope)

    def attend(q, k, v):
        return window_attention(q, k, v, window=4, pos=pos)

    def rotate(x):
        t = rope.tables((4, 4), (4, 4))
        return rope_grid(x, t.cos_k, t.sin_k, t.rot_dims, t.pairing, (4, 4))

    for fn, args in ((attend, (q, k, v)), (rotate, (q,))):
        out = fn(*args)
        torch._dynamo.reset()
        out_c = torch.compile(fn, fullgraph=True, backend="aot_eager")(*args)
        torch.testing.assert_close(out_c, out, atol=0, rtol=0)
        g = torch.randn_like(out)
        grads = torch.autograd.grad(out, args, g)
        grads_c = torch.autograd.grad(out_c, args, g)
        for a, b in zip(grads_c, grads):
            torch.testing.assert_close(a, b, atol=0, rtol=0)
    torch._dynamo.reset()


def test_winpos_attention_dispatches_to_the_kernels(device):
    q, k, v = _qkv(H=8, W=12, heads=2)
    pos = PositionTerms(rope=RoPE(32, 2), lookhere=LookHere(2, "90"))
    pos.rope.to(device)
    pos.lookhere.to(device)
    out = attention(q, k, v, window=4, pos=pos, backend="triton")
    ref = reference_attention(q, k, v, window=4, pos=pos)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_import_is_cheap_and_cpu_tensors_need_the_interpreter():
    """In a fresh process without TRITON_INTERPRET: importing winpos.kernels does not import triton, and a launch
    on CPU tensors (compiled Triton) is refused with a ValueError that names the fixes."""
    script = (
        "import sys, torch\n"
        "import winpos.kernels as K\n"
        "assert 'triton' not in sys.modules, 'import winpos.kernels pulled in triton'\n"
        "q = torch.randn(1, 4, 4, 1, 16)\n"
        "try:\n"
        "    K.window_attention(q, q, q)\n"
        "except ValueError as e:\n"
        "    print('REFUSED', e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if not torch.cuda.is_available():
        assert "REFUSED" in proc.stdout and "TRITON_INTERPRET=1" in proc.stdout, proc.stdout + proc.stderr[-2000:]


def test_without_triton_the_attention_entry_point_falls_back_to_the_reference():
    """No triton installed: winpos.kernels still imports, window_attention is not exported, and the auto backend
    of winpos.attention resolves to the reference (instead of failing at the first launch)."""
    script = (
        "import sys\n"
        "sys.modules['triton'] = None  # as if triton were not installed\n"
        "import torch\n"
        "import winpos.kernels as K\n"
        "assert not K.TRITON_INSTALLED\n"
        "try:\n"
        "    from winpos.kernels import window_attention\n"
        "    raise SystemExit('window_attention was exported without triton')\n"
        "except ImportError as e:\n"
        "    assert 'needs the `triton` package' in str(e)\n"
        "from winpos.attention import resolve_backend\n"
        "assert resolve_backend('auto', torch.device('cuda')) == 'reference'\n"
        "print('FALLBACK OK')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "WINPOS_ATTENTION_BACKEND"}
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "FALLBACK OK" in proc.stdout, proc.stdout + proc.stderr[-3000:]


def test_stride_unit_is_16_bytes_when_every_stride_allows_it():
    """Strides reach the kernels in 16-byte units (head dims that are multiples of 8 get 16-byte accesses); any
    stride that is not a multiple falls back to unit 1 for the whole launch."""
    from winpos.kernels.attention_fwd_bwd import stride_unit

    q, k, v = torch.zeros(1, 8, 8, 3, 2, 56, dtype=torch.float16).unbind(3)  # a qkv view, head_dim 56
    assert stride_unit(q, k, v) == 8
    assert stride_unit(torch.zeros(1, 8, 8, 2, 56)) == 4  # fp32: 4 elements
    assert stride_unit(torch.zeros(1, 8, 8, 2, 60, dtype=torch.float16)) == 1
    assert stride_unit(q, torch.zeros(1, 8, 8, 2, 60, dtype=torch.float16)[..., :56]) == 1


def test_the_launch_path_touches_no_environment_or_module_after_the_first_load(monkeypatch, device):
    """Once the kernel sources are loaded, a call neither writes os.environ nor re-imports or reloads modules
    (they used to run on every launch: host time, and not thread-safe next to data-loader threads). The
    interpreter still sets TRITON_INTERPRET around each launch, so there only the load is checked."""
    import importlib

    from winpos.kernels import _jit

    first = _jit.load("tl_attention")
    calls = []
    monkeypatch.setattr(os, "putenv", lambda *a: calls.append(("putenv", a)))
    monkeypatch.setattr(os, "unsetenv", lambda *a: calls.append(("unsetenv", a)))
    monkeypatch.setattr(importlib, "reload", lambda m: calls.append(("reload", m)))
    monkeypatch.setattr(importlib, "import_module", lambda *a: calls.append(("import", a)))
    assert _jit.load("tl_attention") is first and _jit.load("tl_rope") is not None
    if not _jit.interpreting():
        q, k, v = _qkv(dtype=torch.float16)
        window_attention(q, k, v, window=4).sum()
    assert calls == []


def test_auto_backend_sends_slow_or_refused_inputs_to_the_reference():
    """``winpos.attention`` with ``backend="auto"`` asks ``prefers_kernels`` on CUDA: fp32 (exact-fp32 FMA dots),
    fp64 and head dims outside 16..128 (refused) go to the reference; off CUDA the interpreter was chosen
    explicitly, so always the kernels."""
    from winpos.kernels.dispatch import fast_inputs, prefers_kernels

    assert fast_inputs(torch.bfloat16, 56, True) and fast_inputs(torch.float16, 128, True)
    assert not fast_inputs(torch.float32, 64, True) and not fast_inputs(torch.float64, 64, True)
    assert not fast_inputs(torch.float16, 8, True) and not fast_inputs(torch.float16, 256, True)
    assert not fast_inputs(torch.float16, 64, False)
    q = torch.zeros(1, 4, 4, 1, 16, dtype=torch.float64)
    assert prefers_kernels(q, q, q)


def test_resolve_backend_is_where_auto_asks_prefers_kernels(monkeypatch):
    """The backend is decided in one place: ``resolve_backend("auto", cuda, qkv)`` asks ``prefers_kernels`` about the
    projected q, k, v; without qkv (the backbone's windowing choice, before the projections) or when forced, it does
    not; off CUDA "auto" is the reference."""
    import winpos.kernels
    from winpos.attention import resolve_backend

    monkeypatch.delenv("WINPOS_ATTENTION_BACKEND", raising=False)
    cuda, q = torch.device("cuda"), torch.zeros(1, 4, 4, 1, 16)
    asked = []
    for verdict, want in ((False, "reference"), (True, "triton")):
        monkeypatch.setattr(winpos.kernels, "prefers_kernels", lambda *t, v=verdict: asked.append(len(t)) or v)
        assert resolve_backend("auto", cuda, (q, q, q)) == want
        assert resolve_backend("auto", cuda) == "triton"
        assert resolve_backend("triton", cuda, (q, q, q)) == "triton"
        assert resolve_backend("auto", torch.device("cpu"), (q, q, q)) == "reference"
    assert asked == [3, 3]


def test_tiles_follow_the_window_and_the_tuned_table_overrides_the_heuristic():
    """Default tiles are no larger than a window (16 x 16 for 4x4 windows, 16 x 64 for a pooled 8 -> 4 transition);
    small tiles take 2 warps; a TUNED entry (the GPU sweep's hook) replaces the heuristic and forgets cached
    launches; a malformed entry is refused."""
    from winpos.kernels import launch_config as A

    assert A.default_blocks(64) == (64, 64) and A.default_blocks(80) == (64, 32)
    assert A.default_blocks(56, 16, 16) == (16, 16) and A.default_blocks(56, 16, 64) == (16, 64)
    assert A.default_blocks(64, 49, 49) == (64, 64) and A.default_blocks(128, 196, 196) == (64, 32)
    # relpos: the query tile is never narrower than the key tile (a 16 x 64 one-hot dQ spills on sm_90a)
    assert A.default_blocks(56, 16, 64, relpos=True) == (64, 64)
    assert A.default_blocks(56, 16, 16, relpos=True) == (16, 16)  # then four windows per program
    assert A.default_blocks(80, 16, 64, relpos=True) == (32, 32)
    assert A.default_blocks(56, 49, 49, relpos=True) == (64, 64)
    # windows per program: fill the default tile when a window fits one block, up to the image's window count
    assert A.default_pack(56, (16, 16), 16, 16, 1024) == 4 and A.default_pack(80, (16, 16), 16, 16, 1024) == 2
    assert A.default_pack(56, (16, 16), 4, 16, 1024) == 4  # pooled 2x2 queries on 4x4 keys
    assert A.default_pack(56, (16, 64), 16, 64, 1024) == 1 and A.default_pack(56, (64, 64), 49, 49, 1024) == 1
    assert A.default_pack(56, (16, 16), 16, 16, 3) == 2 and A.default_pack(56, (16, 16), 16, 16, 1) == 1
    assert A.default_pack(56, (16, 16), 16, 32, 1024) == 1  # the key window does not fit its block
    args = dict(HAS_ROPE=False, HAS_REL=True, HAS_LH=False, BLOCK_M=16, BLOCK_N=16, BLOCK_D=64, REL_ROWS=False)
    assert A.launch_options(args, backward=False) == {"num_warps": 2, "num_stages": 2}
    big = dict(args, BLOCK_M=64, BLOCK_N=64)
    assert A.launch_options(big, backward=True) == {"num_warps": 8, "num_stages": 2}
    assert A.launch_key(big, True) == ("bwd", 64, 64, 64, ("rel",))
    rows = dict(big, REL_ROWS=True)  # row-aligned relpos: no one-hot operands, 4 warps (8 serialize on sm_90a)
    assert A.launch_options(rows, backward=True) == {"num_warps": 4, "num_stages": 2}
    assert A.launch_key(rows, True) == ("bwd", 64, 64, 64, ("rel", "rel_rows"))
    pooled = dict(big, BLOCK_M=16, HAS_REL=False, HAS_ROPE=True)  # the 16 x 64 pooled transition, RoPE
    assert A.launch_options(pooled, backward=True) == {"num_warps": 4, "num_stages": 2}
    wide_rope = dict(args, HAS_REL=False, HAS_ROPE=True, BLOCK_M=64, BLOCK_N=32, BLOCK_D=128)  # spills at 4 warps
    assert A.launch_options(wide_rope, backward=False) == {"num_warps": 8, "num_stages": 2}
    assert A.launch_options(dict(wide_rope, BLOCK_D=64), backward=False) == {"num_warps": 4, "num_stages": 2}
    A.STATIC["sentinel"] = 1
    try:
        A.set_tuned({("bwd", 64, 64, 64, ("rel",)): {"num_warps": 4, "num_stages": 3}})
        assert "sentinel" not in A.STATIC
        assert A.launch_options(big, backward=True) == {"num_warps": 4, "num_stages": 3}
        assert A.launch_options(big, backward=False) == {"num_warps": 4, "num_stages": 2}  # no entry: heuristic
        with pytest.raises(ValueError, match="num_warps"):
            A.set_tuned({("fwd", 64, 64, 64, ()): {"num_warps": 3, "num_stages": 2}})
        with pytest.raises(ValueError, match="tuned key"):
            A.set_tuned({("fwd", 64): {"num_warps": 4, "num_stages": 2}})
    finally:
        A.set_tuned({})
    assert A.TUNED == {}


def test_host_overhead_script_measures_every_row():
    """``tests/kernels/host_overhead.py`` (the host-microseconds table of docs/kernels.md) runs in compiled mode in
    a fresh process and reports every row with positive times (a few calls each: a smoke test, not a timing)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent / "host_overhead.py"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(script), "--json", "--reps", "3"], cwd=script.parents[2], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    want = {f"{t} {m}" for t in ("none", "rope", "relpos", "lookhere") for m in ("fwd", "fwd+bwd")}
    assert set(rows) == {"dispatch", "dispatch + triton binding"}
    for table in rows.values():
        assert set(table) == want | {"autograd floor fwd+bwd"}
        assert all(0 < r["p10"] <= r["median"] for r in table.values())


def test_the_old_interpreter_with_new_numpy_is_refused_with_the_fix(monkeypatch):
    """Triton < 3.7's interpreter fails every kernel loop on numpy >= 2.4: one clear error instead."""
    import numpy
    import triton

    from winpos.kernels import _jit

    monkeypatch.setattr(triton, "__version__", "3.6.0")
    monkeypatch.setattr(numpy, "__version__", "2.4.6")
    with pytest.raises(ValueError, match="install numpy<2.4 or triton>=3.7"):
        _jit.check_interpreter_numpy()
    monkeypatch.setattr(numpy, "__version__", "2.3.5")
    _jit.check_interpreter_numpy()
    monkeypatch.setattr(triton, "__version__", "3.8.0")
    monkeypatch.setattr(numpy, "__version__", "2.4.6")
    _jit.check_interpreter_numpy()
