"""Export a backbone or a whole detector to ONNX, a torch.export program (.pt2) and TorchScript, checked.

    winpos-export backbone PRESET [--recipe R] [--sizes 64,96x128] [--formats onnx,pt2,torchscript] --out DIR
                           [--set KEY=VALUE ...] [--precision float16]
        A backbone preset (vitdet_toy, vitdet_b, hieradet_toy, hieradet_b, ...; no detectron2 needed) with one of
        the recipes original, paper, relpos, rope, lookhere, none, at random initialization or with --weights (a
        winpos backbone checkpoint, e.g. winpos-convert's output); --set gives constructor arguments. With
        --precision float16 the matmuls and convolutions are float16 and LayerNorm stays float32 (safe for a
        float16 TensorRT build; docs/export.md), checked against the float32 eager model.
    winpos-export detector --config-file CFG (--checkpoint W | --random-weights) [--sizes ...] [--formats ...]
                           --out DIR [key=value ...]
        A LazyConfig by name (shapes/mask_rcnn_vitdet_toy_rope.py) or path, through detectron2's TracingAdapter:
        input one (3, H, W) image, outputs the instances' fields as a flat tuple (detectron2's export_model). The
        .pt2 program computes the same inference in a form torch.export takes (winpos.d2.export_program), with
        the number of detections dynamic.

After exporting, every file is run in the runtime that loads it (onnxruntime on the CPU, torch.export.load,
torch.jit.load) on a new random input of each checked size, and the max absolute error against the eager model is
printed. Above the tolerance (stated; --tolerance) the command writes nothing and exits 1. The attention takes the
reference path in every export (no Triton kernel in a graph); the output says so. ONNX (opset >= 17) and
TorchScript graphs hold one input size each (<stem>_<H>x<W>.onnx / .ts); the .pt2 program has dynamic height and
width where the model allows it (a backbone without a position term; a detector that pads every image to one
square, up to that square), else one per size. <stem>_export.json records the checks.

Bad input (an unknown preset or recipe, a size the model cannot take, onnxruntime missing for --formats onnx, an op
that cannot be exported): one "error:" line naming the fix, exit status 2, nothing written. Outputs already in
--out are replaced only with --force.
"""
import argparse
import re
import sys

from winpos.utils.cli import ArgumentParser, constructor_overrides, positive_int, run_cli
from winpos.utils.config_names import CONFIG_FILE_HELP

FORMAT_NAMES = ("onnx", "pt2", "torchscript")
PRECISION_NAMES = ("float32", "float16")  # float16: winpos.backbones.export.Fp16Graph (backbones only)


def size_list(text: str) -> list[tuple[int, int]]:
    """argparse type: comma-separated sizes in px, ``64`` (square) or ``64x96`` (height x width)."""
    sizes = []
    for item in (s.strip() for s in str(text).split(",") if s.strip()):
        m = re.fullmatch(r"(\d+)(?:x(\d+))?", item)
        if not m or int(m.group(1)) < 1 or (m.group(2) and int(m.group(2)) < 1):
            raise argparse.ArgumentTypeError(f"expected sizes such as 64,96x128 (px, height x width), got {text!r}")
        sizes.append((int(m.group(1)), int(m.group(2) or m.group(1))))
    if not sizes:
        raise argparse.ArgumentTypeError(f"expected sizes such as 64,96x128 (px, height x width), got {text!r}")
    return sizes


def format_list(text: str) -> list[str]:
    names = [s.strip() for s in str(text).split(",") if s.strip()]
    bad = [n for n in names if n not in FORMAT_NAMES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown format {bad[0] if bad else text!r}; choose from "
                                         f"{','.join(FORMAT_NAMES)}")
    return list(dict.fromkeys(names))


def tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive max absolute error such as 1e-4, got {text!r}")
    return value


def build_parser():
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    b = sub.add_parser("backbone", help="a backbone preset and recipe (no detectron2)")
    b.add_argument("preset", help="backbone preset, e.g. vitdet_toy, vitdet_b, hieradet_toy")
    b.add_argument("--recipe", default="original",
                   help="original, paper, relpos, rope, lookhere or none (default: original)")
    b.add_argument("--weights", default=None, help="a winpos backbone checkpoint (default: random initialization)")
    b.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="a constructor argument of the backbone, e.g. --set pos_antialias=True (repeatable)")
    b.add_argument("--precision", choices=PRECISION_NAMES, default="float32",
                   help="float16: every Linear and Conv2d in float16 (weights stored in float16), the token stream "
                        "and every LayerNorm in float32, input and outputs float32; checked against the float32 "
                        "eager model (default: float32)")
    d = sub.add_parser("detector", help="a LazyConfig's detector through detectron2's TracingAdapter")
    d.add_argument("--config-file", dest="config", required=True, metavar="FILE", help=CONFIG_FILE_HELP)
    d.add_argument("--checkpoint", default="", help="weights (default: the config's train.init_checkpoint)")
    d.add_argument("--random-weights", action="store_true", help="export the untrained detector on purpose")
    d.add_argument("--precision", choices=PRECISION_NAMES, default="float32",
                   help="float32 only: a whole detector is not exported in float16 (its ROI ops and box arithmetic "
                        "stay float32); export the backbone with --precision float16")
    d.add_argument("opts", nargs=argparse.REMAINDER, help="config overrides key=value (after every flag)")
    for p in (b, d):
        p.add_argument("--sizes", type=size_list, default=None,
                       help="input sizes checked and exported, px (default: 64,96 for a backbone, 64x96 for a "
                            "detector)")
        p.add_argument("--formats", type=format_list, default=None,
                       help="comma-separated: onnx, pt2, torchscript (default: all three)")
        p.add_argument("--opset", type=positive_int, default=17, help="ONNX opset (>= 17; default 17)")
        p.add_argument("--tolerance", type=tolerance, default=None,
                       help="max absolute error against eager (default: 1e-4 for a backbone, 1e-3 for a detector)")
        p.add_argument("--out", required=True, help="output folder")
        p.add_argument("--force", action="store_true", help="replace files of an earlier export in --out")
    return parser


def run(argv=None):
    args = build_parser().parse_args(argv)
    from winpos.backbones.export import check_onnx_setup, planned_names, write_export
    from winpos.utils.outputs import check_output_dir

    args.formats = args.formats or list(FORMAT_NAMES)
    if "onnx" in args.formats:
        check_onnx_setup(args.opset)  # before any work
    if args.what == "backbone":
        result, stem, meta = _backbone(args, check_output_dir, planned_names)
    else:
        result, stem, meta = _detector(args, check_output_dir, planned_names)
    for note in result.notes:
        print(note)
    print(result.table())
    print(f"tolerance: max |error| <= {result.tolerance:g} against eager (float32, CPU)"
          + (f"; float16: 2 x the float16 graph's own eager error {result.eager_error:.2e}, + 1e-4"
             if result.eager_error is not None else ""))
    if not result.ok:
        print(f"error: {result.failure()}", file=sys.stderr)
        return 1
    names = write_export(args.out, stem, result, meta, force=args.force)
    print(f"wrote {len(names)} files to {args.out}")
    return 0


def _backbone(args, check_output_dir, planned_names):
    import torch

    from winpos.backbones.export import TOLERANCE, Fp16Graph, build_backbone, export_and_check, fp16_tolerance

    sizes = args.sizes or [(64, 64), (96, 96)]
    stem = f"{args.preset}_{args.recipe}" + ("_fp16" if args.precision == "float16" else "")
    check_output_dir(args.out, [args.weights] if args.weights else [], planned_names(stem, args.formats, sizes),
                     force=args.force, flag="--out")
    model = build_backbone(args.preset, args.recipe, **constructor_overrides(args.overrides))
    if args.weights:
        from winpos.checkpoints.io import load_checkpoint_object, unwrap_state_dict
        from winpos.errors import WinposError

        try:
            model.load_state_dict(unwrap_state_dict(load_checkpoint_object(args.weights), args.weights))
        except RuntimeError as e:  # missing / unexpected keys, shapes
            first = str(e).strip().splitlines()[-1].strip()
            raise WinposError(f"--weights {args.weights} does not fit {args.preset} with recipe {args.recipe} "
                              f"({first[:200]}); convert it first (winpos-convert) or pick its preset and "
                              "--recipe") from None
    generator = torch.Generator().manual_seed(0)
    example = lambda s: torch.randn(1, model.in_chans, *s, generator=generator)  # noqa: E731
    tol, exported, eager_error = args.tolerance or TOLERANCE, {}, None
    if args.precision == "float16":
        graph = Fp16Graph(model).eval()
        exported = {fmt: graph for fmt in args.formats}
        auto, eager_error = fp16_tolerance(model, graph, example, sizes)  # refuses a model fp16 cannot hold
        tol = args.tolerance or auto
    result = export_and_check(model, stem, sizes, args.formats, opset=args.opset, tolerance=tol,
                              stride=getattr(model, "patch_size", 32), example=example, exported=exported)
    if eager_error is not None:
        result.eager_error = eager_error
        result.notes.append("float16: Linear and Conv2d in float16 (weights stored in float16); the token stream "
                            "and every LayerNorm in float32; input and outputs float32")
    return result, stem, {"backbone": args.preset, "recipe": args.recipe, "overrides": args.overrides,
                          "weights": args.weights, "opset": args.opset, "precision": args.precision,
                          "float16_eager_error": eager_error}


def _detector(args, check_output_dir, planned_names):
    from pathlib import Path

    from winpos.d2.export import DETECTOR_TOLERANCE, build_detector, export_detector

    from winpos.errors import WinposError

    if args.precision != "float32":
        raise WinposError("winpos-export detector exports float32 only (the detector's ROI ops and box arithmetic "
                          "stay float32); export its backbone with winpos-export backbone ... --precision float16")
    sizes = args.sizes or [(64, 96)]
    stem = Path(args.config).stem
    check_output_dir(args.out, [args.checkpoint] if args.checkpoint else [],
                     planned_names(stem, args.formats, sizes), force=args.force, flag="--out")
    _, model = build_detector(args.config, args.checkpoint, args.opts, args.random_weights)
    result = export_detector(model, stem, sizes, args.formats, args.opset, args.tolerance or DETECTOR_TOLERANCE)
    return result, stem, {"config": args.config, "checkpoint": args.checkpoint or None, "opset": args.opset,
                          "inputs": "one (3, H, W) image, detectron2's TracingAdapter", "overrides": args.opts}


def main(argv=None) -> int:
    """The command: ``run`` with bad input turned into one ``error:`` line and exit status 2."""
    return run_cli(run, argv)


if __name__ == "__main__":
    sys.exit(main())
