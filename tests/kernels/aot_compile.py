"""Compile the launches ``window_attention`` makes for the target backbones for an H100/H200 (sm_90a), no GPU
needed, and read what the compiler did: ``python tests/kernels/aot_compile.py [--all] [--json|--markdown]``.

The CPU interpreter executes kernels as Python: it misses compile-only errors (types that change across branches,
``tl.dot`` shape rules, shared-memory limits) and everything about speed (vector width, register pressure,
software pipelining, wgmma scheduling). Here every launch is taken from the real dispatch path: q, k, v are built
as the backbones build them at 1024^2 (views of one packed ``qkv``; pooled queries contiguous), with the real
position modules, and ``winpos.kernels.window_attention`` runs forward and backward with ``_jit.launch`` replaced
by a recorder. Each recorded launch is then specialized by Triton's own runtime binder (the same divisibility and
alignment attributes a GPU launch derives from these tensors and strides), compiled for sm_90a with the launch's
``num_warps``/``num_stages``, and reported: ``ptxas -v`` (registers, spills, warnings such as C7515 "wgmma
serialized") and the SASS (``cuobjdump -sass``: HGMMA, LDGSTS = cp.async, 16-byte vs 2-byte global loads/stores).

Identical specializations are compiled once (most shapes share kernels: the window geometry is not specialized).
Runs in a fresh process without ``TRITON_INTERPRET`` (the compiled mode is fixed at the first ``import triton``);
``tests/kernels/test_aot_compile.py`` runs it once per session and asserts on the rows.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Shape:
    """One attention call of a backbone at 1024^2 (key grid already padded to the window, as the blocks do)."""

    model: str
    stage: str  # e.g. "w14", "global", "s1 w8", "s1>2 pool"
    grid: tuple  # key grid (H, W)
    heads: int
    head_dim: int
    window: int = 0  # key window, 0 = global
    pool: int = 1  # query pooling stride (Hiera stage transitions)
    valid_hw: tuple = None  # pad_mode="mask" with this unpadded grid

    @property
    def label(self) -> str:
        return f"{self.model} {self.stage} D{self.head_dim}"


TERMS = ("none", "rope", "relpos", "lookhere")

# ViTDet-B: 64x64 tokens, 12 heads of 64, 14x14 windows (grid padded to 70x70) and global blocks.
# HieraDet-B+: 112 channels / 2 heads at stage 1, doubled per stage (head_dim 56 throughout), windows 8/4/14/7 on
# 256/128/64/32 grids, global blocks in stage 3; the first block of a stage pools its queries 2x2 inside the
# previous stage's window. HieraDet-L: head_dim 72, windows 8/4/16/8.
VITDET_B = [Shape("ViTDet-B", "w14", (70, 70), 12, 64, window=14), Shape("ViTDet-B", "global", (64, 64), 12, 64)]
HIERA_BP = [
    Shape("Hiera-B+", "s1 w8", (256, 256), 2, 56, window=8),
    Shape("Hiera-B+", "s1>2 pool", (256, 256), 4, 56, window=8, pool=2),
    Shape("Hiera-B+", "s2 w4", (128, 128), 4, 56, window=4),
    Shape("Hiera-B+", "s2>3 pool", (128, 128), 8, 56, window=4, pool=2),
    Shape("Hiera-B+", "s3 w14 pad", (70, 70), 8, 56, window=14, valid_hw=(64, 64)),
    Shape("Hiera-B+", "s3 global", (64, 64), 8, 56),
    Shape("Hiera-B+", "s3>4 pool", (70, 70), 16, 56, window=14, pool=2),
    Shape("Hiera-B+", "s4 w7 pad", (35, 35), 16, 56, window=7, valid_hw=(32, 32)),
]
HIERA_L = [Shape("Hiera-L", "s1 w8", (256, 256), 2, 72, window=8), Shape("Hiera-L", "s3 global", (64, 64), 8, 72)]

# A quick set (the script's default): every kernel variant class at least once (terms x head dims x window / global /
# pooled / padded, the 16 x 64 pooled transition with every term, four 4x4 windows per program in stage 2), about 60
# distinct compiles. The test suite checks ``--all``. ``--all``: every shape above with every term.
REPRESENTATIVE = [
    *[(s, t) for s in VITDET_B for t in TERMS],
    *[(HIERA_BP[0], t) for t in TERMS],
    *[(HIERA_BP[1], t) for t in TERMS], (HIERA_BP[2], "none"), (HIERA_BP[2], "lookhere"), (HIERA_BP[3], "none"),
    (HIERA_BP[4], "none"),
    (HIERA_BP[5], "relpos"), (HIERA_BP[7], "lookhere"),
    (HIERA_L[0], "none"), (HIERA_L[0], "rope"), (HIERA_L[1], "relpos"),
]
EVERYTHING = [(s, t) for s in VITDET_B + HIERA_BP + HIERA_L for t in TERMS]
KERNELS = ("attn_fwd", "attn_bwd_dq", "attn_bwd_dkdv")


def row_id(shape: Shape, term: str, kernel: str) -> str:
    return f"{shape.label} {term} {kernel}"


# --------------------------------------------------------------------------------------------------- capture


def position_terms(shape: Shape, term: str):
    """The backbone's position module for this term (RoPE axial half-pairing, relpos tables sized to the window or
    grid, LookHere 45), as ``PositionTerms``."""
    import torch

    from winpos.attention import PositionTerms
    from winpos.posemb.lookhere import LookHere
    from winpos.posemb.relpos import RelPosTables
    from winpos.posemb.rope import RoPE

    if term == "none":
        return PositionTerms()
    if term == "rope":
        rope = RoPE(shape.head_dim, shape.heads)
        for p in rope.parameters():
            p.requires_grad_(False)
        return PositionTerms(rope=rope)
    if term == "relpos":
        extent = shape.window or max(shape.grid)
        return PositionTerms(rel_pos=tuple(t.to(torch.bfloat16) for t in
                                           RelPosTables(shape.head_dim, extent).tables()))
    if term == "lookhere":
        return PositionTerms(lookhere=LookHere(shape.heads, "45", layer_index=1, num_layers=12))
    raise ValueError(term)


def capture(shape: Shape, term: str, dtype_name: str = "bfloat16"):
    """[(kernel name, JITFunction, grid, kwargs incl. num_warps/num_stages)] for one forward + backward call."""
    import torch

    from winpos.kernels import _jit, window_attention

    dtype = getattr(torch, dtype_name)
    B, (H, W), n, D, s = 1, shape.grid, shape.heads, shape.head_dim, shape.pool
    qkv = torch.zeros(B, H, W, 3, n, D, dtype=dtype)
    q, k, v = qkv.unbind(3)  # strided views, as Attention._attend makes them
    if s > 1:  # max-pooled queries are a contiguous (B, H/s, W/s, heads, D) tensor
        q = torch.zeros(B, H // s, W // s, n, D, dtype=dtype)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    launches = []

    def record(kernel, grid, **kwargs):
        launches.append((kernel.__name__, kernel, tuple(grid), kwargs))

    saved = _jit.launch, _jit.check_launchable
    _jit.launch, _jit.check_launchable = record, (lambda *t: False)
    try:
        out = window_attention(q, k, v, window=shape.window or None, pos=position_terms(shape, term),
                               valid_hw=shape.valid_hw, pad_mode="mask" if shape.valid_hw else "zeros")
        out.backward(torch.zeros_like(out))
    finally:
        _jit.launch, _jit.check_launchable = saved
    return launches


# --------------------------------------------------------------------------------------------------- compile

_TARGET = None


def _binder(fn):
    """Triton's runtime binder for a kernel, built for an sm_90 target instead of the (absent) active device."""
    global _TARGET
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    if _TARGET is None:
        _TARGET = GPUTarget("cuda", 90, 32)
    backend = make_backend(_TARGET)
    return backend, create_function_from_signature(fn.signature, fn.params, backend)


def specialize(fn, kwargs):
    """(key, ASTSource, options) exactly as ``JITFunction.run`` derives them from the launch arguments."""
    from triton import knobs
    from triton.compiler import ASTSource

    backend, binder = _binder(fn)
    kwargs = dict(kwargs, debug=False, instrumentation_mode=knobs.compilation.instrumentation_mode)
    bound_args, specialization, options = binder(**kwargs)
    key = f"{fn.__name__}|{specialization}|{sorted(options.items())}"
    opts, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound_args, specialization, options)
    return key, ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs), opts


def _tool(name: str) -> str:
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


SASS_COUNTS = {  # column -> regex over SASS instruction lines
    "hgmma": r"\bHGMMA\.",
    "ldgsts": r"\bLDGSTS\b",
    "cp16": r"\bLDGSTS\S*\.128\b",
    "ldg128": r"\bLDG\.E\.128\b|\bLDG\.E\.ENL2\.128\b",
    "ldg16": r"\bLDG\.E\.(U16|S16)\b",
    "stg128": r"\bSTG\.E\.128\b",
    "stg16": r"\bSTG\.E\.U16\b",
    "ffma": r"\bFFMA\b",
    "ldl_stl": r"\b(LDL|STL)\b",
}


def analyse(compiled) -> dict:
    """ptxas -v on the kernel's PTX (sm_90a) and instruction counts from its SASS."""
    with tempfile.TemporaryDirectory() as tmp:
        ptx, cubin = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        ptx.write_text(compiled.asm["ptx"])
        cubin.write_bytes(compiled.asm["cubin"])
        px = subprocess.run([_tool("ptxas"), "-v", "--gpu-name", "sm_90a", str(ptx), "-o", str(Path(tmp) / "k.o")],
                            capture_output=True, text=True)
        sass = subprocess.run([_tool("cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True).stdout
    log = px.stderr
    regs = re.search(r"Used (\d+) registers", log)
    spill_st = re.search(r"(\d+) bytes spill stores", log)
    spill_ld = re.search(r"(\d+) bytes spill loads", log)
    warnings = sorted(set(re.findall(r"\(C(\d{4})\)", log)))
    lines = [ln for ln in sass.splitlines() if re.match(r"\s*/\*[0-9a-f]{4,}\*/", ln)]
    counts = {k: sum(1 for ln in lines if re.search(rx, ln)) for k, rx in SASS_COUNTS.items()}
    return dict(regs=int(regs.group(1)) if regs else -1,
                spill=int(spill_st.group(1) if spill_st else 0) + int(spill_ld.group(1) if spill_ld else 0),
                warnings=["C" + w for w in warnings], shared=compiled.metadata.shared, **counts)


def aligned(kwargs) -> bool:
    """Whether every 16-bit tensor of the launch is 16-byte aligned: data pointers and every stride of the
    q/k/v/o/do/d* tensors are multiples of 16 bytes (so 16-byte vector accesses are legal). Strides are passed in
    units of ``SV`` elements (1 if the kernel has no such argument)."""
    import torch

    unit = kwargs.get("SV", 1)
    tensors = [v for v in kwargs.values() if isinstance(v, torch.Tensor) and v.element_size() == 2]
    strides = [v * unit for k, v in kwargs.items() if re.fullmatch(r"s(q|k|v|o|do|dq|dk)_[bhwn]", k)]
    return all(t.data_ptr() % 16 == 0 for t in tensors) and all(s * 2 % 16 == 0 for s in strides)


def compile_rows(specs, log=None) -> list[dict]:
    import triton

    from winpos.kernels.launch_config import launch_key, shared_estimate

    cache, rows = {}, []
    for shape, term in specs:
        for name, fn, grid, kwargs in capture(shape, term):
            key, src, opts = specialize(fn, kwargs)
            fresh = key not in cache
            if fresh:
                start = time.time()
                compiled = triton.compile(src, target=_TARGET, options=opts.__dict__)
                cache[key] = dict(analyse(compiled), compile_s=round(time.time() - start, 1))
            tuned_key = launch_key(kwargs, backward=name != "attn_fwd")
            row = dict(id=row_id(shape, term, name), model=shape.model, stage=shape.stage, term=term, kernel=name,
                       shared_estimate=shared_estimate(tuned_key, opts.num_stages),
                       head_dim=shape.head_dim, grid=list(grid), num_warps=opts.num_warps, num_stages=opts.num_stages,
                       blocks=[kwargs["BLOCK_M"], kwargs["BLOCK_N"]], aligned=aligned(kwargs), fresh=fresh,
                       **cache[key])
            rows.append(row)
            if log:
                log(f"{row['id']:45s} {'compiled' if fresh else 'cached  '} regs {row['regs']:3d} spill "
                    f"{row['spill']:5d} ldg128/16 {row['ldg128']}/{row['ldg16']} ldgsts {row['ldgsts']} "
                    f"hgmma {row['hgmma']} {' '.join(row['warnings'])}")
    return rows


def markdown(rows) -> str:
    head = ("| kernel | shape | term | warps | regs | spill B | LDG 16 B / 2 B | STG 16 B / 2 B | cp.async 16 B / all "
            "| wgmma | FFMA | warnings |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    body = "".join(
        f"| {r['kernel']} | {r['model']} {r['stage']} (D {r['head_dim']}) | {r['term']} | {r['num_warps']} | "
        f"{r['regs']} | {r['spill']} | {r['ldg128']} / {r['ldg16']} | {r['stg128']} / {r['stg16']} | {r['cp16']} / {r['ldgsts']} | "
        f"{r['hgmma']} | {r['ffma']} | {' '.join(r['warnings']) or '-'} |\n" for r in rows)
    return head + body


def legacy_smoke(argv) -> int:
    """The standalone RoPE kernel (not launched by window_attention) compiles too."""
    import torch
    from winpos.kernels import _jit

    x = torch.zeros(1, 8, 8, 2, 64, dtype=torch.bfloat16)
    cos = torch.zeros(16, 16)
    kern = _jit.load("tl_rope").rope_grid_kernel
    kwargs = dict(X=x, Y=x, COS=cos, SIN=cos, sx_b=1, sx_h=1, sx_w=1, sx_n=1, sy_b=1, sy_h=1, sy_w=1, sy_n=1, c_n=0,
                  c_t=16, n_tokens=64, H=8, W=8, WH=4, WW=4, HEAD_DIM=64, BLOCK_D=64, BLOCK_T=32, ROT=32, HALF=False,
                  CONJUGATE=True, num_warps=4)
    import triton

    _, src, opts = specialize(kern, kwargs)
    triton.compile(src, target=_TARGET, options=opts.__dict__)
    return 0


def main(argv) -> int:
    os.environ.pop("TRITON_INTERPRET", None)
    sys.path.insert(0, str(ROOT))
    specs = EVERYTHING if "--all" in argv else REPRESENTATIVE
    start = time.time()
    quiet = "--json" in argv or "--markdown" in argv
    rows = compile_rows(specs, log=None if quiet else lambda m: print(m, flush=True))
    legacy_smoke(argv)
    if "--json" in argv:
        print(json.dumps(dict(rows=rows, seconds=round(time.time() - start, 1))))
    elif "--markdown" in argv:
        print(markdown(rows))
    else:
        print(f"{len(rows)} launches, {sum(r['fresh'] for r in rows)} distinct kernels, "
              f"{time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
