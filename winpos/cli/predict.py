r"""Run a config's model on images, folders, a video file or a camera and write drawings of its predictions (an
annotated video for a video or camera) plus predictions.json.

    winpos-predict --config-file shapes/mask_rcnn_hieradet_toy_abswin.py \
        --checkpoint output/shapes/mask_rcnn_hieradet_toy_abswin/model_final.pth --input img.png folder/ \
        --output preds/ [--score-thresh 0.5] [--dataset NAME=JSON:IMAGE_ROOT] [--no-progress] [--force] [key=value ...]
    winpos-predict --config-file CFG --checkpoint W --video-input clip.mp4 --output preds/     # preds/clip.mp4
    winpos-predict --config-file CFG --checkpoint W --webcam 0 --max-frames 300 --output cam/  # cam/webcam0.mp4
    winpos-predict ... --drawer detectron2                                  # drawn by detectron2's Visualizer

Classes are drawn by name: those of the config's test dataset (a training run's output_dir/config.yaml names it;
register your own with --dataset, as in winpos-train and winpos-eval). predictions.json holds per image the boxes
(XYXY px), scores, class ids and names, and the masks as COCO run-length encodings; for a video, the same per
frame. A camera runs until --max-frames or Ctrl-C.

Weights are required (--checkpoint, or the config's train.init_checkpoint); --random-weights runs the untrained
model on purpose. --output must be a folder of its own (not one holding the inputs); drawings already there are
replaced only with --force. The outputs are complete or absent: a run stopped half way (Ctrl-C, a full disk, a file
size limit) leaves the earlier video or drawings and predictions.json as they were, and --force on images removes
the earlier drawings the new predictions.json does not list. Each input gets its own drawing name (x.png, x-2.png for a second x). An unreadable
image is skipped and listed with its error in predictions.json; the exit status is then 1. Exit status 2 for bad
input. The logic is in winpos.d2.predict.
"""
import sys

from winpos.errors import EXIT_FAILED, WinposError
from winpos.utils.cli import (ArgumentParser, finite_float, late_flags, nonnegative_int, positive_int,
                              quiet_third_party_warnings, run_cli)
from winpos.utils.config_names import CONFIG_FILE_HELP

VIDEO_EXTS = (".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v", ".mpg", ".mpeg")


def build_parser():
    import argparse

    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config-file", required=True, metavar="FILE", help=CONFIG_FILE_HELP)
    parser.add_argument("--checkpoint", default="", help="weights (default: the config's train.init_checkpoint)")
    parser.add_argument("--random-weights", action="store_true",
                        help="run without weights (an untrained model: its drawings are noise)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--input", nargs="+", help="image files or folders")
    source.add_argument("--video-input", default=None, metavar="FILE", help="a video file (written back annotated)")
    source.add_argument("--webcam", type=nonnegative_int, default=None, metavar="INDEX",
                        help="a camera index, e.g. 0 (recorded annotated until --max-frames or Ctrl-C)")
    parser.add_argument("--max-frames", type=positive_int, default=None, help="with a video or camera: stop after N")
    parser.add_argument("--drawer", choices=("winpos", "detectron2"), default="winpos",
                        help="draw with winpos (PIL) or detectron2's Visualizer")
    parser.add_argument("--output", required=True, help="folder for the drawings and predictions.json")
    parser.add_argument("--score-thresh", type=finite_float, default=0.5)
    parser.add_argument("--dataset", action="append", default=[], metavar="NAME=JSON:IMAGE_ROOT",
                        help="register a COCO-format dataset first, for its class names (repeatable)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--force", action="store_true", help="replace drawings and predictions.json already there")
    parser.add_argument("opts", nargs=argparse.REMAINDER, help="config overrides key=value (after every flag)")
    return parser


def run(argv=None):
    args = build_parser().parse_args(argv)
    from pathlib import Path

    images = args.input or []
    misplaced = [i for i in images if late_flags([i]) == [] and "=" in i and not Path(i).exists()
                 and "." in i.split("=", 1)[0]]
    if misplaced:
        raise WinposError(f"--input took the override {misplaced[0]!r} as an image; put the key=value overrides "
                          "after every flag, e.g. --input img.png --output preds/ train.device=cpu")
    videos = [i for i in images if Path(i).suffix.lower() in VIDEO_EXTS]
    if videos:
        raise WinposError(f"--input {videos[0]} is a video; pass it as --video-input {videos[0]} (one video a run)")
    if args.max_frames and not (args.video_input or args.webcam is not None):
        raise WinposError("--max-frames applies to --video-input or --webcam; drop it for images")
    quiet_third_party_warnings()
    from winpos.d2.config import load_config
    from winpos.d2.engine import register_cli_datasets
    from winpos.d2.own_data import check_num_classes

    register_cli_datasets(args.dataset)
    cfg = load_config(args.config_file, args.opts)
    check_num_classes(cfg, ("test",))
    checkpoint = args.checkpoint or cfg.train.init_checkpoint
    if checkpoint and args.random_weights:
        raise WinposError(f"--random-weights and weights ({checkpoint}) were both given; drop one of them")
    if not checkpoint and not args.random_weights:
        raise WinposError("no weights: pass --checkpoint (or set train.init_checkpoint=...), or --random-weights to "
                          "run the untrained model on purpose")
    from winpos.d2.checkpoint import WinposCheckpointer, load_init_checkpoint
    from winpos.d2.engine import build_model, resolve_device
    from winpos.d2.predict import plan_outputs, predict_images
    from winpos.d2.startup import console_logging

    if images:
        plan_outputs(images, args.output, force=args.force)  # the output folder is checked before any work
    else:
        from winpos.d2.video import open_source, video_name
        from winpos.utils.outputs import check_output_dir

        source = args.webcam if args.webcam is not None else args.video_input
        check_output_dir(args.output, [] if args.webcam is not None else [source],
                         [video_name(source), "predictions.json"], force=args.force)
        open_source(source).release()  # a video OpenCV cannot open, or no camera: refused before the model is built
    console_logging("winpos")
    cfg.train.device = resolve_device(cfg)
    model = build_model(cfg)
    if checkpoint:
        load_init_checkpoint(WinposCheckpointer(model), checkpoint)  # logs its load report
    if not images:
        from winpos.d2.video import predict_video

        frames = predict_video(cfg, model, source, args.output, args.score_thresh, force=args.force,
                               progress=not args.no_progress, max_frames=args.max_frames, drawer=args.drawer)
        print(f"{len(frames)} frames -> {Path(args.output) / video_name(source)}")
        return 0
    records = predict_images(cfg, model, images, args.output, args.score_thresh, force=args.force,
                             progress=not args.no_progress, drawer=args.drawer)
    skipped = [r for r in records if "error" in r]
    print(f"{len(records) - len(skipped)} images -> {args.output}" +
          (f"; {len(skipped)} skipped (e.g. {skipped[0]['file']}: {skipped[0]['error']})" if skipped else ""))
    return EXIT_FAILED if skipped else 0


def main(argv=None) -> int:
    """The command: ``run`` with bad input turned into one ``error:`` line and exit status 2."""
    return run_cli(run, argv)


if __name__ == "__main__":
    sys.exit(main())
