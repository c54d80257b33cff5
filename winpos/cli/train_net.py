"""Train or evaluate a winpos LazyConfig (flags as detectron2's tools/lazyconfig_train_net.py).

    winpos-train --config-file configs/shapes/mask_rcnn_hieradet_toy_abswin.py
    winpos-train --config-file CFG --resume                        # continue from output_dir/last_checkpoint
    winpos-train --config-file CFG --force                         # replace the run already in output_dir
    winpos-train --config-file CFG --eval-only train.init_checkpoint=out/model_final.pth
    winpos-train --config-file CFG --num-gpus 8 dataloader.train.total_batch_size=16
    winpos-train --config-file CFG --num-gpus 8 train.grad_accum_steps=4    # batch 64 = 8 GPUs x 4 x 2 images
    winpos-train --config-file CFG --dataset mine=ann.json:images dataloader.train.dataset.names=mine

Overrides are strict: a key that does not exist is an error (add one on purpose with +key=value), and a value must
have the type of the one it replaces. Flags go before the overrides. --eval-only needs train.init_checkpoint
(or --random-weights to evaluate the untrained model on purpose). Runs on the CPU when there is no GPU (--num-gpus
N then starts N CPU processes over gloo). A train.output_dir that holds another run (checkpoints, metrics.json,
config.yaml) is refused unless --resume or --force, and one that a running winpos-train holds is refused naming it
(winpos.d2.run_dir). --resume continues the run exactly (every process's RNG state is saved) and refuses a change of
seed, total batch, model, optimizer or schedule naming it (train.max_iter may change: said, and config.yaml
rewritten); on a run trained to the end but not evaluated it runs the final evaluation. --eval-only does not
replace the evaluation already in train.output_dir/inference without --force. Bad input: one "error:" line and exit
status 2, also with --num-gpus N. The logic is in winpos.d2.engine.
"""
import argparse
import sys

from winpos.config_names import CONFIG_FILE_HELP
from winpos.errors import ArgumentParser, late_flags, nonnegative_int, positive_int, quiet_third_party_warnings, run_cli


def build_parser():
    """detectron2's ``default_argument_parser`` flags plus winpos's, built without importing torch or detectron2 so
    that ``--help`` and argument errors come at once (tests/test_tools_cli.py keeps the flags equal to
    ``winpos.d2.engine.build_parser``'s)."""
    parser = ArgumentParser(epilog=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config-file", default="", metavar="FILE", help=CONFIG_FILE_HELP)
    parser.add_argument("--resume", action="store_true",
                        help="continue from train.output_dir/last_checkpoint (exact resume)")
    parser.add_argument("--eval-only", action="store_true", help="perform evaluation only")
    parser.add_argument("--num-gpus", type=positive_int, default=1, help="number of processes per machine")
    parser.add_argument("--num-machines", type=positive_int, default=1, help="total number of machines")
    parser.add_argument("--machine-rank", type=nonnegative_int, default=0,
                        help="the rank of this machine (unique per machine)")
    parser.add_argument("--dist-url", default="auto",
                        help="initialization URL for multi-process runs (auto: a free local port)")
    parser.add_argument("--random-weights", action="store_true",
                        help="with --eval-only: evaluate the untrained model on purpose (no train.init_checkpoint)")
    parser.add_argument("--dataset", action="append", default=[], metavar="NAME=JSON:IMAGE_ROOT",
                        help="register a COCO-format dataset under NAME before the config is used (repeatable); "
                             "bad annotations are skipped and counted; model.roi_heads.num_classes must match its "
                             "categories (checked at start)")
    parser.add_argument("--force", action="store_true",
                        help="replace the run already in train.output_dir (its checkpoints, metrics and config are "
                             "removed first), or with --eval-only the evaluation in train.output_dir/inference; "
                             "without it such a folder is refused unless --resume")
    parser.add_argument("opts", nargs=argparse.REMAINDER, help="config overrides key=value (after every flag)")
    return parser


def run(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    quiet_third_party_warnings()
    from winpos.d2.engine import launch_main
    from winpos.d2.startup import check_before_launch

    late = late_flags(args.opts) or [o for o in args.opts if o.startswith("--")]
    if late:
        parser.error(f"{', '.join(late)} comes after the key=value overrides, which take the rest of the command "
                     "line; put every flag before the overrides")
    check_before_launch(args)  # a batch the processes and accumulation cannot make: one line, before launching
    launch_main(args)
    return 0


def main(argv=None) -> int:
    """The command: ``run`` with bad input turned into one ``error:`` line and exit status 2."""
    return run_cli(run, argv)


if __name__ == "__main__":
    sys.exit(main())
