#!/usr/bin/env python
"""Train or evaluate a winpos LazyConfig (flags as detectron2's tools/lazyconfig_train_net.py).

    tools/train_net.py --config-file configs/shapes/mask_rcnn_hieradet_toy_abswin.py
    tools/train_net.py --config-file CFG --resume                        # continue from output_dir/last_checkpoint
    tools/train_net.py --config-file CFG --force                         # replace the run already in output_dir
    tools/train_net.py --config-file CFG --eval-only train.init_checkpoint=out/model_final.pth
    tools/train_net.py --config-file CFG --num-gpus 8 dataloader.train.total_batch_size=16
    tools/train_net.py --config-file CFG --num-gpus 8 train.grad_accum_steps=4    # batch 64 = 8 GPUs x 4 x 2 images
    tools/train_net.py --config-file CFG --dataset mine=ann.json:images dataloader.train.dataset.names=mine

Overrides are strict: a key that does not exist is an error (add one on purpose with +key=value), and a value must
have the type of the one it replaces. Flags go before the overrides. --eval-only needs train.init_checkpoint
(or --random-weights to evaluate the untrained model on purpose). Runs on the CPU when there is no GPU (--num-gpus
N then starts N CPU processes over gloo). A train.output_dir that holds another run (checkpoints, metrics.json,
config.yaml) is refused unless --resume or --force, and one that a running train_net.py holds is refused naming it
(winpos.d2.run_dir). Bad input: one "error:" line and exit status 2. The logic is in
winpos.d2.engine.
"""
import sys

from winpos.errors import late_flags, quiet_third_party_warnings, run_cli


def main(argv=None):
    quiet_third_party_warnings()
    from winpos.d2.engine import build_parser, launch_main
    from winpos.d2.startup import check_before_launch

    parser = build_parser(__doc__)
    args = parser.parse_args(argv)
    late = late_flags(args.opts) or [o for o in args.opts if o.startswith("--")]
    if late:
        parser.error(f"{', '.join(late)} comes after the key=value overrides, which take the rest of the command "
                     "line; put every flag before the overrides")
    check_before_launch(args)  # a batch the processes and accumulation cannot make: one line, before launching
    launch_main(args)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
