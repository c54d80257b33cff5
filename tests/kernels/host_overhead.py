"""Host (Python) microseconds per ``window_attention`` call, no GPU needed: ``python tests/kernels/host_overhead.py``.

What it measures: everything the dispatch path does on the host for one call, from ``window_attention(...)`` to
the kernel launch, plus Triton's own argument binding (the specialization and cache key that
``JITFunction.run`` computes on every launch); it excludes the compiled launcher's C call and the CUDA driver
(a few microseconds on a GPU machine) and, since the tensors are small CPU tensors, any device time of the few
tensor ops the path makes (allocations of out/lse/dq/dk/dv, delta, relpos terms). Runs in compiled mode (no
``TRITON_INTERPRET``) with ``_jit.launch`` replaced by the binder-only stub (which also zero-fills the kernel's
outputs, a microsecond or two each, as if the kernel had written them) and CPU tensors accepted.

Two tables: "dispatch" (the launch a no-op: winpos's own host path) and "dispatch + triton binding". Rows:
forward (no grad) and forward + backward (``torch.autograd.grad``: the engine, no gradient accumulation) per
position term, on a small shape (batch 1, 16x16 grid, 8x8 windows, 2 heads of 64) in fp32, so that the CPU's own arithmetic in those tensor ops stays negligible (the path
is the same for every dtype). 10th percentile and median of 300 calls after a warm-up (the 10th percentile is
the steadier number on a busy machine). A last row, "autograd floor", times the same ``torch.autograd.grad`` call
through an autograd.Function that only allocates its output and gradients: PyTorch's share of every fwd+bwd row.
Prints JSON with ``--json``; ``--reps N`` calls per row (default 300).
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _stub_launch(bind: bool = True):
    """A launch that binds the arguments exactly as ``JITFunction.run`` does (``bind``), then returns (no kernel
    run)."""
    from triton.runtime.jit import compute_cache_key

    from tests.kernels.aot_compile import _binder

    binders, key_caches = {}, {}

    def launch(kernel, grid, **kwargs):
        if not bind:
            pass
        elif kernel not in binders:
            binders[kernel], key_caches[kernel] = _binder(kernel)[1], {}
        if bind:
            bound, specialization, options = binders[kernel](**kwargs, debug=False, instrumentation_mode="")
            compute_cache_key(key_caches[kernel], specialization, options)
        for name in _OUTPUTS[kernel.__name__]:  # as if the kernel had written them (uninitialized memory makes
            if kwargs[name] is not kwargs["LSE"] or name == "LSE":  # later CPU ops slow); inputs are left alone
                kwargs[name].zero_()
    return launch


# What each kernel writes (DREL points at LSE, an input there, when there is no relpos).
_OUTPUTS = {"attn_fwd": ("O", "LSE"), "attn_bwd_dq": ("DELTA", "DQ", "DREL"), "attn_bwd_dkdv": ("DK", "DV")}


def measure(reps: int = 300, bind: bool = True) -> dict:
    import torch

    from tests.kernels.aot_compile import Shape, position_terms
    from winpos.kernels import _jit, window_attention

    torch.set_num_threads(1)  # no intra-op thread hand-offs: small CPU ops stay microseconds on a busy machine
    _jit.launch, _jit.check_launchable = _stub_launch(bind), (lambda *t: False)
    shape = Shape("toy", "w8", (16, 16), 2, 64, window=8)
    rows = {}
    for term in ("none", "rope", "relpos", "lookhere"):
        pos = position_terms(shape, term)
        qkv = torch.randn(1, 16, 16, 3, 2, 64, dtype=torch.float32)
        q, k, v = (t.requires_grad_() for t in qkv.unbind(3))
        do = torch.randn(1, 16, 16, 2, 64, dtype=torch.float32)

        def fwd():
            with torch.no_grad():
                window_attention(q, k, v, window=8, pos=pos)

        def fwd_bwd():
            torch.autograd.grad(window_attention(q, k, v, window=8, pos=pos), (q, k, v), do)  # no accumulation

        for name, fn in (("fwd", fwd), ("fwd+bwd", fwd_bwd)):
            rows[f"{term} {name}"] = _time_us(fn, reps)
    rows["autograd floor fwd+bwd"] = _autograd_floor(reps, q, k, v, do)
    return rows


def _time_us(fn, reps: int) -> dict:
    """10th percentile and median of ``reps`` calls after 20 warm-up calls, in microseconds."""
    for _ in range(20):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return dict(p10=round(times[len(times) // 10] * 1e6, 1), median=round(times[len(times) // 2] * 1e6, 1))


def _autograd_floor(reps, q, k, v, do) -> dict:
    """The same ``torch.autograd.grad`` call through an autograd.Function that allocates its output and three
    gradients and does nothing else: the part of every fwd+bwd row that is PyTorch's own."""
    import torch

    class Nothing(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            ctx.save_for_backward(q, k, v)
            return torch.empty(q.shape, dtype=q.dtype)

        @staticmethod
        def backward(ctx, g):
            q, k, v = ctx.saved_tensors
            return torch.empty(q.shape), torch.empty(k.shape), torch.empty(v.shape)

    return _time_us(lambda: torch.autograd.grad(Nothing.apply(q, k, v), (q, k, v), do), reps)


def main(argv) -> int:
    os.environ.pop("TRITON_INTERPRET", None)
    sys.path.insert(0, str(ROOT))
    reps = int(argv[argv.index("--reps") + 1]) if "--reps" in argv else 300
    rows = {"dispatch": measure(reps, bind=False), "dispatch + triton binding": measure(reps, bind=True)}
    if "--json" in argv:
        print(json.dumps(rows))
    else:
        for mode, table in rows.items():
            print(mode)
            for k, v in table.items():
                print(f"  {k:18s} p10 {v['p10']:8.1f} us   median {v['median']:8.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
