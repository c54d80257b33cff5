"""The main job on the embedded default (CPU, 2 cores, aim: under 10 minutes): the short form of winpos-reproduce.

Starts from the stage-1 checkpoint shipped with winpos (``winpos.model_zoo.demo_checkpoint()``: a small HieraDet
Mask R-CNN trained at 64 px from a backbone whose absolute embedding learned a window pattern from a random start;
command, seeds, SHA-256 and the stage-0 history in the manifest next to it). At --multiplier times its token grid
it evaluates the embedding naively interpolated and converted exactly to abs-win, without finetuning and after
finetuning with paired seeds (95% t-interval of the difference), then runs the doctor on the same model and plots
the result.

    winpos-demo [--output output/demo] [--multiplier 1.25] [--condition canvas] [--iters 200]
        [--seeds 0,1,2] [--workers 2] [--force]

A re-run with the same settings reuses finished runs; other settings in the same folder are refused.
"""
import sys
from pathlib import Path

from winpos.utils.cli import ArgumentParser, finite_float, positive_int, run_cli, seed_list

CONFIG = "shapes/reproduce_hieradet.py"  # a winpos.model_zoo name


def run(argv=None):
    import argparse

    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", default="output/demo")
    p.add_argument("--multiplier", type=finite_float, default=1.25,
                   help="token-grid multiplier (default 1.25: the largest zero-shot gap of the shipped detector "
                        "over 1.25-4x, both conditions, one evaluation each)")
    p.add_argument("--condition", choices=("upscaled", "canvas"), default="canvas",
                   help="a larger canvas of same-size objects (default) or upscaled 64 px images")
    p.add_argument("--iters", type=positive_int, default=200, help="finetuning iterations per run (batch 8)")
    p.add_argument("--lr", type=finite_float, default=2e-4, help="finetuning learning rate (AdamW)")
    p.add_argument("--seeds", type=seed_list, default=[0, 1, 2], help="comma list of paired finetuning seeds")
    p.add_argument("--workers", type=positive_int, default=2, help="runs at a time (one torch thread each)")
    p.add_argument("--checkpoint", default=None, help="stage-1 checkpoint (default: the one shipped with winpos)")
    p.add_argument("--manifest", default=None, help="its manifest with the SHA-256 (default: next to it)")
    p.add_argument("--force", action="store_true",
                   help="start over in --output: remove the demo folder there first (only a folder a demo or "
                        "reproduction made, one holding protocol.json); without it, runs made with other settings "
                        "are refused and identical ones reused")
    args = p.parse_args(argv)
    from winpos.cli import require_detectron2

    require_detectron2()  # its runs train and evaluate with detectron2: a missing one is said before any work
    from winpos.experiments.demo import print_summary, run_demo
    from winpos.model_zoo import config_path, demo_checkpoint

    checkpoint = args.checkpoint or str(demo_checkpoint())  # a missing one: one line saying where it ships

    if args.force and Path(args.output).exists():
        import shutil

        from winpos.errors import WinposError

        if not (Path(args.output) / "protocol.json").is_file():
            raise WinposError(f"--force removes only a folder made by the demo or winpos-reproduce (one with "
                              f"protocol.json); {args.output} is not one: pass another --output")
        shutil.rmtree(args.output)

    manifest = args.manifest or str(Path(checkpoint).with_suffix(".json"))
    summary = run_demo(config_path(CONFIG), checkpoint, manifest, args.output, args.multiplier, args.condition,
                       args.iters, tuple(args.seeds), args.workers, args.lr,
                       log=lambda m: print(f"[demo] {m}", flush=True))
    print_summary(summary, args.output)
    return 0


def main(argv=None) -> int:
    """The command: ``run`` with bad input turned into one ``error:`` line and exit status 2."""
    return run_cli(run, argv)


if __name__ == "__main__":
    sys.exit(main())
