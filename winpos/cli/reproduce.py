"""The window-attention bug with a learned embedding, end to end on CPU (the paper's protocol on the embedded shapes
data; the logic is in winpos.experiments).

Stage 0 pretrains the backbone at 64 px as a unit-layout autoencoder (nothing masked; units = the 4x4-token windows,
targets normalised per unit, predicted from the stride-16 tokens) from a random-start absolute embedding, which
learns a window pattern; stage 1 trains a small HieraDet Mask R-CNN at 64 px from it (and one per other encoding);
stage 2 evaluates each at 1.25x, 1.5x, 2x and 4x its token grid, zero-shot and finetuned over several seeds, on a
larger canvas of same-size objects and on upscaled images. Rows: naive, abs2win, control, recursive, rope,
lookhere, relpos, planted, planted2win. Finetuned comparisons are paired per seed with 95% t-intervals.

    winpos-reproduce [--output output/reproduce] [--rows naive,abs2win,control] [--multipliers 1.25,1.5,2,4]
        [--conditions canvas,upscaled] [--seeds 0,1,2,3,4] [--stage0-iters 800] [--pretrain-iters 2000]
        [--finetune-iters 150] [--workers 2] [--no-finetune] [--report-only]

A re-run of the same protocol in the same folder reuses every finished run whose identity (spec, config hash,
init hash) matches and refuses a folder made with other settings. Writes <output>/results.json and
<output>/curve_<condition>.png and prints the tables.

The equal-footing study (``winpos.experiments.footing``; its tests are declared in docs/equal_footing.md):

    winpos-reproduce --equal-footing [--output output/equal_footing] [--pipelines 0,1,2,3,4,5]
        [--encodings rope,relpos,lookhere,abs] [--finetune-cells canvas:4,canvas:1.25] [--no-finetune]
        [--mae-iters 8000] [--archive DIR] [--report-only]

runs every encoding's own stage 0 and stage 1 per pipeline, the zero-shot evaluations and (for abs) the finetuning
runs of T3-T6, then writes <output>/results.json (T1-T6 with Holm; R5 / R6, the declared replication over
pipelines 6-11, once any of its runs has finished), <output>/footing_curves.png, <output>/footing_replication.png and
<output>/footing_finetuned.png. With
``--archive DIR`` every finished run's sealed result is also kept in DIR (winpos.experiments.archive), runs already
there are not made again unless a later run needs their weights, and the report reads them: the study can be
spread over sessions that do not keep <output>.

The mixed-precision study (``winpos.experiments.precision``; declared in docs/precision.md):

    winpos-reproduce --precision [--output output/precision] [--seeds 0,1,2,3,4] [--finetune-iters 150]
        [--precisions fp32,bf16,fp16] [--workers 1] [--report-only]

evaluates the shipped demo detector in float32, bf16 and fp16 autocast at 1x and 1.25x its grid, finetunes it at
1.25x in each precision with the same seeds (evaluated in float32) and reports each precision - fp32 with its
95% interval, sign-flip p and TOST within +-1 box AP; writes <output>/summary.json and <output>/precision.png.

The small-data study (``winpos.experiments.small_data``; declared in docs/small_data.md):

    winpos-reproduce --small-data [--output output/small_data] [--seeds 0,1,2,3] [--finetune-iters 300]
        [--train-images 16,128] [--recipes full,trunk,heads] [--workers 1] [--report-only]

teaches the shipped one-class demo detector the four-class shapes task from 16 and 128 images, finetuning all of it
(full), all but its trunk (trunk) or its RoI heads only (heads), and reports each recipe - full with its 95%
interval, t / sign-flip p and Holm; writes <output>/summary.json and <output>/small_data.png.
"""
import sys
from pathlib import Path

from winpos.experiments.study_commands import equivalence as _equivalence
from winpos.experiments.study_commands import footing as _footing
from winpos.experiments.study_commands import precision as _precision
from winpos.experiments.study_commands import small_data as _small_data
from winpos.utils.cli import ArgumentParser, finite_float, number_list, positive_int, run_cli, seed_list

CONFIG = "shapes/reproduce_hieradet.py"  # a winpos.model_zoo name
ROW_NAMES = "naive, abs2win, control, recursive, rope, lookhere, relpos, planted, planted2win"


def _names(text):
    names = tuple(s.strip() for s in text.split(","))
    if not all(names):
        raise __import__("argparse").ArgumentTypeError(f"{text!r} has an empty name; give a comma list without "
                                                      "empty entries, e.g. naive,abs2win")
    return names


def _cells(text):
    """``canvas:4,canvas:1.25`` -> (("canvas", 4), ("canvas", 1.25)); the study checks they are its cells."""
    import argparse

    cells = []
    for item in _names(text):
        condition, sep, k = item.partition(":")
        try:
            value = float(k) if sep else None
        except ValueError:
            value = None
        if value is None:
            raise argparse.ArgumentTypeError(f"{item!r} is not CONDITION:K; give e.g. canvas:1.25")
        cells.append((condition, int(value) if value.is_integer() else value))
    return tuple(cells)


def _vitdet(proto, args, log) -> int:
    from winpos.experiments import runs as R
    from winpos.experiments import vitdet as V
    from winpos.experiments.reproduce import claim_folder
    from winpos.utils.outputs import atomic_write_json

    out = Path(args.output) / "vitdet"
    config_dir = str(Path(args.config).parent)
    specs = V.specs(config_dir, str(out), args.vitdet_seeds, args.vitdet_iters, threads=proto.threads)
    if args.report_only:  # runs whose init was never made cannot have finished
        results = [r for r in (R.finished(s) for s in specs if Path(s["init"]).is_file()) if r]
        speed = None
    else:
        claim_folder(proto)
        for seed in args.vitdet_seeds:
            V.make_inits(config_dir, str(out / "inits"), seed)
        log(f"ViTDet half: {len(specs)} runs ({len(V.CONFIGS)} rows x {len(args.vitdet_seeds)} seeds), "
            f"{args.vitdet_iters} iterations each")
        results = R.run_pool(specs, proto.workers, log)
        import torch

        torch.set_num_threads(proto.threads)
        log("speed: the three detectors' training steps side by side")
        from winpos.bench.train import run as bench_train

        bench = bench_train(Path(config_dir), which="vitdet", encodings=list(V.CONFIGS), iters=8, warmup=2,
                            bf16=False, overrides=[], device="cpu", seed=0)
        speed = {r["encoding"]: r["median_s_per_iter"] for r in bench["rows"]}
    if not results:
        from winpos.errors import WinposError

        raise WinposError(f"no finished ViTDet run under {out}; run without --report-only first")
    summary = V.summarize(results)
    summary["speed_s_per_iter"] = speed
    if not args.report_only:
        atomic_write_json(out / "results.json", summary)
    print(V.format_table(summary, speed))
    return 0


def run(argv=None):
    import argparse

    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", default="output/reproduce")
    p.add_argument("--config", default=CONFIG, help="the protocol's LazyConfig, a file or a winpos config name "
                   "(default: %(default)s)")
    p.add_argument("--equal-footing", action="store_true",
                   help="run the equal-footing study instead (every encoding pretrained with itself, independent "
                        "pipelines, the declared tests T1-T6); default output output/equal_footing")
    p.add_argument("--equivalence", action="store_true",
                   help="the declared equivalence study instead (abs-win vs naive at canvas "
                        "1.25x over pipelines 12-35, stage 1 at 2000 iterations, an evaluation set of each "
                        "pipeline's own, TOST at +-0.25 box AP; docs/equal_footing.md); default output "
                        "output/equivalence, needs --archive")
    p.add_argument("--precision", action="store_true",
                   help="the mixed-precision study instead (the shipped demo detector evaluated and finetuned in "
                        "fp32, bf16 and fp16 autocast; docs/precision.md); default output output/precision")
    p.add_argument("--small-data", action="store_true",
                   help="the small-data study instead (the shipped one-class demo detector taught four classes from "
                        "16 and 128 images, fully finetuned or partly frozen; docs/small_data.md); default output "
                        "output/small_data")
    p.add_argument("--recipes", type=_names, default=None,
                   help="--small-data: what trains, full first (default: full,trunk,heads)")
    p.add_argument("--train-images", type=seed_list, default=None, metavar="N,...",
                   help="--small-data: training-set sizes (default: 16,128)")
    p.add_argument("--precisions", type=_names, default=("fp32", "bf16", "fp16"),
                   help="--precision: the precisions, fp32 first (default: fp32,bf16,fp16)")
    p.add_argument("--pipelines", type=seed_list, default=None, help="equal footing: pipelines (default 0-5); "
                   "fewer than declared give an interim report that writes nothing")
    p.add_argument("--encodings", type=_names, default=None,
                   help="equal footing: comma list of rope, relpos, lookhere, abs (default: all four)")
    p.add_argument("--finetune-cells", type=_cells, default=None, metavar="CONDITION:K,...",
                   help="equal footing: the finetuning cells to run, a subset of canvas:4,canvas:1.25 (default: both)")
    p.add_argument("--archive", default=None, metavar="DIR",
                   help="equal footing: keep every finished run's sealed result in DIR (one small JSON per run, to "
                        "commit) and read runs whose folder is gone from it, so a study can span sessions; a run "
                        "made again must repeat its entry's numbers")
    p.add_argument("--mae-iters", type=positive_int, default=None,
                   help="equal footing: also run the masked stage-0 variant (hiera_mae: masked tokens stay in the "
                        "encoder, a linear decoder; not Hiera's MAE) for this many iterations (declared: 8000)")
    p.add_argument("--rows", type=_names, default=None, help=f"comma list of: {ROW_NAMES} (default: all)")
    p.add_argument("--multipliers", type=number_list, default=[1.25, 1.5, 2, 4],
                   help="token-grid multipliers of stage 2 (the 16x16 grid times k must stay a multiple of 4)")
    p.add_argument("--conditions", type=_names, default=("canvas", "upscaled"), help="canvas and/or upscaled")
    p.add_argument("--seeds", type=seed_list, default=[0, 1, 2, 3, 4], help="finetuning seeds")
    p.add_argument("--stage0-iters", type=positive_int, default=None,
                   help="stage-0 iterations (batch 32; default 800, equal footing 400)")
    p.add_argument("--stage0-mask-ratio", type=finite_float, default=0.0,
                   help="share of units masked in stage 0 (loss over every unit); default 0: unit autoencoding")
    p.add_argument("--pretrain-iters", type=positive_int, default=None,
                   help="stage-1 iterations (batch 8; default 2000, equal footing 600)")
    p.add_argument("--pretrain-lr", type=finite_float, default=1e-3, help="stage-1 learning rate (AdamW)")
    p.add_argument("--finetune-iters", type=positive_int, default=None,
                   help="finetuning iterations (default 150; --small-data 300)")
    p.add_argument("--finetune-lr", type=finite_float, default=2e-4)
    p.add_argument("--workers", type=positive_int, default=2, help="runs at a time")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads per run (fixed for the run)")
    p.add_argument("--no-zero-shot", action="store_true", help="skip the evaluations without finetuning")
    p.add_argument("--no-finetune", action="store_true", help="only the zero-shot evaluations of stage 2")
    p.add_argument("--stage0-variants", action="store_true",
                   help="also run the stage-0 variants that say what makes the pattern emerge (hiera_mae: half "
                        "the units masked, loss on the masked ones, not Hiera's MAE; loss on all units with half "
                        "masked; no global blocks) and print "
                        "their WS and reliance beside the main stage 0")
    p.add_argument("--stage0-only", action="store_true", help="stop after stage 0 (and its variants)")
    p.add_argument("--vitdet-only", action="store_true",
                   help="run only the ViTDet half (winpos.experiments.vitdet: MAE's sin-cos embedding, abs vs abs + "
                        "relpos vs abs-win at 256 px, paired seeds, and their speed side by side)")
    p.add_argument("--vitdet-seeds", type=seed_list, default=[0, 1, 2], help="seeds of the ViTDet half")
    p.add_argument("--vitdet-iters", type=positive_int, default=600, help="iterations per ViTDet run (batch 4)")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: the tables and results from the runs that have finished")
    p.add_argument("--stage1-dir", default=None, help="stage-0/1 checkpoints (default <output>/stage1)")
    p.add_argument("--force", action="store_true", help="with --export-stage1: replace an existing file")
    p.add_argument("--export-stage1", metavar="ENCODING:PATH", default=None,
                   help="after stage 1, write that encoding's checkpoint (fp16, weights only) and its manifest "
                        "(command, seeds, SHA-256, WS) to PATH, e.g. abs_learned:out/stage1.pth")
    args = p.parse_args(argv)
    if not args.report_only:  # its runs train and evaluate with detectron2: a missing one is said before any work
        from winpos.cli import require_detectron2

        require_detectron2()
    from winpos.model_zoo import config_path

    args.config = str(config_path(args.config)) if not Path(args.config).is_file() else args.config
    log = lambda m: print(f"[reproduce] {m}", flush=True)  # noqa: E731
    if args.equivalence:
        return _equivalence(args, log)
    if args.small_data:
        return _small_data(args, log)
    args.finetune_iters = args.finetune_iters or 150
    if args.precision:
        return _precision(args, log)
    if args.equal_footing:
        if args.seeds == [0, 1, 2, 3, 4]:  # the finetuning seeds of the equal-footing study: 0, 1, 2
            args.seeds = [0, 1, 2]
        return _footing(args, log)
    args.stage0_iters = args.stage0_iters or 800
    args.pretrain_iters = args.pretrain_iters or 2000
    from winpos.experiments.protocol import ROWS, Protocol

    rows = args.rows or tuple(ROWS)
    proto = Protocol(config=args.config, output_dir=args.output, rows=rows, multipliers=tuple(args.multipliers),
                     conditions=args.conditions, seeds=tuple(args.seeds), stage0_iters=args.stage0_iters,
                     stage0_mask_ratio=args.stage0_mask_ratio, pretrain_iters=args.pretrain_iters,
                     finetune_iters=args.finetune_iters, pretrain_lr=args.pretrain_lr, finetune_lr=args.finetune_lr,
                     zero_shot=not args.no_zero_shot, finetune=not args.no_finetune, workers=args.workers,
                     threads=args.threads, stage1_dir=args.stage1_dir)
    proto.validate()
    export = None
    if args.export_stage1:
        from winpos.experiments.protocol import ENCODINGS
        from winpos.utils.outputs import check_output_file

        enc, sep, path = args.export_stage1.partition(":")
        if not sep or not path or enc not in ENCODINGS:
            p.error(f"--export-stage1 {args.export_stage1!r} must be ENCODING:PATH with ENCODING one of "
                    f"{', '.join(ENCODINGS)}")
        for target in (path, str(Path(path).with_suffix(".json"))):
            check_output_file(target, force=args.force, flag="--export-stage1")
        export = (enc, path)

    def export_now():
        from winpos.experiments import runs as R
        from winpos.experiments.checkpoints import export_stage1
        from winpos.experiments.protocol import stage0_spec, stage1_spec

        spec = stage1_spec(proto, export[0])
        res = R.finished(spec)
        if res is None:
            from winpos.errors import WinposError

            raise WinposError(f"stage 1 of {export[0]} has not finished under {args.output}; nothing to export")
        s0 = R.finished(stage0_spec(proto)) if spec["init"].endswith("backbone.pth") else None
        manifest = {"command": "winpos-reproduce " + " ".join(argv if argv is not None else sys.argv[1:]),
                    "encoding": export[0], "stage1": {k: spec[k] for k in ("iters", "lr", "seed", "threads")},
                    "box_AP_64px": res["bbox"]["AP"], "mask_AP_64px": res["segm"]["AP"],
                    "stage0": None if s0 is None else {"spec": s0["spec"], "history": s0["history"],
                                                       "reliance": s0["reliance"]}}
        info = export_stage1(str(Path(spec["out"]) / "model_final.pth"), export[1], manifest, force=args.force)
        log(f"exported stage-1 {export[0]} to {export[1]} (sha256 {info['sha256'][:12]}...)")

    from winpos.experiments.report import format_pairs, format_stage0, format_table, format_zero_shot, plot_curve
    from winpos.experiments.reproduce import run_protocol

    if args.vitdet_only:
        return _vitdet(proto, args, log)
    if args.stage0_variants or args.stage0_only:
        from winpos.experiments import runs as R
        from winpos.experiments.protocol import STAGE0_VARIANTS, stage0_spec, stage0_variant_spec
        from winpos.experiments.report import format_stage0_variants
        from winpos.experiments.reproduce import claim_folder

        specs = [stage0_spec(proto)] + ([stage0_variant_spec(proto, v) for v in STAGE0_VARIANTS]
                                        if args.stage0_variants else [])
        if not args.report_only:
            claim_folder(proto)
            log(f"stage 0{' and its variants' if args.stage0_variants else ''}: {len(specs)} runs")
            R.run_pool(specs, proto.workers, log)
        main, variants = R.finished(specs[0]), {v: R.finished(s) for v, s in zip(STAGE0_VARIANTS, specs[1:])}
        print(format_stage0_variants(main, variants))
        if args.stage0_variants and main and all(variants.values()):
            from winpos.utils.outputs import atomic_write_json

            keep = ("spec", "history", "reliance", "seconds", "started_utc")
            path = Path(proto.output_dir) / "stage0_variants.json"
            atomic_write_json(path, {"main": {k: main.get(k) for k in keep},
                                     "variants": {v: {k: r.get(k) for k in keep} for v, r in variants.items()},
                                     "variant_settings": STAGE0_VARIANTS})
            print(f"every number: {path}")
        if args.stage0_only:
            return 0
    summary = run_protocol(proto, log=log, report_only=args.report_only,
                           after_stage1=export_now if export and not args.report_only else None)

    if export and args.report_only:
        export_now()
    if summary.get("stage0"):
        print(format_stage0(summary["stage0"]))
    if summary["zero_shot"]:
        print("\nzero-shot (the stage-2 starts at the new size, box / mask AP):")
        print(format_zero_shot(summary))
    if summary["stage2"]:
        print("\nfinetuned (mean over seeds):")
        print(format_table(summary))
    print("\npaired comparisons (treatment - baseline):")
    print(format_pairs(summary))
    # the report of what has finished (with --report-only too: it runs nothing, and the folder is this protocol's)
    from winpos.utils.outputs import atomic_write_json

    for c in proto.conditions:
        plot_curve(summary, str(Path(args.output) / f"curve_{c}.png"), c)
    atomic_write_json(Path(args.output) / "results.json", summary)
    print(f"\nplots: {args.output}/curve_<condition>.png; every number: {args.output}/results.json")
    return 0


def main(argv=None):
    return run_cli(run, argv)


if __name__ == "__main__":
    sys.exit(main())
