#!/usr/bin/env python
"""Benchmarks: winpos and its peers timed interleaved (round-robin) in one process, medians after warm-up, ratios.

    python tools/benchmark.py backbone [--which all|vitdet|hiera] [--rows TEXT] [--size 1024] [--bf16] [--profile N]
        # winpos ViTDet-B / HieraDet-B+ vs detectron2 ViT-B, segment-anything ViT-B, sam2 and timm Hiera-B+:
        # time, speedup over the peer, fvcore GFLOPs, fraction of measured matmul throughput, peak memory,
        # with --profile N the top-N ops (self time) of each winpos row next to its peer's
        # --compile adds a "(compiled)" row (torch.compile, inductor) for every row, timed against the compiled peer
    python tools/benchmark.py posemb [--size 1024]
        # winpos relpos vs materialized (and no relpos), one ViTDet-B global block (fwd, fwd+bwd)
    python tools/benchmark.py flex [--sizes 1024,1536] [--terms relpos,lookhere] [--device cpu|cuda]
        # winpos's path vs FlexAttention (compiled score_mod / block mask) vs a materialized bias, one ViTDet-B
        # global block per size: fwd and fwd+bwd, medians with per-round ranges, peak memory
    python tools/benchmark.py mlp [--repeats 7] [--divide 1]
        # one MLP with its residual at ViTDet-B / Hiera-B+ shapes: plain ops vs the fused CPU inference path
    python tools/benchmark.py scaling [--preset vitdet_b] [--sizes 256,384,512,512x768,768] [--plot out.png]
        # time and memory vs input size per encoding, fitted growth exponent (time ~ tokens^k)
    python tools/benchmark.py train [--which hieradet|vitdet] [--encodings abswin,rope] [--iters 5] [--bf16]
        # training steps/s of the tiny shapes Mask R-CNN per encoding (configs/shapes), ratio vs abswin
    python tools/benchmark.py train-step [--size 1024] [--families vitdet_b,hieradet_bplus] [--repeats 3]
        # one training step (fwd + bwd + AdamW) per encoding and detectron2's ViT: ratios to relpos, peak memory
    python tools/benchmark.py export [--presets vitdet_toy,hieradet_toy] [--sizes 64,96] [--configs CFG,...]
                                     [--latency-presets vitdet_b,hieradet_b] [--latency-size 512]
        # every recipe exported (ONNX in onnxruntime, .pt2, TorchScript): max |error| against eager per family x
        # recipe x format x size; eager vs onnxruntime CPU latency side by side (docs/export.md)
    python tools/benchmark.py kernels [ARGS of winpos.bench.kernels, e.g. --json out.json --reps 10] [--force]
        # Triton window attention vs SDPA (GPU); without CUDA it says so and runs its --dry-run. Its --json follows
        # the same policy (an existing file is replaced only with --force), and --reps / --batch / --budget must be
        # positive, checked here before the benchmark starts

Options after every subcommand but kernels: --json OUT (every number; not measured = null; an existing file is
replaced only with --force), --threads N (torch intra-op threads, default 2), --warmup N (untimed calls first,
default 1). backbone, posemb, flex and scaling also take
--repeats N and --no-memory (skip the peak memory, which on CPU spawns one process per row). The report goes to
stdout as markdown tables, progress bars to stderr (TQDM_DISABLE=1 hides them). Every argument is checked before
any timing starts; a bad one gets one "error:" line and exit status 2.
"""
import argparse
import json
import sys
from pathlib import Path

import torch

from winpos.errors import WinposError
from winpos.utils.cli import ArgumentParser, nonnegative_int, positive_int, run_cli


def _device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise WinposError("--device cuda: no CUDA GPU is available; use --device cpu (or auto)")
    return name


def _sizes(text: str):
    from winpos.bench.scaling import parse_sizes

    try:
        return parse_sizes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _write_json(path, result) -> None:
    from winpos.bench.timing import _finite
    from winpos.utils.outputs import atomic_write

    atomic_write(path, lambda f: json.dump(_finite(result), f, indent=2, allow_nan=False), "w")
    print(f"\nwrote {path}")


def _csv(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def _px_list(text: str) -> list[int]:
    sizes = []
    for part in _csv(text):
        if not part.isdigit() or int(part) < 16 or int(part) % 16:
            raise argparse.ArgumentTypeError(f"{part!r} is not an image size in px that is a multiple of the patch "
                                             "size 16, e.g. 1024")
        sizes.append(int(part))
    if not sizes:
        raise argparse.ArgumentTypeError("give at least one size, e.g. 1024")
    return sizes


def _terms(text: str) -> list[str]:
    from winpos.bench.posemb import FLEX_TERMS

    terms = _csv(text)
    bad = [t for t in terms if t not in FLEX_TERMS]
    if bad or not terms:
        raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(FLEX_TERMS)} (comma-separated)")
    return terms


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (a median needs one timed call), got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", default=None, help="write every number to this JSON file")
    common.add_argument("--force", action="store_true", help="replace an existing --json (or --plot) file")
    common.add_argument("--threads", type=positive_int, default=2, help="torch intra-op threads (default 2)")
    common.add_argument("--warmup", type=nonnegative_int, default=1,
                        help="untimed calls of each function first (default 1)")
    memory = argparse.ArgumentParser(add_help=False)
    memory.add_argument("--memory", action=argparse.BooleanOptionalAction, default=True,
                        help="measure peak memory of one call per row (default on; --no-memory for a quick run)")

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True, metavar="{backbone,posemb,flex,mlp,scaling,train,train-step,export,kernels}")

    p = sub.add_parser("backbone", parents=[common, memory], help="full backbones vs their peers")
    p.add_argument("--which", default="all", choices=["all", "vitdet", "hiera"], help="backbone families")
    p.add_argument("--rows", type=_csv, default=None, metavar="TEXT[,TEXT]",
                   help="only rows whose name contains one of these (case-insensitive), with their peers; e.g. "
                        "--rows 'ViTDet-B paper' times it against detectron2's ViT-B only")
    p.add_argument("--size", type=positive_int, default=1024, help="square input size in px")
    p.add_argument("--repeats", type=_positive, default=5)
    p.add_argument("--bf16", action="store_true", help="also time bf16 autocast")
    p.add_argument("--flops", action=argparse.BooleanOptionalAction, default=True, help="count fvcore GFLOPs")
    p.add_argument("--profile", type=nonnegative_int, default=0, metavar="N",
                   help="top-N ops (torch.profiler self time) of each winpos row and its peer (default 0: off)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--compile", action="store_true",
                   help="also time every row compiled (torch.compile, inductor; compile time excluded)")

    p = sub.add_parser("flex", parents=[common, memory], help="winpos vs FlexAttention vs materialized, one block")
    p.add_argument("--sizes", type=_px_list, default=[1024, 1536], metavar="PX[,PX]",
                   help="image sizes in px of the ViTDet-B global block (multiples of 16; default 1024,1536)")
    p.add_argument("--terms", type=_terms, default=["relpos", "lookhere"], help="relpos, lookhere or both")
    p.add_argument("--repeats", type=_positive, default=5)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--flex-compile", default="inductor", choices=["inductor", "aot_eager"],
                   help="FlexAttention's compile backend (aot_eager: unfused, only to check the harness quickly)")

    p = sub.add_parser("posemb", parents=[common, memory], help="winpos relpos vs materialized relpos")
    p.add_argument("--size", type=positive_int, default=1024, help="image size in px of the ViTDet-B global block "
                   "(tokens = size / 16 per side)")
    p.add_argument("--repeats", type=_positive, default=5)

    p = sub.add_parser("mlp", parents=[common], help="one MLP + residual: plain ops vs the fused CPU path")
    p.add_argument("--repeats", type=_positive, default=7)
    p.add_argument("--divide", type=positive_int, default=1,
                   help="divide every shape's token count by this (a quick check; default 1: the real shapes)")

    p = sub.add_parser("scaling", parents=[common, memory], help="time / memory vs input size")
    p.add_argument("--preset", default="vitdet_b", help="a ViTDet preset (vitdet_toy, vitdet_b, vitdet_l, ...)")
    p.add_argument("--sizes", type=_sizes, default="256,384,512,512x768,768", help="comma-separated H or HxW in px")
    p.add_argument("--plot", default=None, help="write the plot to this PNG")
    p.add_argument("--repeats", type=_positive, default=2)

    p = sub.add_parser("train", parents=[common], help="training throughput per encoding (shapes Mask R-CNN)")
    p.add_argument("--which", "--family", dest="family", default="hieradet", choices=["hieradet", "vitdet"])
    p.add_argument("--encodings", type=_csv, default=None,
                   help="comma-separated, e.g. abswin,rope (default: every configs/shapes config of the family)")
    p.add_argument("--iters", type=_positive, default=5, help="timed iterations per encoding (default 5)")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast, as WinposTrainer runs it")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"])
    p.add_argument("--opts", nargs="*", default=[], metavar="KEY=VALUE",
                   help="config overrides for every encoding, e.g. dataloader.train.total_batch_size=2")

    p = sub.add_parser("train-step", parents=[common, memory],
                       help="one training step (fwd + bwd + AdamW) of ViTDet-B and HieraDet-B+ per encoding, with "
                            "detectron2's ViT; ratios to relpos and peak memory")
    p.add_argument("--size", type=_positive, default=1024, help="image side in px (default 1024)")
    p.add_argument("--families", type=_csv, default=["vitdet_b", "hieradet_bplus"])
    p.add_argument("--repeats", type=_positive, default=3)

    p = sub.add_parser("export", parents=[common], help="exported models vs eager: max error table, onnxruntime latency")
    p.add_argument("--parts", type=_csv, default=["errors", "latency"], help="errors, latency or both (default)")
    p.add_argument("--presets", type=_csv, default=["vitdet_toy", "hieradet_toy"],
                   help="backbone presets of the error table (every recipe of each)")
    p.add_argument("--recipes", type=_csv, default=None, help="recipes of the error table (default: all six)")
    p.add_argument("--sizes", type=_sizes, default="64,96", help="sizes of the error table, H or HxW in px")
    p.add_argument("--configs", type=_csv, default=[],
                   help="shapes detector configs (by name) for the error table, exported with random weights")
    p.add_argument("--latency-presets", type=_csv, default=["vitdet_b", "hieradet_b"])
    p.add_argument("--latency-recipes", type=_csv, default=["paper", "rope"])
    p.add_argument("--latency-size", type=positive_int, default=512, help="square input size in px (default 512)")
    p.add_argument("--repeats", type=_positive, default=5)

    sub.add_parser("kernels", add_help=False, help="Triton kernels vs SDPA (every argument goes to "
                   "winpos.bench.kernels; --help shows its options)")
    return parser


def _check_outputs(args) -> None:
    """The output files are checked before any timing: suffix, location, and not replaced without --force."""
    from winpos.utils.outputs import check_output_file

    if args.json:
        check_output_file(args.json, force=args.force, flag="--json", suffixes=(".json",))
    if getattr(args, "plot", None):
        check_output_file(args.plot, force=args.force, flag="--plot", suffixes=(".png", ".pdf", ".svg"))


def _kernels_args(rest: list[str]) -> list[str]:
    """The kernel benchmark's arguments, checked before it starts: --reps / --batch >= 1, --budget > 0, and its
    --json under the output policy (--force, taken here, replaces an existing file). Returns them without --force."""
    from winpos.utils.cli import finite_float
    from winpos.utils.outputs import check_output_file

    def positive_seconds(text: str) -> float:
        value = finite_float(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be a positive number of seconds, e.g. 420, got {text!r}")
        return value

    pre = ArgumentParser(prog="benchmark.py kernels", add_help=False)
    pre.add_argument("--json", default=None)
    pre.add_argument("--force", action="store_true")
    pre.add_argument("--reps", type=positive_int, default=None)
    pre.add_argument("--batch", type=positive_int, default=None)
    pre.add_argument("--budget", type=positive_seconds, default=None)
    known, _ = pre.parse_known_args(rest)
    if known.json:
        check_output_file(known.json, force=known.force, flag="--json", suffixes=(".json",))
    return [a for a in rest if a != "--force"]


def _toy_step(argv) -> int:
    """``benchmark.py toy-step --before TREE``: the reproduction's run cost, this checkout against another
    (``winpos.bench.toy_step``)."""
    from winpos.utils.cli import ArgumentParser

    p = ArgumentParser(prog="benchmark.py toy-step", description=_toy_step.__doc__)
    p.add_argument("--before", required=True, help="another winpos checkout (e.g. a git worktree of an older commit)")
    p.add_argument("--iters", type=positive_int, default=60, help="training iterations per run (default 60)")
    p.add_argument("--repeats", type=positive_int, default=2, help="rounds of one run each, side by side")
    p.add_argument("--json", default=None, help="write the rounds and medians here")
    p.add_argument("--force", action="store_true", help="replace an existing --json file")
    args = p.parse_args(argv)
    if args.json:
        from winpos.utils.outputs import check_output_file

        check_output_file(args.json, force=args.force, flag="--json", suffixes=(".json",))
    from winpos.bench import toy_step

    after = Path(__file__).resolve().parents[1]
    result = toy_step.compare(args.before, after, iters=args.iters, repeats=args.repeats)
    print(toy_step.format_compare(result, args.before, str(after)))
    if args.json:
        _write_json(args.json, result)
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["toy-step"]:
        return _toy_step(argv[1:])
    if argv[:1] == ["kernels"]:  # forwarded: the kernel benchmark has its own flags (--json, --dry-run)
        from winpos.bench import kernels

        return kernels.run(_kernels_args(argv[1:]))
    args = build_parser().parse_args(argv)
    _check_outputs(args)
    if args.what == "posemb" and args.size % 16:
        raise WinposError(f"--size {args.size} is not a multiple of the patch size 16; pass e.g. --size 1024")
    if args.what == "scaling":
        from winpos.bench import scaling

        scaling.check_preset(args.preset)
    device = _device(args.device) if hasattr(args, "device") else None
    torch.set_num_threads(args.threads)
    if args.what == "backbone":
        from winpos.bench import backbone

        result = backbone.run(img_size=args.size, which=args.which, repeats=args.repeats, bf16=args.bf16,
                              flops=args.flops, memory=args.memory, profile=args.profile,
                              device=device, warmup=args.warmup, rows=args.rows, compile=args.compile)
    elif args.what == "posemb":
        from winpos.bench import posemb

        result = posemb.run(grid=args.size // 16, repeats=args.repeats, warmup=args.warmup, memory=args.memory)
    elif args.what == "flex":
        from winpos.bench import posemb

        result = posemb.run_flex(sizes=args.sizes, terms=args.terms, repeats=args.repeats, warmup=args.warmup,
                                 memory=args.memory, device=device, compile_backend=args.flex_compile)
    elif args.what == "mlp":
        from winpos.bench import mlp

        result = mlp.run(divide=args.divide, repeats=args.repeats, warmup=args.warmup)
    elif args.what == "scaling":
        from winpos.bench import scaling

        result = scaling.run(preset=args.preset, sizes=args.sizes, repeats=args.repeats,
                             warmup=args.warmup, memory=args.memory, plot_path=args.plot)
    elif args.what == "export":
        from winpos.bench import export

        result = export.run(args.presets, args.recipes, [tuple(s) for s in args.sizes], args.configs,
                            args.latency_presets, args.latency_recipes, args.latency_size, args.repeats,
                            args.warmup, args.threads, parts=args.parts)
    elif args.what == "train-step":
        from winpos.bench import train_step

        result = train_step.run(families=tuple(args.families), img_size=args.size, repeats=args.repeats,
                                warmup=args.warmup, memory=args.memory)
    else:
        from winpos.bench import train

        result = train.run(Path(__file__).resolve().parents[1] / "configs" / "shapes", which=args.family, encodings=args.encodings, iters=args.iters, warmup=args.warmup,
                           bf16=args.bf16, overrides=args.opts, device=device, seed=args.seed)
    if args.json:
        _write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
