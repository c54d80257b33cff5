#!/usr/bin/env python
"""The main job on the embedded default (CPU, minutes): train tiny HieraDet Mask R-CNNs on the shapes dataset
with abs-win and with the naive absolute embedding, evaluate box/mask AP with pycocotools at several test sizes
(resolution sweep: JSON + PNG), and plot the trained position embedding.

    python tools/run_demo.py [--output output/demo] [--encodings abswin,abs] [--iters N] [--sizes 192,256,320,384]
                             [--dataset shapes1|shapes]

Re-running resumes finished or interrupted training from the last checkpoint.
"""
import argparse
import logging
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default="output/demo")
    parser.add_argument("--encodings", default="abswin,abs", help="comma list of: abswin, abs, rope, lookhere, paper")
    parser.add_argument("--iters", type=int, default=None, help="training iterations (default: the config's)")
    parser.add_argument("--sizes", default="192,256,320,384", help="test sizes of the resolution sweep (px)")
    parser.add_argument("--dataset", default="shapes1", choices=["shapes1", "shapes"],
                        help="shapes1: one class 'shape' (learns in minutes); shapes: four classes (needs far longer)")
    args = parser.parse_args(argv)
    from detectron2.utils.logger import setup_logger

    setup_logger(name="winpos")
    setup_logger(name="detectron2", abbrev_name="d2").setLevel(logging.WARNING)
    # but keep the training progress: losses, ETA, speed (detectron2's metric printer and timer hooks)
    for name in ("detectron2.utils.events", "detectron2.engine.hooks", "detectron2.evaluation.testing"):
        logging.getLogger(name).setLevel(logging.INFO)
    import winpos.d2  # noqa: F401  (registers backbones and the shapes dataset)
    from winpos.d2.demo import run_demo

    try:
        run_demo(args.output, tuple(e for e in args.encodings.split(",") if e), args.iters,
                 tuple(int(s) for s in args.sizes.split(",")), args.dataset)
    except ValueError as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
