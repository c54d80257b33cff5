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
* ``reference``: ``winpos.attention.reference_attention`` (relpos in training through query blocks with a recomputing backward).

Timing (``winpos.bench.cuda_timing``): CUDA events per call with the L2 cache flushed before each, median of
``--reps``; and the same calls replayed from a CUDA graph (``*_graph_ms``: the GPU time without host overhead;
null with the capture error when a path cannot be captured). Reported per row also: achieved TFLOP/s
(FlashAttention FLOP convention, see ``attention_flops``), peak memory above the inputs (MiB), and the forward's
max abs difference to ``sdpa``. Implementations that cannot run here are listed under ``unavailable`` with why.

``--sweep`` times the fused kernels instead over a grid of tile shapes and warps per shape and variant (the hook
``winpos.kernels.launch_config.set_tuned``) and writes the best launch options per kernel as ``tuned``:
the table to commit as the kernels' defaults after a GPU run.
Rows run in ``row_order``: one ``sdpa`` and one ``triton`` row per shape first (the HieraDet shapes are reached
however short the budget), then the position terms, then the peers. Results are written after every row, so a
run cut short still leaves a valid JSON; ``--budget`` seconds bound the whole run (rows beyond it are listed as
skipped). Shapes, inputs and timing come from ``kernel_common``, which the sweep shares. Refuses to run on a machine without CUDA unless ``--dry-run``.

``tools/benchmark.py kernels`` runs this module in a child process (``command`` / ``run``): ``--dry-run`` needs
the Triton interpreter, which Triton fixes at its first import in a process. Without CUDA that wrapper says so
and runs the dry run (tiny shapes on CPU: it checks the benchmark end to end, its timings mean nothing).
"""
import argparse
import os
import subprocess
import sys
import time
from dataclasses import asdict

from .kernel_baselines import IMPLS, impl_fn, make_pos, unavailable
from .kernel_common import (  # noqa: F401  (VARIANTS, Shape, gpu_shapes: this module's interface too)
    VARIANTS, Shape, dry_run_shapes, gpu_shapes, inputs, new_report, plan, time_fn, write)

GPU_NEEDED = ("the kernel benchmark needs a CUDA GPU and none is available: running its --dry-run instead "
              "(tiny shapes under the Triton interpreter; it checks the benchmark end to end, the timings are "
              "meaningless)")


def bench_row(shape: Shape, variant: str, impl: str, dtype, device, reps: int, ref_out=None) -> tuple:
    from winpos.kernels import attention_flops

    cuda = device.type == "cuda"
    qkv = inputs(shape, dtype, device)
    pos = make_pos(shape, variant, device)
    t = time_fn(impl_fn(impl, shape, pos, cuda), qkv, cuda, reps)
    geometry, (B, n, D) = plan(shape), (shape.batch, shape.heads, shape.head_dim)
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
    row["fwd_tflops"] = attention_flops(geometry, B, n, D) / row["fwd_ms"] / 1e9
    row["fwd_bwd_tflops"] = attention_flops(geometry, B, n, D, backward=True) / row["fwd_bwd_ms"] / 1e9
    row["fwd_peak_mib"], row["fwd_bwd_peak_mib"] = t["fwd_peak_mib"], t["fwd_bwd_peak_mib"]
    out = t["out"]
    row["max_abs_diff_vs_sdpa"] = None if ref_out is None else (out.float() - ref_out.float()).abs().max().item()
    return row, out


def row_order(shapes, impls) -> list:
    """(shape, variant, impl) in the order they run: one ``sdpa`` and one ``triton`` row per shape without position
    terms first (every shape, the HieraDet ones included, is timed and checked however short the budget), then
    ``sdpa`` + ``triton`` with each position term, then every other implementation (the peers). Within a shape and
    variant ``sdpa`` precedes the rows compared with it."""
    core = [i for i in ("sdpa", "triton") if i in impls]
    order = [(s, "none", i) for s in shapes for i in core]
    order += [(s, v, i) for s in shapes for v in VARIANTS[1:] for i in core]
    order += [(s, v, i) for s in shapes for v in VARIANTS for i in IMPLS if i in impls and i not in core]
    return order


def run_rows(shapes, dtype, device, reps, budget_s, out_path, impls):
    """Every shape x variant x implementation in ``row_order``; outputs are compared with the same shape and
    variant's ``sdpa`` row."""
    import torch

    report = new_report(device, dtype)
    start = time.time()
    cuda = device.type == "cuda"
    ref_outs = {}
    for shape, variant, impl in row_order(shapes, impls):
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
            row, out = bench_row(shape, variant, impl, dtype, device, reps, ref_outs.get((shape, variant)))
            if impl == "sdpa":
                ref_outs[(shape, variant)] = out
            report["rows"].append(row)
            graph = row["fwd_graph_ms"]
            print(f"{label:55s} fwd {row['fwd_ms']:9.3f} ms  fwd+bwd {row['fwd_bwd_ms']:9.3f} ms  "
                  f"{row['fwd_tflops']:7.2f} TFLOP/s" + (f"  graph fwd {graph:8.3f} ms" if graph else ""), flush=True)
        except Exception as e:  # keep going: one failing backend must not lose the other rows
            report["errors"].append(dict(label=label, error=f"{type(e).__name__}: {e}"[:2000]))
            print(f"{label:55s} ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
        finally:
            if cuda:
                torch.cuda.empty_cache()
        report["elapsed_s"] = time.time() - start
        write(report, out_path)
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
    from .blocked_imports import install_from_env

    install_from_env()
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
