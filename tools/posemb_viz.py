#!/usr/bin/env python
"""Position-embedding diagnostics.

    python tools/posemb_viz.py plot CKPT [CKPT ...] [--sizes 448,1024] [--window 14] [--format auto] [--out DIR] [--pdf]
        Loads each checkpoint safely (official Hiera, SAM2, SAM, timm, MAE, detectron2 ViTDet, winpos), extracts the
        embedding added to the tokens, and writes PNGs (channels + PCA with the window grid, period scan,
        window-by-window similarity) and report.json with every number and a verdict per size.

    python tools/posemb_viz.py doctor CONFIG_OR_PRESET [--image-size N] [--recipe R] [key=value ...]
        Says whether the model interpolates an absolute embedding under window attention at that size, which blocks
        are affected, and the fix. Exit status 1 when the bug is present. Overrides are strict, as in train_net.py.

Bad input (a file that is not a checkpoint or config, an override that names no key, --image-size 0): one
"error:" line and exit status 2.
"""
import argparse
import sys

from winpos.errors import ArgumentParser, int_list, positive_int, run_cli


def main(argv=None):
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plot", help="measure and plot checkpoints")
    p.add_argument("checkpoints", nargs="+")
    p.add_argument("--sizes", type=int_list, default=None,
                   help="target image sizes in px, comma separated (default: per format)")
    p.add_argument("--window", type=positive_int, default=None, help="override the format's window size (tokens)")
    p.add_argument("--format", "--family", dest="format", default="auto",
                   help="checkpoint format: auto (detected), or sam2, hiera, timm_hiera, timm_abswin, sam, mae, "
                        "detectron2, winpos (the same names as convert_checkpoint.py --format)")
    p.add_argument("--out", default="output/posemb_viz")
    p.add_argument("--pdf", action="store_true")
    p.add_argument("--force", action="store_true",
                   help="replace the report.json and figures of an earlier run in --out (its listed figures are removed)")
    d = sub.add_parser("doctor", help="check a config or preset for the interpolation bug")
    d.add_argument("target", help="a LazyConfig .py file or a backbone preset name")
    d.add_argument("--image-size", type=positive_int, default=None, help="image size in px (default: the model's)")
    d.add_argument("--recipe", default=None,
                   help="position-encoding recipe (original, paper, rope, lookhere; default: the config's own, or "
                        "original for a preset)")
    d.add_argument("overrides", nargs="*", help="key=value overrides")
    args = parser.parse_args(argv)
    if args.cmd == "plot":
        from winpos.diagnostics.plots import prepare_report_dir
        from winpos.diagnostics.report import run_posemb_viz

        prepare_report_dir(args.out, inputs=args.checkpoints, force=args.force)  # before any work
        result = run_posemb_viz(args.checkpoints, args.out, args.sizes, window=args.window, format=args.format,
                                pdf=args.pdf)
        for ckpt in result.get("checkpoints", []):
            for emb in ckpt.get("embeddings", []):
                for entry in emb.get("targets", []):
                    if entry.get("verdict"):
                        print(f"{emb.get('name', ckpt.get('path', ''))}: {entry['verdict']}")
        print(f"wrote plots and report.json to {args.out}")
        return 0
    from winpos.d2.doctor import diagnose

    report = diagnose(args.target, args.image_size, args.recipe, args.overrides)
    print(report.text())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(run_cli(main))
