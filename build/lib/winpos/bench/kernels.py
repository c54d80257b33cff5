"""Benchmark the fused Triton window attention against PyTorch SDPA on ViTDet-B/L and HieraDet-B+ shapes at 1024².

    python -m winpos.bench.kernels --json OUT.json            # on a GPU (bf16; about 5 minutes on an H200)
    python -m winpos.bench.kernels --dry-run --json OUT.json  # tiny shapes on CPU under the Triton interpreter
    python tools/benchmark.py kernels [ARGS]                  # the same; forces --dry-run when there is no GPU

For every attention block shape and position term (none, rope, relpos, lookhere) it times forward and
forward+backward of:

* ``triton``: ``winpos.kernels.window_attention`` (everything fused, reading the grid in place);
* ``triton_rope_unfused`` (rope only): the standalone RoPE kernel on q and k, then the fused kernel without RoPE;
* ``sdpa``: window partition copies + SDPA + unpartition, with the *flash* backend when there is no bias (RoPE
  applied by PyTorch first) and the *efficient* backend with a materialized ``(groups, heads, N, N)`` bias for
  relpos and LookHere (flash takes no bias);
* ``reference``: ``winpos.attention.reference_attention`` (relpos through the augmented-QK identity).

Reported per row: median milliseconds, achieved TFLOP/s (FlashAttention FLOP convention, see
``attention_flops``), peak memory above the inputs (MiB), and the forward's max abs difference to ``sdpa``.
Results are written after every row, so a run cut short still leaves a valid JSON; ``--budget`` seconds bound the
whole run (rows beyond it are listed as skipped). Refuses to run on a machine without CUDA unless ``--dry-run``.

``tools/benchmark.py kernels`` runs this module in a child process (``command`` / ``run``): ``--dry-run`` needs
the Triton interpreter, which Triton fixes at its first import in a process. Without CUDA that wrapper says so
and runs the dry run (tiny shapes on CPU: it checks the benchmark end to end, its timings mean nothing).
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from winpos.windows import padded_size

VARIANTS = ("none", "rope", "relpos", "lookhere")
GPU_NEEDED = ("the kernel benchmark needs a CUDA GPU and none is available: running its --dry-run instead "
              "(tiny shapes under the Triton interpreter; it checks the benchmark end to end, the timings are "
              "meaningless)")


@dataclass(frozen=True)
class Shape:
    """One attention block: key grid (already padded to the window), queries pooled by ``pool``."""

    model: str
    block: str
    batch: int
    grid: tuple
    heads: int
    head_dim: int
    window: int = None
    pool: int = 1


def gpu_shapes(batch: int = 2) -> list:
    """Attention shapes at a 1024x1024 input (patch 16 for ViTDet, patch 4 + 2x pooling per stage for HieraDet-B+,
    whose head_dim is 56 = 112 / 2)."""
    g = 64
    shapes = []
    for model, heads in (("vitdet_b", 12), ("vitdet_l", 16)):
        shapes += [Shape(model, "window14", batch, (padded_size(g, 14),) * 2, heads, 64, 14),
                   Shape(model, "global", batch, (g, g), heads, 64)]
    shapes += [
        Shape("hieradet_b+", "s1_window8", batch, (256, 256), 2, 56, 8),
        Shape("hieradet_b+", "s1to2_qpool_window8", batch, (256, 256), 4, 56, 8, pool=2),
        Shape("hieradet_b+", "s2_window4", batch, (128, 128), 4, 56, 4),
        Shape("hieradet_b+", "s3_window14", batch, (padded_size(g, 14),) * 2, 8, 56, 14),
        Shape("hieradet_b+", "s3_global", batch, (g, g), 8, 56),
        Shape("hieradet_b+", "s4_window7", batch, (padded_size(32, 7),) * 2, 16, 56, 7),
    ]
    return shapes


def dry_run_shapes() -> list:
    return [Shape("tiny", "window4", 1, (8, 8), 2, 32, 4), Shape("tiny", "global_qpool", 1, (8, 8), 2, 32, pool=2)]


def make_pos(shape: Shape, variant: str, device):
    from winpos.attention import PositionTerms
    from winpos.posemb.lookhere import LookHere
    from winpos.posemb.relpos import RelPosTables
    from winpos.posemb.rope import RoPE

    extent = shape.window or shape.grid[0]
    if variant == "rope":  # axial, half pairing, half of the head dims rotated
        return PositionTerms(rope=RoPE(shape.head_dim, shape.heads, fraction=0.5).to(device))
    if variant == "relpos":
        return PositionTerms(rel_pos=RelPosTables(shape.head_dim, extent, zero_init=False).to(device).tables())
    if variant == "lookhere":
        return PositionTerms(lookhere=LookHere(shape.heads, "45").to(device))
    return PositionTerms()


def sdpa_baseline(q, k, v, window, pos, backends):
    """Partition copies + SDPA (+ materialized bias) + unpartition."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    from winpos.posemb.relpos import rel_bias_dense
    from winpos.posemb.rope import apply_rope
    from winpos.windows import window_partition, window_unpartition

    q_hw, k_hw = tuple(q.shape[1:3]), tuple(k.shape[1:3])
    pool = k_hw[0] // q_hw[0]
    q_win, k_win = ((window // pool,) * 2, (window,) * 2) if window else (q_hw, k_hw)

    def groups(x, win):
        x = window_partition(x, win[0]) if window else x.flatten(1, 2)
        return x.transpose(1, 2)  # (groups, heads, N, D)

    qg, kg, vg = groups(q, q_win), groups(k, k_win), groups(v, k_win)
    if pos.rope is not None:
        t = pos.rope.tables(q_win, k_win)
        qg = apply_rope(qg, t.cos_q, t.sin_q, t.rot_dims, t.pairing)
        kg = apply_rope(kg, t.cos_k, t.sin_k, t.rot_dims, t.pairing)
    bias = None
    if pos.rel_pos is not None:
        bias = rel_bias_dense(qg, *pos.rel_pos, q_win, k_win)
    if pos.lookhere is not None:
        bias = pos.lookhere.bias(q_win, k_win).to(qg.dtype).expand(qg.shape[0], -1, -1, -1)
    with sdpa_kernel(backends):
        out = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=bias)
    out = out.transpose(1, 2)
    return window_unpartition(out, q_win[0], q_hw) if window else out.reshape(q.shape)


def unfused_rope(q, k, v, window, pos):
    from winpos.kernels import rope_grid, window_attention

    q_hw, k_hw = tuple(q.shape[1:3]), tuple(k.shape[1:3])
    pool = k_hw[0] // q_hw[0]
    q_win, k_win = ((window // pool,) * 2, (window,) * 2) if window else (q_hw, k_hw)
    t = pos.rope.tables(q_win, k_win)
    q = rope_grid(q, t.cos_q, t.sin_q, t.rot_dims, t.pairing, q_win)
    k = rope_grid(k, t.cos_k, t.sin_k, t.rot_dims, t.pairing, k_win)
    return window_attention(q, k, v, window=window)


def _timer(fn, cuda: bool, reps: int):
    """Median milliseconds of ``fn()`` (CUDA events after warmup on GPU; one wall-clock call in dry runs)."""
    import torch

    if not cuda:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def _peak_mib(fn, cuda: bool):
    from .timing import cuda_peak_mib

    return cuda_peak_mib(fn) if cuda else None


def bench_row(shape: Shape, variant: str, impl: str, dtype, device, reps: int, ref_out=None) -> tuple:
    import torch
    from torch.nn.attention import SDPBackend

    from winpos.attention import reference_attention
    from winpos.kernels import Plan, attention_flops, window_attention

    cuda = device.type == "cuda"
    torch.manual_seed(0)
    B, (H, W), n, D, s = shape.batch, shape.grid, shape.heads, shape.head_dim, shape.pool
    qkv = torch.randn(B, H, W, 3, n, D, device=device, dtype=dtype)
    k, v = qkv[:, :, :, 1], qkv[:, :, :, 2]
    q = qkv[:, ::s, ::s, 0] if s > 1 else qkv[:, :, :, 0]  # pooled queries (strided view: read in place)
    pos = make_pos(shape, variant, device)
    bias_variant = variant in ("relpos", "lookhere")
    flash = [SDPBackend.FLASH_ATTENTION] if cuda else [SDPBackend.MATH]
    efficient = [SDPBackend.EFFICIENT_ATTENTION] if cuda else [SDPBackend.MATH]
    fns = {
        "triton": lambda q, k, v: window_attention(q, k, v, window=shape.window, pos=pos),
        "triton_rope_unfused": lambda q, k, v: unfused_rope(q, k, v, shape.window, pos),
        "sdpa": lambda q, k, v: sdpa_baseline(q, k, v, shape.window, pos, efficient if bias_variant else flash),
        "reference": lambda q, k, v: reference_attention(q, k, v, window=shape.window, pos=pos),
    }
    fn = fns[impl]
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    with torch.no_grad():
        out = fn(q, k, v)
    grad = torch.randn_like(out)

    def fwd():
        with torch.no_grad():
            fn(q, k, v)

    def fwd_bwd():
        o = fn(*leaves)
        o.backward(grad)
        for t in leaves:
            t.grad = None

    q_hw = (H // s, W // s)
    qw = (shape.window // s,) * 2 if shape.window else q_hw
    kw = (shape.window,) * 2 if shape.window else (H, W)
    plan = Plan((H // kw[0]), (W // kw[1]), *qw, *kw, s, 0, 0, 0, 0, 0, 0, 0, 16, 16)
    row = dict(asdict(shape), variant=variant, impl=impl, dtype=str(dtype).replace("torch.", ""),
               sdpa_backend=("efficient+bias" if bias_variant else "flash") if impl == "sdpa" else None)
    row["fwd_ms"] = _timer(fwd, cuda, reps)
    row["fwd_bwd_ms"] = _timer(fwd_bwd, cuda, reps)
    row["fwd_tflops"] = attention_flops(plan, B, n, D) / row["fwd_ms"] / 1e9
    row["fwd_bwd_tflops"] = attention_flops(plan, B, n, D, backward=True) / row["fwd_bwd_ms"] / 1e9
    row["fwd_peak_mib"] = _peak_mib(fwd, cuda)
    row["fwd_bwd_peak_mib"] = _peak_mib(fwd_bwd, cuda)
    row["max_abs_diff_vs_sdpa"] = None if ref_out is None else (out.float() - ref_out.float()).abs().max().item()
    return row, out


def run_rows(shapes, dtype, device, reps, budget_s, out_path, impls):
    import torch

    import triton

    from winpos.kernels import _jit

    report = dict(device=torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu",
                  torch=torch.__version__, triton=triton.__version__, interpreter=_jit.interpreting(),
                  dtype=str(dtype).replace("torch.", ""), rows=[], skipped=[], errors=[])
    start = time.time()
    for shape in shapes:
        for variant in VARIANTS:
            ref_out = None
            for impl in ("sdpa", "triton", "triton_rope_unfused", "reference"):
                if impl not in impls or (impl == "triton_rope_unfused" and variant != "rope"):
                    continue
                label = f"{shape.model}/{shape.block}/{variant}/{impl}"
                if time.time() - start > budget_s:
                    report["skipped"].append(label)
                    continue
                try:
                    row, out = bench_row(shape, variant, impl, dtype, device, reps, ref_out)
                    if impl == "sdpa":
                        ref_out = out
                    report["rows"].append(row)
                    print(f"{label:55s} fwd {row['fwd_ms']:9.3f} ms  fwd+bwd {row['fwd_bwd_ms']:9.3f} ms  "
                          f"{row['fwd_tflops']:7.2f} TFLOP/s", flush=True)
                except Exception as e:  # keep going: one failing backend must not lose the other rows
                    report["errors"].append(dict(label=label, error=f"{type(e).__name__}: {e}"[:2000]))
                    print(f"{label:55s} ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
                finally:
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                report["elapsed_s"] = time.time() - start
                if out_path:
                    with open(out_path, "w") as f:
                        json.dump(report, f, indent=1)
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, help="write results here (rewritten after every row)")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU under the Triton interpreter")
    parser.add_argument("--dtype", default=None, choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--budget", type=float, default=420.0, help="seconds; later rows are skipped")
    parser.add_argument("--models", default=None, help="comma-separated subset of model names")
    parser.add_argument("--impls", default="sdpa,triton,triton_rope_unfused,reference")
    args = parser.parse_args(argv)

    if args.dry_run:
        # Must precede the first import of triton in this process (triton fixes its mode then).
        os.environ["TRITON_INTERPRET"] = "1"
        from winpos.kernels import _jit

        if not _jit.interpreting():
            print("--dry-run needs the Triton interpreter, but this process imported triton in compiled mode "
                  "first; run `python -m winpos.bench.kernels --dry-run` in a fresh process", file=sys.stderr)
            return 2
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("winpos.bench.kernels needs a CUDA GPU (no GPU found): the timings would be meaningless on CPU. Use "
              "--dry-run to check the benchmark end to end on tiny shapes under the Triton interpreter.",
              file=sys.stderr)
        return 2
    device = torch.device("cpu" if args.dry_run else "cuda")
    dtype = getattr(torch, args.dtype or ("float32" if args.dry_run else "bfloat16"))
    shapes = dry_run_shapes() if args.dry_run else gpu_shapes(args.batch)
    if args.models:
        keep = set(args.models.split(","))
        shapes = [s for s in shapes if s.model in keep]
    report = run_rows(shapes, dtype, device, args.reps, args.budget, args.json, set(args.impls.split(",")))
    print(f"{len(report['rows'])} rows, {len(report['skipped'])} skipped, {len(report['errors'])} errors in "
          f"{report.get('elapsed_s', 0):.0f} s" + (f"; wrote {args.json}" if args.json else ""))
    return 1 if report["errors"] and not report["rows"] else 0


def command(args: list[str], cuda: bool) -> tuple[list[str], bool]:
    """The child's command line for the forwarded ``args``, and whether a dry run was forced for lack of CUDA."""
    forced = not cuda and "--dry-run" not in args and not {"-h", "--help"} & set(args)
    return [sys.executable, "-m", "winpos.bench.kernels", *args, *(["--dry-run"] if forced else [])], forced


def run(args: list[str]) -> int:
    """Run the kernel benchmark with ``args`` (its own flags: ``--json``, ``--dry-run``, ``--reps``, ``--models``,
    ``--impls``, ...) in a child process; returns its exit status."""
    import torch

    cmd, forced = command(list(args), torch.cuda.is_available())
    if forced:
        print(GPU_NEEDED, flush=True)
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
