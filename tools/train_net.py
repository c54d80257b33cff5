#!/usr/bin/env python
"""Train or evaluate a winpos LazyConfig (flags as detectron2's tools/lazyconfig_train_net.py).

    tools/train_net.py --config-file configs/shapes/mask_rcnn_hieradet_tiny_abswin.py
    tools/train_net.py --config-file CFG --resume                        # continue from output_dir/last_checkpoint
    tools/train_net.py --config-file CFG --eval-only train.init_checkpoint=out/model_final.pth
    tools/train_net.py --config-file CFG --num-gpus 8 dataloader.train.total_batch_size=16
    tools/train_net.py --config-file CFG --dataset mine=ann.json:images dataloader.train.dataset.names=mine

Overrides are strict: a key that does not exist is an error (add one on purpose with +key=value). Runs on the CPU
when there is no GPU (--num-gpus N then starts N CPU processes over gloo). The logic is in winpos.d2.engine.
"""
import sys

from winpos.d2.engine import build_parser, launch_main

if __name__ == "__main__":
    args = build_parser(__doc__).parse_args()
    try:
        launch_main(args)
    except ValueError as e:  # bad input: one readable line instead of a traceback
        sys.exit(f"error: {e}")
