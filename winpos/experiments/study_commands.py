"""The declared studies as ``winpos-reproduce`` runs them (``winpos.cli.reproduce`` parses the flags): the
equivalence and equal-footing studies from their archive, the precision and small-data studies from the shipped
detector; each holds its folder for one process, stops on Ctrl-C in one line (the finished runs are kept) and prints
its tables. No torch or detectron2 import at module level: ``--help`` stays light.
"""
import sys
from pathlib import Path

__all__ = ["equivalence", "footing", "precision", "small_data"]


def _hold(out: Path) -> int:
    """Hold the study's folder for this process: a second study into it is refused at once, naming the first."""
    from winpos.utils.output_folders import lock_folder

    out.mkdir(parents=True, exist_ok=True)
    return lock_folder(out, f"{out} is held by another study ({{holder}}); wait for it to end, or pass another "
                            "--output")


def _run_study(run, log) -> int | None:
    """``run()``; Ctrl-C ends it in one line (the finished runs are kept, the same command continues)."""
    try:
        run()
    except KeyboardInterrupt:
        print("\ninterrupted: the runs that finished are kept (and archived with --archive); the same command "
              "continues from them", file=sys.stderr)
        return 130
    return None


def equivalence(args, log) -> int:
    """The declared equivalence study (``footing.equivalence_study``; docs/equal_footing.md)."""
    from dataclasses import replace

    from winpos.experiments import footing as F
    from winpos.experiments import footing_runs as FR
    from winpos.experiments.footing_analysis import analyze_equivalence
    from winpos.experiments.equivalence_report import format_equivalence, plot_equivalence
    from winpos.utils.outputs import atomic_write_json

    out = Path(args.output if args.output != "output/reproduce" else "output/equivalence")
    study = F.equivalence_study(F.Footing(config=args.config, output_dir=str(out), workers=args.workers,
                                          threads=args.threads, archive_dir=args.archive))
    if args.pipelines is not None:
        study = replace(study, pipelines=tuple(args.pipelines))
    if args.seeds != [0, 1, 2, 3, 4]:
        study = replace(study, finetune_seeds=tuple(args.seeds))
    study.validate()
    if not args.report_only:
        _hold(out)
        stopped = _run_study(lambda: FR.run(study, log=log), log)
        if stopped:
            return stopped
    result = analyze_equivalence(study, FR.collect(study))
    print(format_equivalence(result))
    if result["interim"]:  # another selection than the declared one: the declared report is not overwritten
        print(f"\n{result['interim']}: nothing written (the report of the declared study is {out}/results.json)")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    plots = ""
    if plot_equivalence(result, str(out / "equivalence.png")):
        plots = f"plot: {out}/equivalence.png; "
    atomic_write_json(out / "results.json", result)
    print(f"\n{plots}every number: {out}/results.json")
    return 0


def _shipped_study(args, log, name: str, study, run) -> int:
    """A declared study that starts from the shipped demo detector (``study``: its module, with ``load_summary``
    and ``format_<name>``): ``run(checkpoint, manifest, out)`` unless ``--report-only``, then its tables."""
    from winpos.model_zoo import demo_checkpoint

    out = Path(args.output if args.output != "output/reproduce" else f"output/{name}")
    if args.report_only:
        summary = study.load_summary(out)
    else:
        checkpoint = str(demo_checkpoint())
        summary = {}
        stopped = _run_study(lambda: summary.update(run(checkpoint, str(Path(checkpoint).with_suffix(".json")), out)),
                             log)
        if stopped:
            return stopped
    print(getattr(study, f"format_{name}")(summary))
    plot = out / f"{name}.png"
    print(f"\nplot: {plot if plot.is_file() else 'not in this folder (the run writes it beside summary.json)'}; "
          f"every number: {out}/summary.json")
    return 0


def precision(args, log) -> int:
    """The declared mixed-precision study (``winpos.experiments.precision``; docs/precision.md)."""
    from winpos.experiments import precision as P

    return _shipped_study(args, log, "precision", P, lambda ckpt, manifest, out: P.run_precision(
        args.config, ckpt, manifest, out, iters=args.finetune_iters, seeds=tuple(args.seeds),
        precisions=tuple(args.precisions), workers=args.workers, threads=args.threads, lr=args.finetune_lr, log=log))


def small_data(args, log) -> int:
    """The declared small-data study (``winpos.experiments.small_data``; docs/small_data.md)."""
    from winpos.experiments import small_data as S

    seeds = S.SEEDS if args.seeds == [0, 1, 2, 3, 4] else tuple(args.seeds)  # left at the default: 0-3
    return _shipped_study(args, log, "small_data", S, lambda ckpt, manifest, out: S.run_small_data(
        args.config, ckpt, manifest, out, recipes=args.recipes or S.RECIPES, seeds=seeds,
        train_images=tuple(args.train_images or S.TRAIN_IMAGES), iters=args.finetune_iters or S.ITERS,
        lr=args.finetune_lr, workers=args.workers, threads=args.threads, log=log))


def footing(args, log) -> int:
    from winpos.experiments import footing as F
    from winpos.experiments import footing_runs as FR
    from winpos.experiments.footing_analysis import interim_reason
    from winpos.experiments.footing_report import format_footing, plot_finetuned, plot_footing, plot_replication
    from winpos.utils.outputs import atomic_write_json

    out = Path(args.output if args.output != "output/reproduce" else "output/equal_footing")
    kw = dict(config=args.config, output_dir=str(out), workers=args.workers, threads=args.threads,
              finetune=not args.no_finetune, archive_dir=args.archive)
    if args.pipelines is not None:
        kw["pipelines"] = tuple(args.pipelines)
    if args.encodings is not None:
        kw["encodings"] = tuple(args.encodings)
    if args.finetune_cells is not None:
        kw["finetune_cells"] = args.finetune_cells
    for key, arg in (("stage0_iters", args.stage0_iters), ("stage1_iters", args.pretrain_iters)):
        if arg is not None:
            kw[key] = arg
    kw.update(finetune_iters=args.finetune_iters, finetune_lr=args.finetune_lr, finetune_seeds=tuple(args.seeds))
    study = F.Footing(**kw)
    study.validate()
    if not args.report_only:
        _hold(out)
        stopped = _run_study(lambda: FR.run(study, log=log, mae_iters=args.mae_iters), log)
        if stopped:
            return stopped
    if args.archive:
        FR.archive_all(study, log=log, mae_iters=args.mae_iters)
    data = FR.collect(study)
    if not any(data[k] for k in ("ap64", "zero_shot", "stage0")):
        from winpos.errors import WinposError

        raise WinposError(f"no finished run of the equal-footing study under {out}; run without --report-only first")
    result = F.analyze(study, data)
    if args.mae_iters:
        from winpos.experiments.archive import finished_or_archived

        mae = finished_or_archived(F.mae_spec(study, args.mae_iters), study.archive_dir)
        result["hiera_mae"] = None if mae is None else \
            {k: mae[k] for k in ("history", "reliance", "seconds", "recovered_from") if k in mae}
    print(format_footing(result))
    partial = interim_reason(study)
    if partial:  # another selection than the declared one: the declared report is not overwritten
        print(f"\ninterim ({partial}): nothing written (the report of the declared study is {out}/results.json)")
        return 0
    out.mkdir(parents=True, exist_ok=True)  # a report made from the archive alone has no run folders here
    plot_footing(result, str(out / "footing_curves.png"))
    plots = f"{out}/footing_curves.png"
    if plot_finetuned(result, str(out / "footing_finetuned.png")):
        plots += f", {out}/footing_finetuned.png"
    if plot_replication(result, str(out / "footing_replication.png")):
        plots += f", {out}/footing_replication.png"
    atomic_write_json(out / "results.json", result)
    print(f"\nplots: {plots}; every number: {out}/results.json")
    return 0
