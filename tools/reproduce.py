#!/usr/bin/env python
"""The window-attention bug and its fixes, end to end on CPU (the paper's protocol on the embedded shapes data).

Stage 1 pretrains a small HieraDet Mask R-CNN at 64 px (16x16 tokens, 4x4-token windows) once per position
encoding; stage 2 finetunes each at 2x and 4x the token grid, windows unchanged, on upscaled images and on a
larger canvas of same-size objects, for several seeds; box / mask AP from pycocotools. Rows: abs (naive
interpolation), abs2win (the same checkpoint converted to abs-win on import), abswin, rope, lookhere, relpos.

    python tools/reproduce.py [--output output/reproduce] [--rows abs,abs2win,abswin,rope,lookhere,relpos]
        [--multipliers 2,4] [--conditions canvas,upscaled] [--seeds 0,1,2] [--pretrain-iters 1500]
        [--finetune-iters 150] [--workers 2]

Every run is a one-thread subprocess (``--workers`` at a time); a re-run skips finished runs and resumes the
others. Writes <output>/results.json, <output>/results.png and prints the table. The logic is in
winpos.d2.reproduce.
"""
import sys
from pathlib import Path

from winpos.errors import ArgumentParser, finite_float, nonnegative_int, number_list, positive_int, run_cli, seed_list

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "shapes" / "reproduce_hieradet.py"


def _names(text):
    return tuple(s.strip() for s in text.split(",") if s.strip())


def main(argv=None):
    from winpos.d2.reproduce import CONDITIONS, ROWS, Protocol

    p = ArgumentParser(description=__doc__, formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    p.add_argument("--output", default="output/reproduce")
    p.add_argument("--config", default=str(CONFIG), help="the protocol's LazyConfig (default: %(default)s)")
    p.add_argument("--rows", type=_names, default=tuple(ROWS), help=f"comma list of: {', '.join(ROWS)}")
    p.add_argument("--multipliers", type=number_list, default=[2, 4],
                   help="token-grid multipliers of stage 2 (the 16x16 grid times k must stay a multiple of 4)")
    p.add_argument("--conditions", type=_names, default=CONDITIONS, help="canvas and/or upscaled")
    p.add_argument("--seeds", type=seed_list, default=[0, 1, 2])
    p.add_argument("--pretrain-iters", type=positive_int, default=1500)
    p.add_argument("--pretrain-lr", type=finite_float, default=1e-3, help="stage-1 learning rate (AdamW)")
    p.add_argument("--pretrain-init", default=None,
                   help="continue stage 1 from this detector checkpoint (rows of one pretrained encoding)")
    p.add_argument("--finetune-iters", type=positive_int, default=150)
    p.add_argument("--mim-iters", type=nonnegative_int, default=0,
                   help="optional masked-token pretraining before stage-1 detection (iterations at batch 32)")
    p.add_argument("--workers", type=positive_int, default=2, help="runs at a time (one torch thread each)")
    p.add_argument("--no-zero-shot", action="store_true",
                   help="skip the evaluations without finetuning (stage-2 starts, stage 1 with its embedding zeroed)")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: table, plot and results.json from the runs that have finished")
    p.add_argument("--stage1-dir", default=None, help="stage-1 checkpoints (default <output>/stage1)")
    p.add_argument("--export-stage1", metavar="ENCODING:PATH", default=None,
                   help="after stage 1, write that encoding's checkpoint (fp16, weights only) and its manifest "
                        "(command, seed, SHA-256) to PATH, e.g. abs_periodic:tools/checkpoints/stage1.pth")
    args = p.parse_args(argv)
    from winpos.d2.reproduce import run_protocol
    from winpos.d2.reproduce_report import format_pairs, format_table, format_zero_shot, plot_results

    proto = Protocol(config=args.config, output_dir=args.output, rows=args.rows, multipliers=tuple(args.multipliers),
                     conditions=args.conditions, seeds=tuple(args.seeds), pretrain_iters=args.pretrain_iters,
                     finetune_iters=args.finetune_iters, mim_iters=args.mim_iters, zero_shot=not args.no_zero_shot,
                     workers=args.workers, stage1_dir=args.stage1_dir, pretrain_lr=args.pretrain_lr,
                     pretrain_init=args.pretrain_init)
    export = None
    if args.export_stage1:
        enc, sep, path = args.export_stage1.partition(":")
        if not sep or not path or enc not in {r.pretrained for r in ROWS.values()}:
            p.error(f"--export-stage1 {args.export_stage1!r} must be ENCODING:PATH with ENCODING one of "
                    f"{', '.join(sorted({r.pretrained for r in ROWS.values()}))}")
        export = (enc, path)
    log = lambda m: print(f"[reproduce] {m}", flush=True)  # noqa: E731

    def export_now():
        from winpos.d2.reproduce_checkpoints import export_stage1

        command = "python tools/reproduce.py " + " ".join(argv if argv is not None else sys.argv[1:])
        info = export_stage1(proto, export[0], export[1], command)
        log(f"exported stage-1 {export[0]} to {export[1]} (sha256 {info['sha256'][:12]}...)")

    # the export happens as soon as stage 1 is done (before stage 2); with --report-only, after the report
    summary = run_protocol(proto, log=log, report_only=args.report_only,
                           after_stage1=export_now if export and not args.report_only else None)
    if export and args.report_only:
        export_now()
    plot_results(summary, str(Path(args.output) / "results.png"))
    print(format_table(summary))
    if summary.get("zero_shot"):
        print("\nwithout finetuning (the stage-2 starts evaluated at the new size):")
        print(format_zero_shot(summary))
    print("\ndoes the abs -> abs-win conversion beat naive interpolation?")
    print(format_pairs(summary))
    print(f"\nplot: {args.output}/results.png; every number: {args.output}/results.json")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
