"""Position-embedding diagnostics.

    winpos-posemb plot CKPT [CKPT ...] [--sizes 448,1024] [--native-size 256] [--window 14]
                                   [--format auto] [--out DIR] [--pdf] [--no-progress]
        Loads each checkpoint safely (official Hiera, SAM2, SAM, timm, MAE, detectron2 ViTDet, winpos), extracts the
        embedding added to the tokens, and writes PNGs (channels + PCA with the window grid, period scan,
        window-by-window similarity) and report.json with every number and a verdict per size. Each verdict names
        its threshold. The native size is printed with where it came from (the stored grid and patch size, the
        run's config.yaml next to a winpos checkpoint, --native-size, or the format's training size). A checkpoint
        that cannot be read is reported in one "error:" line and the others are still analysed (exit status 2).
        An --out holding an earlier report.json or figures is refused unless --force (which removes them first).

    winpos-posemb doctor CONFIG_OR_PRESET [CONFIG_OR_PRESET ...] [--image-size N] [--recipe R]
                                     [--rope-trained-size PX] [--checkpoint CKPT] [--plots DIR]
                                     [--json PATH | --json -] [--force] [key=value ...]
        A target is a LazyConfig .py file (or a config name), a run's output_dir/config.yaml, or a backbone preset
        (presets need no detectron2). Says whether each model interpolates an absolute embedding under window
        attention at that size ([BUG]), which blocks are affected, and the fix (an override or command to paste);
        then, per block kind, what its RoPE (positions and rotation angles against the trained range:
        extrapolation, compression, aliasing) and relpos tables (how far they are stretched) see at that size
        ([WARN] where training never showed it). --checkpoint reads the learned RoPE frequencies and relpos table
        lengths of a converted winpos checkpoint of that model. --plots writes one figure per term. Several configs
        or presets run in one process. Exit status 1 when the bug is present in any (a warning alone is 0).
        Overrides are strict, as in winpos-train. --json PATH also writes every verdict, finding and number as JSON
        (schema_version, exit_status, one record per target; an existing file only with --force); --json - prints
        the JSON on stdout and the text on stderr.

Bad input (a file that is not a checkpoint or config, an override that names no key, --image-size 0), a package
missing here (detectron2 for a config) or a --json file or figure that cannot be written (a full disk): one "error:"
line and exit status 2, which no verdict uses (0 OK, 1 BUG).
"""
import argparse
import json
import os
import sys
from pathlib import Path

from winpos.errors import EXIT_FAILED, EXIT_USAGE, WinposError
from winpos.utils.cli import EXIT_ENVIRONMENT, ArgumentParser, int_list, positive_int, run_cli


def build_parser():
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plot", help="measure and plot checkpoints")
    p.add_argument("checkpoints", nargs="+")
    p.add_argument("--sizes", type=int_list, default=None,
                   help="target image sizes in px, comma separated (default: 1024 and twice the native size)")
    p.add_argument("--native-size", type=positive_int, default=None,
                   help="the image size in px the model was trained at, for abs-win checkpoints whose files do not "
                        "say it (default: the run's config.yaml next to a winpos checkpoint, else the format's: "
                        "SAM2 and winpos 1024)")
    p.add_argument("--window", type=positive_int, default=None, help="override the format's window size (tokens)")
    p.add_argument("--format", "--family", dest="format", default="auto",
                   help="checkpoint format: auto (detected), or sam2, hiera, timm_hiera, timm_abswin, sam, mae, "
                        "detectron2, winpos (the same names as winpos-convert --format)")
    p.add_argument("--out", default="output/posemb_viz", help="output folder (default: ./output/posemb_viz)")
    p.add_argument("--pdf", action="store_true")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--force", action="store_true",
                   help="replace the report.json and figures of an earlier run in --out (its listed figures are removed)")
    d = sub.add_parser("doctor", help="check configs or presets for the interpolation bug")
    d.add_argument("targets", nargs="+", metavar="TARGET",
                   help="LazyConfig .py files, a run's config.yaml or backbone preset names, then key=value overrides "
                        "(applied to each)")
    d.add_argument("--image-size", type=positive_int, default=None, help="image size in px (default: the model's)")
    d.add_argument("--recipe", default=None,
                   help="position-encoding recipe (original, paper, rope, lookhere; default: the config's own, or "
                        "original for a preset)")
    d.add_argument("--rope-trained-size", type=positive_int, default=None, metavar="PX",
                   help="image size in px the model's RoPE was trained at in this window layout (a detector "
                        "finetuned at 1024, SAM3's encoder at 1008): each block kind is compared with itself there "
                        "(default: the pretraining, global attention at pretrain_img_size)")
    d.add_argument("--checkpoint", default=None, metavar="CKPT",
                   help="a winpos checkpoint of the model (winpos-convert's output, or a trained detector's): its "
                        "learned RoPE frequencies and relpos tables are read (default: the model's own, learned "
                        "frequencies at their initialization)")
    d.add_argument("--plots", default=None, metavar="DIR",
                   help="write one figure per block term and model to DIR (<target>_rope.png, <target>_relpos.png)")
    d.add_argument("--json", default=None, metavar="PATH",
                   help="also write each target's verdict, findings and numbers as JSON to PATH (.json), or to "
                        "stdout with '-' (the text then goes to stderr)")
    d.add_argument("--force", action="store_true",
                   help="replace figures of an earlier run in --plots DIR, or an existing --json file")
    return parser


def run(argv=None):
    args = build_parser().parse_args(argv)
    if args.cmd == "plot":
        return _plot(args)
    return _doctor(args)


def _doctor(args):
    targets = [t for t in args.targets if "=" not in t]
    overrides = [t for t in args.targets if "=" in t]
    if not targets:
        raise WinposError("doctor: no config or preset given; pass e.g. configs/COCO/mask_rcnn_vitdet_b_100ep.py")
    from winpos.diagnostics.doctor import CONFIG_SUFFIXES

    json_stdout = args.json == "-"
    if args.json and not json_stdout:  # before any work, as every output
        from winpos.utils.outputs import check_output_file

        inputs = [t for t in targets if os.path.isfile(t)] + ([args.checkpoint] if args.checkpoint else [])
        check_output_file(args.json, inputs=inputs, force=args.force, flag="--json", suffixes=(".json",))
    if any(t.endswith(CONFIG_SUFFIXES) for t in targets):
        from winpos.d2.doctor import diagnose_many  # a config is loaded with detectron2's LazyConfig
    else:  # presets only: no detectron2 needed
        from winpos.diagnostics.doctor import diagnose_presets as diagnose_many

    # every model is checked (on the meta device: cheap) before anything is printed or written, so the figures
    # this run will write are known and the output folder is checked before any is
    results = list(diagnose_many(targets, args.image_size, args.recipe, overrides, args.rope_trained_size,
                                 args.checkpoint))
    stems = {target: f"{Path(target).stem}_{report.image_size}px" for target, report, _ in results if report}
    if args.plots:
        from winpos.diagnostics.term_plots import figure_names, plot_terms
        from winpos.utils.outputs import check_output_dir

        planned = [name for target, report, _ in results if report for name in figure_names(report, stems[target])]
        check_output_dir(args.plots, planned=planned, force=args.force, flag="--plots")
    text = sys.stderr if json_stdout else sys.stdout  # stdout carries only the JSON with --json -
    bug = errors = 0
    for target, report, error in results:
        if error:
            print(f"error: {error}", file=sys.stderr)
            errors += 1
            continue
        print(report.text(), file=text, flush=True)
        bug += not report.ok
        if args.plots:
            title = f"{report.target} at {report.image_size} px"
            for path in plot_terms(report.terms, args.plots, stems[target], title=title, doctor=report):
                print(f"  wrote {path}", file=text)
    status = EXIT_USAGE if errors else (1 if bug else 0)
    if args.json:
        from winpos.diagnostics.doctor import doctor_json

        document = doctor_json(results, status)
        if json_stdout:
            print(json.dumps(document, indent=1, allow_nan=False), flush=True)
        else:
            from winpos.utils.outputs import atomic_write_json

            atomic_write_json(args.json, document, allow_nan=False)
            print(f"wrote {args.json}")
    return status


def _plot(args):
    from winpos.diagnostics.plots import prepare_report_dir
    from winpos.diagnostics.report import run_posemb_viz

    prepare_report_dir(args.out, inputs=args.checkpoints, force=args.force)  # before any work
    result = run_posemb_viz(args.checkpoints, args.out, args.sizes, window=args.window, format=args.format,
                            pdf=args.pdf, progress=not args.no_progress, native_size=args.native_size)
    errors = 0
    for ckpt in result.get("checkpoints", []):
        if "error" in ckpt:
            print(f"error: {ckpt['error']}", file=sys.stderr)
            errors += 1
            continue
        for emb in ckpt.get("embeddings", []):
            native = "x".join(map(str, emb["native"]["image_px"]))
            print(f"{ckpt['path']}: {emb['name']} ({emb['format']}), native {native} px ({emb['native_from']})")
            for verdict in emb.get("verdicts", []):
                print(f"  {verdict}")
    print(f"wrote {'plots and ' if errors < len(result['checkpoints']) else ''}report.json to {args.out}")
    return EXIT_USAGE if errors else 0


def main(argv=None) -> int:
    """The command: ``run`` with bad input turned into one ``error:`` line and exit status 2; for ``doctor`` a write
    that fails (a full disk) too, since its 1 is the [BUG] verdict, which no failure may share."""
    doctor = list(sys.argv[1:] if argv is None else argv)[:1] == ["doctor"]  # the subcommand comes first
    return run_cli(run, argv, failed_status=EXIT_ENVIRONMENT if doctor else EXIT_FAILED)


if __name__ == "__main__":
    sys.exit(main())
