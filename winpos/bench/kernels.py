"""Benchmark the fused Triton window attention against PyTorch SDPA on ViTDet-B/L and HieraDet-B+ shapes at 1024².

    python -m winpos.bench.kernels --json OUT.json            # on a GPU (bf16; about 5 minutes on an H200)
    python -m winpos.bench.kernels --dry-run --json OUT.json  # tiny shapes on CPU under the Triton interpreter
    python tools/benchmark.py kernels [ARGS]                  # the same; forces --dry-run when there is no GPU

For every attention block shape and position term (none, rope, relpos, lookhere) it times forward and
forward+backward of (all read q, k, v as views of one ``(B, H, W, 3, heads, D)`` projection output, as the
backbones do; the backward's gradient flows to that tensor):

* ``triton``: ``winpos.kernels.window_attention`` (everything fused, reading the grid in place);
* ``triton_rope_unfused`` (rope only): the standalone RoPE kernel on q and k, then the fused kernel without RoPE;
* ``sdpa``: window partition copies of q, k and v + SDPA + unpartition, with the *flash* backend when there is no
  bias (RoPE applied by PyTorch first) and the *efficient* backend with a materialized ``(groups, heads, N, N)``
  bias for relpos and LookHere (flash takes no bias);
* ``sdpa_xpart``: the same, but the projection output is partitioned once (one copy of all three, the model's
  own partition-x-once path) instead of q, k and v separately: the stronger baseline;
* ``sdpa_cudnn`` (CUDA, no bias): cuDNN attention on the x-partitioned windows;
* ``flex`` (when ``winpos.attention`` has the FlexAttention backend): ``attention(..., backend="flex")``;
* ``reference``: ``winpos.attention.reference_attention`` (relpos through the augmented-QK identity).

Timing (``winpos.bench.cuda_timing``): CUDA events per call with the L2 cache flushed before each, median of
``--reps``; and the same calls replayed from a CUDA graph (``*_graph_ms``: the GPU time without host overhead;
null with the capture error when a path cannot be captured). Reported per row also: achieved TFLOP/s
(FlashAttention FLOP convention, see ``attention_flops``), peak memory above the inputs (MiB), and the forward's
max abs difference to ``sdpa``. Implementations that cannot run here are listed under ``unavailable`` with why.

``--sweep`` times the fused kernels instead over a grid of tile shapes and warps per shape and variant (the hook
``winpos.kernels.launch_config.set_tuned``) and writes the best launch options per kernel as ``tuned``:
the table to commit as the kernels' defaults after a GPU run.
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

from .kernel_baselines import IMPLS, impl_fn, make_pos, unavailable

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


def _timings(fn, cuda: bool, reps: int) -> dict:
    """Eager (L2 flushed) and CUDA-graph timings of ``fn``: ``{"ms", "range_ms", "graph_ms", "graph_error"}``."""
    from .cuda_timing import bench

    eager = bench(fn, reps=reps if cuda else 1, warmup=3 if cuda else 0)
    out = {"ms": eager["median_ms"], "range_ms": [eager["min_ms"], eager["max_ms"]], "graph_ms": None,
           "graph_error": None}
    if cuda:
        try:
            out["graph_ms"] = bench(fn, reps=reps, graph=True)["median_ms"]
        except Exception as e:  # not capturable: the eager timing stands, the reason is kept
            out["graph_error"] = f"{type(e).__name__}: {e}"[:300]
            import torch

            torch.cuda.synchronize()
    return out


def _peak_mib(fn, cuda: bool):
    from .timing import cuda_peak_mib

    return cuda_peak_mib(fn) if cuda else None


def _inputs(shape: Shape, dtype, device):
    import torch

    torch.manual_seed(0)
    B, (H, W), n, D = shape.batch, shape.grid, shape.heads, shape.head_dim
    return torch.randn(B, H, W, 3, n, D, device=device, dtype=dtype)


def _plan(shape: Shape):
    from winpos.kernels import Plan

    H, W, s = *shape.grid, shape.pool
    q_hw = (H // s, W // s)
    qw = (shape.window // s,) * 2 if shape.window else q_hw
    kw = (shape.window,) * 2 if shape.window else (H, W)
    return Plan((H // kw[0]), (W // kw[1]), *qw, *kw, s, 0, 0, 0, 0, 0, 0, 0, 16, 16)


def _time_fn(fn, qkv, cuda: bool, reps: int) -> dict:
    """Forward and forward+backward timings and peak memory of ``fn(qkv)``, and its forward output."""
    import torch

    leaf = qkv.detach().clone().requires_grad_()
    with torch.no_grad():
        out = fn(qkv)
    grad = torch.randn_like(out)

    def fwd():
        with torch.no_grad():
            fn(qkv)

    def fwd_bwd():
        o = fn(leaf)
        o.backward(grad)
        leaf.grad = None

    return {"out": out, "fwd": _timings(fwd, cuda, reps), "fwd_bwd": _timings(fwd_bwd, cuda, reps),
            "fwd_peak_mib": _peak_mib(fwd, cuda), "fwd_bwd_peak_mib": _peak_mib(fwd_bwd, cuda)}


def bench_row(shape: Shape, variant: str, impl: str, dtype, device, reps: int, ref_out=None) -> tuple:
    from winpos.kernels import attention_flops

    cuda = device.type == "cuda"
    qkv = _inputs(shape, dtype, device)
    pos = make_pos(shape, variant, device)
    t = _time_fn(impl_fn(impl, shape, pos, cuda), qkv, cuda, reps)
    plan, (B, n, D) = _plan(shape), (shape.batch, shape.heads, shape.head_dim)
    bias_variant = variant in ("relpos", "lookhere")
    row = dict(asdict(shape), variant=variant, impl=impl, dtype=str(dtype).replace("torch.", ""),
               sdpa_backend=(("efficient+bias" if bias_variant else "flash") if impl in ("sdpa", "sdpa_xpart")
                             else "cudnn" if impl == "sdpa_cudnn" else None))
    for part in ("fwd", "fwd_bwd"):
        row[f"{part}_ms"] = t[part]["ms"]
        row[f"{part}_range_ms"] = t[part]["range_ms"]
        row[f"{part}_graph_ms"] = t[part]["graph_ms"]
        if t[part]["graph_error"]:
            row[f"{part}_graph_error"] = t[part]["graph_error"]
    row["fwd_tflops"] = attention_flops(plan, B, n, D) / row["fwd_ms"] / 1e9
    row["fwd_bwd_tflops"] = attention_flops(plan, B, n, D, backward=True) / row["fwd_bwd_ms"] / 1e9
    row["fwd_peak_mib"], row["fwd_bwd_peak_mib"] = t["fwd_peak_mib"], t["fwd_bwd_peak_mib"]
    out = t["out"]
    row["max_abs_diff_vs_sdpa"] = None if ref_out is None else (out.float() - ref_out.float()).abs().max().item()
    return row, out


def _write(report: dict, out_path) -> None:
    if out_path:
        from winpos.outputs import atomic_write

        atomic_write(out_path, lambda f: json.dump(report, f, indent=1), "w")


def _report(device, dtype) -> dict:
    import torch

    import triton

    from winpos.kernels import _jit

    return dict(device=torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu",
                torch=torch.__version__, triton=triton.__version__, interpreter=_jit.interpreting(),
                dtype=str(dtype).replace("torch.", ""), rows=[], skipped=[], errors=[], unavailable=[])


def run_rows(shapes, dtype, device, reps, budget_s, out_path, impls):
    """Every shape x variant x implementation (``IMPLS`` order, sdpa first: the others are compared with it)."""
    import torch

    report = _report(device, dtype)
    start = time.time()
    cuda = device.type == "cuda"
    for shape in shapes:
        for variant in VARIANTS:
            ref_out = None
            for impl in IMPLS:
                if impl not in impls:
                    continue
                label = f"{shape.model}/{shape.block}/{variant}/{impl}"
                why = unavailable(impl, variant, cuda)
                if why is not None:
                    if why != "only for rope":
                        report["unavailable"].append(dict(label=label, reason=why))
                    continue
                if time.time() - start > budget_s:
                    report["skipped"].append(label)
                    continue
                try:
                    row, out = bench_row(shape, variant, impl, dtype, device, reps, ref_out)
                    if impl == "sdpa":
                        ref_out = out
                    report["rows"].append(row)
                    graph = row["fwd_graph_ms"]
                    print(f"{label:55s} fwd {row['fwd_ms']:9.3f} ms  fwd+bwd {row['fwd_bwd_ms']:9.3f} ms  "
                          f"{row['fwd_tflops']:7.2f} TFLOP/s" + (f"  graph fwd {graph:8.3f} ms" if graph else ""),
                          flush=True)
                except Exception as e:  # keep going: one failing backend must not lose the other rows
                    report["errors"].append(dict(label=label, error=f"{type(e).__name__}: {e}"[:2000]))
                    print(f"{label:55s} ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
                finally:
                    if cuda:
                        torch.cuda.empty_cache()
                report["elapsed_s"] = time.time() - start
                _write(report, out_path)
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
    parser.add_argument("--impls", default=",".join(IMPLS), help=f"comma-separated subset of {', '.join(IMPLS)}")
    parser.add_argument("--sweep", action="store_true",
                        help="time the fused kernels over tile shapes / warps / stages instead (see the docstring)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="with --sweep: which position terms")
    args = parser.parse_args(argv)
    unknown = set(args.impls.split(",")) - set(IMPLS)
    if unknown:
        parser.error(f"unknown --impls {sorted(unknown)}; choose from {', '.join(IMPLS)}")
    bad_variants = set(args.variants.split(",")) - set(VARIANTS)
    if bad_variants:
        parser.error(f"unknown --variants {sorted(bad_variants)}; choose from {', '.join(VARIANTS)}")

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
    if args.sweep:
        from .kernel_sweep import run_sweep

        report = run_sweep(shapes, dtype, device, args.reps, args.budget, args.json, tuple(args.variants.split(",")))
        print(f"{len(report['sweeps'])} sweeps, {len(report['skipped'])} skipped in "
              f"{report.get('elapsed_s', 0):.0f} s" + (f"; wrote {args.json}" if args.json else ""))
        return 0 if report["sweeps"] else 1
    report = run_rows(shapes, dtype, device, args.reps, args.budget, args.json, set(args.impls.split(",")))
    print(f"{len(report['rows'])} rows, {len(report['skipped'])} skipped, {len(report['errors'])} errors, "
          f"{len(report['unavailable'])} unavailable in {report.get('elapsed_s', 0):.0f} s"
          + (f"; wrote {args.json}" if args.json else ""))
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
