"""Compile the kernels for an H100/H200 (sm_90) without a GPU: ``python tests/kernels/aot_compile.py [--all]``.

The CPU interpreter executes kernels as Python and misses errors that only the Triton compiler sees (types that
change across ``if``/loop branches, ``tl.dot`` shape rules, int32/int64 mixing, shared-memory limits). Triton can
lower a kernel to PTX and a cubin with no device present, given an explicit target. Prints one line per kernel
with its compile time, shared memory and ``ptxas`` register/spill counts; exits 1 on any failure. Must run in a
fresh process without ``TRITON_INTERPRET`` (the compiled mode is fixed at the first ``import triton``).
"""
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from winpos.kernels import _jit  # noqa: E402
from winpos.kernels.attention_fwd_bwd import Plan, _kernel_args  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
POINTER = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.int8: "*i8",
           torch.int32: "*i32"}


def _signature(fn, kwargs):
    """Signature, constexprs and the divisibility-by-16 hints a real launch would derive (aligned pointers, ints
    that are multiples of 16), so vectorization and register use match a GPU run."""
    sig, consts, attrs = {}, {}, {}
    for i, p in enumerate(fn.params):
        v = kwargs[p.name]
        if p.is_constexpr:
            sig[p.name], consts[(i,)] = "constexpr", v
        elif isinstance(v, torch.Tensor):
            sig[p.name], attrs[(i,)] = POINTER[v.dtype], [["tt.divisibility", 16]]
        elif isinstance(v, bool):
            sig[p.name] = "i1"
        elif isinstance(v, int):
            sig[p.name] = "i32"
            if v % 16 == 0 and v != 0 and not p.do_not_specialize:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[p.name] = "fp32"
    return sig, consts, attrs


def _ptxas_usage(ptx: str) -> str:
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not ptxas.exists():
        return "ptxas not found"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        res = subprocess.run([str(ptxas), "-v", "--gpu-name", "sm_90a", str(src), "-o", str(Path(tmp) / "k.o")],
                             capture_output=True, text=True)
    lines = [ln.strip() for ln in res.stderr.splitlines() if "registers" in ln or "spill" in ln]
    return " | ".join(lines)[-200:]


def compile_kernel(fn, kwargs):
    sig, consts, attrs = _signature(fn, kwargs)
    start = time.time()
    compiled = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs), target=TARGET,
                              options=dict(num_warps=4, num_stages=2))
    return time.time() - start, compiled


def attention_kernels(dtype, head_dim, rope, rel, lookhere, pad, pool, blocks, dtype_dot_ieee=False):
    """The three attention kernels with representative arguments (values are irrelevant for compilation)."""
    kern = _jit.load("tl_attention")
    heads, win = 2, 8
    k = torch.zeros(1, 16, 16, 3, heads, head_dim, dtype=dtype)[:, :, :, 1]  # a qkv view, as in a backbone
    q = torch.zeros(1, 16 // pool, 16 // pool, heads, head_dim, dtype=dtype)
    lse = torch.zeros(q.shape[:4])
    cos = torch.zeros(win * win // pool // pool, 8) if rope else None
    relt = torch.zeros(*q.shape[:4], 2 * win, dtype=dtype) if rel else None
    fov, slopes, cls = ((torch.zeros(heads, 4, dtype=torch.int32), torch.zeros(heads),
                         torch.zeros(heads, 4, 4, dtype=torch.int8)) if lookhere else (None, None, None))
    plan = Plan(2, 2, win // pool, win // pool, win, win, pool, 8, 8, 16, 16, int(pad), 16 if rope else 0, 1,
                *blocks)
    args = _kernel_args(q, k, k, lse, cos, cos, cos, cos, relt, fov, slopes, cls, plan, 0.125)
    strides = dict(zip(("b", "h", "w", "n"), q.stride()[:4]))
    bwd = dict(args, DO=q, DELTA=lse, scale=0.125, **{f"sdo_{a}": s for a, s in strides.items()})
    return [
        (kern.attn_fwd, dict(args, O=q, **{f"so_{a}": s for a, s in strides.items()})),
        (kern.attn_bwd_dq, dict(bwd, DQ=q, DREL=relt if rel else lse,
                                REL_PRECISION="ieee" if dtype == torch.float32 else "tf32",
                                **{f"sdq_{a}": s for a, s in strides.items()})),
        (kern.attn_bwd_dkdv, dict(bwd, DK=k, DV=k, **{f"sdk_{a}": s for a, s in zip("bhwn", k.stride()[:4])})),
    ]


def rope_kernel():
    x = torch.zeros(1, 8, 8, 2, 64, dtype=torch.bfloat16)
    cos = torch.zeros(16, 16)
    return (_jit.load("tl_rope").rope_grid_kernel, dict(
        X=x, Y=x, COS=cos, SIN=cos, sx_b=1, sx_h=1, sx_w=1, sx_n=1, sy_b=1, sy_h=1, sy_w=1, sy_n=1, c_n=0, c_t=16,
        n_tokens=64, H=8, W=8, WH=4, WW=4, HEAD_DIM=64, BLOCK_D=64, BLOCK_T=32, ROT=32, HALF=False, CONJUGATE=True))


def main(argv) -> int:
    configs = [  # (dtype, head_dim, rope, relpos, lookhere, pad mask, pool, blocks)
        ("all terms", torch.bfloat16, 80, True, True, True, True, 2, (64, 32)),
        ("no terms", torch.float16, 56, False, False, False, False, 1, (64, 64)),
    ]
    if "--all" in argv:
        configs += [("fp32 rope+lookhere", torch.float32, 128, True, False, True, False, 1, (64, 32)),
                    ("bf16 relpos", torch.bfloat16, 64, False, True, False, False, 1, (64, 64))]
    jobs = [(name, fn, kw) for name, *cfg in configs for fn, kw in attention_kernels(*cfg)]
    jobs.append(("rope", *rope_kernel()))
    failed = 0
    for name, fn, kwargs in jobs:
        try:
            seconds, compiled = compile_kernel(fn, kwargs)
            print(f"OK   {name:20s} {fn.__name__:16s} {seconds:5.1f} s  shared {compiled.metadata.shared:6d} B  "
                  f"{_ptxas_usage(compiled.asm['ptx'])}", flush=True)
        except Exception as e:  # report every kernel, then fail
            failed += 1
            print(f"FAIL {name:20s} {fn.__name__:16s} {type(e).__name__}: {str(e)[:4000]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
