#!/usr/bin/env python
"""Run a config's model on images or folders and write drawings of its predictions plus predictions.json.

    tools/predict.py --config-file configs/shapes/mask_rcnn_hieradet_tiny_abswin.py \
        --checkpoint output/shapes/mask_rcnn_hieradet_tiny_abswin/model_final.pth --input img.png folder/ \
        --output preds/ [--score-thresh 0.5] [key=value ...]

The logic is in winpos.d2.predict.
"""
import argparse
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config-file", required=True)
    parser.add_argument("--checkpoint", default="", help="weights (default: the config's train.init_checkpoint)")
    parser.add_argument("--input", nargs="+", required=True, help="image files or folders")
    parser.add_argument("--output", required=True, help="folder for the drawings and predictions.json")
    parser.add_argument("--score-thresh", type=float, default=0.5)
    parser.add_argument("opts", nargs=argparse.REMAINDER, help="config overrides key=value")
    args = parser.parse_args(argv)

    from detectron2.utils.logger import setup_logger

    from winpos.d2.checkpoint import WinposCheckpointer, load_init_checkpoint
    from winpos.d2.config import load_config
    from winpos.d2.engine import build_model, resolve_device
    from winpos.d2.predict import predict_images

    setup_logger(name="winpos")
    cfg = load_config(args.config_file, args.opts)
    cfg.train.device = resolve_device(cfg)
    model = build_model(cfg)
    load_init_checkpoint(WinposCheckpointer(model), args.checkpoint or cfg.train.init_checkpoint)
    records = predict_images(cfg, model, args.input, args.output, args.score_thresh)
    print(f"{len(records)} images -> {args.output}")


if __name__ == "__main__":
    try:
        main()
    except ValueError as e:
        sys.exit(f"error: {e}")
