r"""Evaluate a config + checkpoint on a COCO-format dataset: box and mask AP (AP, AP50, AP75, APs, APm, APl) with the
official pycocotools, optionally at several test sizes (JSON + PNG plot of AP vs size) and with inference speed.

    winpos-eval --config-file COCO/mask_rcnn_vitdet_b_100ep.py --checkpoint model_final.pth \
        model.backbone.net.recipe=paper
    winpos-eval --config-file CFG --checkpoint W --sizes 512,768,1024 --fps --output eval_out/
    winpos-eval --config-file CFG --checkpoint W --dataset mine=ann.json:images --test-dataset mine
    winpos-eval --config-file CFG --checkpoint W2 --sizes 512,768,1024 --output eval2/ \
        --compare original=eval_out/resolution_sweep.json            # both recipes in one plot

A training run's own output_dir/config.yaml is a config file too: it carries every override the run had
(num_classes, datasets), so nothing needs repeating. The model's class count must match the test dataset's
(checked before any work). --fps times --warmup images first, so the test set needs more than that.

Weights are required. Results already in --output are replaced only with --force. Flags go before the key=value
overrides. Bad input: one "error:" line and exit status 2. The logic is in winpos.d2.evaluate.
"""
import sys

from winpos.utils.cli import ArgumentParser, int_list, nonnegative_int, quiet_third_party_warnings, run_cli
from winpos.utils.config_names import CONFIG_FILE_HELP


def build_parser():
    import argparse

    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config-file", required=True, metavar="FILE", help=CONFIG_FILE_HELP)
    parser.add_argument("--checkpoint", default="", help="weights (default: the config's train.init_checkpoint)")
    parser.add_argument("--dataset", action="append", default=[], metavar="NAME=JSON:IMAGE_ROOT",
                        help="register a COCO-format dataset first (repeatable)")
    parser.add_argument("--test-dataset", default=None, help="dataset to evaluate (default: the config's test set)")
    parser.add_argument("--sizes", type=int_list, default=None, help="comma-separated test sizes, e.g. 512,768,1024")
    parser.add_argument("--fps", action="store_true", help="also measure images/s at batch 1")
    parser.add_argument("--warmup", type=nonnegative_int, default=5,
                        help="with --fps: images run before the timing starts (default 5)")
    parser.add_argument("--label", default="", help="this run's line in the sweep plot (default: preset and recipe)")
    parser.add_argument("--compare", action="append", default=[], metavar="LABEL=SWEEP_JSON",
                        help="draw an earlier run's resolution_sweep.json in the same plot (repeatable; with --sizes)")
    parser.add_argument("--output", default=None, help="output folder (default: <train.output_dir>/eval)")
    parser.add_argument("--force", action="store_true", help="replace results already in the output folder")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("opts", nargs=argparse.REMAINDER, help="config overrides key=value (after every flag)")
    return parser


def run(argv=None):
    args = build_parser().parse_args(argv)
    quiet_third_party_warnings()
    from winpos.d2.engine import register_cli_datasets
    from winpos.d2.evaluate import evaluate_checkpoint
    from winpos.d2.startup import console_logging

    console_logging()
    register_cli_datasets(args.dataset)
    results = evaluate_checkpoint(args.config_file, args.checkpoint, overrides=args.opts, sizes=args.sizes,
                                  fps=args.fps, output_dir=args.output, test_dataset=args.test_dataset,
                                  progress=not args.no_progress, force=args.force, warmup=args.warmup,
                                  label=args.label, compare=args.compare)
    if not args.sizes:  # a sweep logs its size x AP table itself
        from winpos.d2.evaluate import sweep_table

        print(sweep_table({"(config)": results}))
    return 0


def main(argv=None) -> int:
    """The command: ``run`` with bad input turned into one ``error:`` line and exit status 2."""
    return run_cli(run, argv)


if __name__ == "__main__":
    sys.exit(main())
