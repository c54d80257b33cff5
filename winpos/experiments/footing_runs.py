"""The equal-footing study's runs (``winpos.experiments.footing`` defines the study and the spec of every run):
``run`` starts them (pipelines in order, finetuning once a pipeline's chain is done, runs reused by identity),
``archive_all`` seals the finished ones into the study's archive, ``remove_pipeline_files`` tidies a pipeline whose
runs are all archived, and ``collect`` reads every finished run back (from its folder, else from the archive) keyed
for ``footing_analysis``.
"""
from __future__ import annotations

from pathlib import Path

from winpos.errors import WinposError
from winpos.experiments.footing import (FINETUNE_ROWS, STUDY_ENCODINGS, Footing, all_specs, chain_specs,
                                        converted_init, diagnosis_specs, finetune_specs, mae_spec, pipeline_specs,
                                        replication_study, stage0_spec, stage1_spec, stage2_shapes, zero_shot_rows,
                                        zero_shot_spec)
from winpos.experiments.protocol import label


# ------------------------------------------------------------------------------------------------- running
def run(f: Footing, log=print, mae_iters: int | None = None) -> None:
    """Run every chain (pipeline x encoding; pipelines in order, so an interrupted study has whole pipelines) and,
    with ``f.finetune``, the finetuning runs of each ``abs`` pipeline once its chain is done; ``mae_iters`` adds the
    long masked stage-0 variant (``hiera_mae``) as the first job. Finished runs are reused by identity."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from winpos.experiments import archive as A
    from winpos.experiments import runs as R
    from winpos.experiments.checkpoints import convert

    f.validate()
    done = {p: threading.Event() for p in f.pipelines}
    stopping = threading.Event()  # Ctrl-C: no run starts after it
    jobs = []

    def launch(spec):
        if stopping.is_set():
            raise KeyboardInterrupt
        res = R.launch(spec, log)
        if f.archive_dir:
            log(f"archive {spec['name']}: {A.keep(spec, f.archive_dir)}")
        return res

    def settled(spec):  # finished here, or archived with this identity (checked)
        if A.finished_or_archived(spec, f.archive_dir) is None:
            return False
        if f.archive_dir and A.archived(spec, f.archive_dir) is None:  # finished, then stopped before its entry
            log(f"archive {spec['name']}: {A.keep(spec, f.archive_dir)} (finished before, not archived then)")
        return True

    if mae_iters and not settled(mae_spec(f, mae_iters)):
        jobs.append(lambda: launch(mae_spec(f, mae_iters)))

    def chain(p, enc):
        def go():
            try:
                extra = diagnosis_specs(f, p) + finetune_specs(f, p) if enc == "abs" else []
                needed = chain_specs(f, p, enc) + extra
                if all(settled(s) for s in needed):
                    log(f"skip p{p}/{enc}: every run of it is finished or archived")
                    return
                for spec in chain_specs(f, p, enc)[:2]:
                    launch(spec)
                if enc == "abs":
                    final = str(Path(stage1_spec(f, p, "abs")["out"]) / "model_final.pth")
                    for how in {"abswin"} | {FINETUNE_ROWS[r] for r in f.finetune_rows if FINETUNE_ROWS[r]}:
                        if not Path(converted_init(f, p, how)).is_file():
                            convert(final, converted_init(f, p, how), how)
                for spec in chain_specs(f, p, enc)[2:] + (diagnosis_specs(f, p) if enc == "abs" else []):
                    launch(spec)
            finally:
                if enc == "abs":
                    done[p].set()
        return go

    def finetune(spec, p):
        def go():
            if settled(spec):
                return None
            done[p].wait()
            return launch(spec)
        return go

    def tidy(p):  # every run of pipeline p archived: remove its folders and its own evaluation set
        def go():
            specs = pipeline_specs(f, p)
            if all(A.archived(s, f.archive_dir) is not None for s in specs):
                removed = remove_pipeline_files(f, p)
                if removed:
                    log(f"p{p}: every run archived; removed {', '.join(removed)}")
        return go

    encs = [e for e in STUDY_ENCODINGS if e in f.encodings]  # T1 / T2 encodings first within a pipeline
    for p in f.pipelines:
        jobs += [chain(p, e) for e in encs]
        if "abs" not in encs:
            done[p].set()
        if f.pipeline_by_pipeline:  # one pipeline whole before the next (a study run one process at a time)
            for cell in f.finetune_cells:
                jobs += [finetune(s, p) for s in finetune_specs(f, p, (cell,))]
            if not f.keep_run_folders:
                jobs.append(tidy(p))
    for cell in (() if f.pipeline_by_pipeline else f.finetune_cells):  # cell by cell: every pipeline's first
        for p in f.pipelines:
            jobs += [finetune(s, p) for s in finetune_specs(f, p, (cell,))]
    errors = []

    def guarded(job):
        if stopping.is_set():
            return
        try:
            job()
        except KeyboardInterrupt:
            stopping.set()
        except Exception as e:  # noqa: BLE001 - one failed run must not stop the other pipelines
            if not stopping.is_set():  # a run killed by the same Ctrl-C is not a failure to report
                errors.append(e)
                log(f"FAILED: {e}")

    ex = ThreadPoolExecutor(max_workers=f.workers)
    try:
        list(ex.map(guarded, jobs))
    except KeyboardInterrupt:
        stopping.set()
        ex.shutdown(wait=True, cancel_futures=True)  # the runs under way end with the same signal
        raise
    ex.shutdown(wait=True)
    if stopping.is_set():
        raise KeyboardInterrupt
    if errors:
        raise R.RunFailed(f"{len(errors)} run(s) failed; the first: {errors[0]}")


def remove_pipeline_files(f: Footing, p: int) -> list[str]:
    """Remove pipeline ``p``'s run folders (weights, logs) and its own evaluation sets; returns what was removed.
    Call it only once every run of ``p`` is archived: the report reads the archive."""
    import shutil

    from winpos.data.shapes import shapes_val_dir

    removed = []
    folder = Path(f.output_dir) / f"pipeline{p}"
    if folder.is_dir():
        shutil.rmtree(folder)
        removed.append(str(folder))
    if f.eval_images:
        for c, k in dict.fromkeys(tuple(f.zero_shot_cells) + tuple(f.finetune_cells)):
            data = shapes_val_dir(**stage2_shapes(f, p, c, k))
            if data.is_dir():
                shutil.rmtree(data)
                removed.append(f"its evaluation set {data}")
    return removed


def archive_all(f: Footing, log=print, mae_iters: int | None = None) -> dict:
    """Put every run of the study that finished in its folder into ``f.archive_dir``; returns how many entries
    were new and how many were reproduced (a run made again with the same numbers)."""
    from winpos.experiments import archive as A
    from winpos.experiments import runs as R

    if not f.archive_dir:
        raise WinposError("no archive folder given; pass --archive DIR")
    counts = {"new": 0, "reproduced": 0}
    for spec in all_specs(f, mae_iters):
        if Path(spec["out"]).is_dir() and R.finished(spec) is not None:
            counts[A.keep(spec, f.archive_dir)] += 1
    log(f"archive {f.archive_dir}: {counts['new']} new, {counts['reproduced']} reproduced")
    return counts


# ------------------------------------------------------------------------------------------------ collecting
def collect(f: Footing) -> dict:
    """Every finished run of the study (from its folder, else from ``f.archive_dir``), keyed for the analysis:
    ``stage0[enc][p]`` (WS history and reliance), ``ap64[enc][p]``, ``zero_shot[row][cell][p]`` and
    ``finetuned[row][cell][p][seed]`` (box and mask AP each), ``no_embedding[p]`` (the abs detector's AP with its
    embedding zeroed, and the embedding's window structure), plus ``started_utc`` of every run and, when any run of
    the declared replication has finished, ``replication`` (the same keys for its pipelines, ``replication_study``)."""
    from winpos.experiments import archive as A

    out = {"stage0": {}, "ap64": {}, "zero_shot": {}, "finetuned": {}, "no_embedding": {}, "started_utc": {},
           "missing": [], "replication": None}

    def take(spec):
        res = A.finished_or_archived(spec, f.archive_dir)
        if res is None:
            out["missing"].append(spec["name"])
        else:
            out["started_utc"][spec["name"]] = res.get("started_utc")
        return res

    rep = replication_study(f)
    if rep is not None:
        found = collect(rep)
        has_runs = found["ap64"] or found["finetuned"] or found["stage0"]
        out["replication"] = found if has_runs else None
    for p in f.pipelines:
        for enc in f.encodings:
            s0 = take(stage0_spec(f, p, enc))
            if s0:
                out["stage0"].setdefault(enc, {})[str(p)] = {"history": s0["history"], "reliance": s0["reliance"]}
            s1 = take(stage1_spec(f, p, enc))
            if s1:
                out["ap64"].setdefault(enc, {})[str(p)] = _ap(s1)
            for c, k in f.zero_shot_cells:
                for row in zero_shot_rows(enc):
                    res = take(zero_shot_spec(f, p, enc, row, c, k))
                    if res:
                        out["zero_shot"].setdefault(row, {}).setdefault(f"{c} {label(k)}", {})[str(p)] = _ap(res)
        for spec in diagnosis_specs(f, p):
            res = take(spec)
            if res:
                out["no_embedding"][str(p)] = dict(_ap(res), window_structure=res.get("window_structure"))
        for spec in finetune_specs(f, p):
            res = take(spec)
            if res:
                row, c, k, seed = spec["name"].split("/")[1:]
                cell = out["finetuned"].setdefault(row, {}).setdefault(f"{c} {k}", {}).setdefault(str(p), {})
                cell[seed.removeprefix("seed")] = _ap(res)
    return out


def _ap(res: dict) -> dict:
    """Box and mask AP of a result, with the AP of the two halves of its evaluation set when it has them."""
    out = {"box": res["bbox"]["AP"], "mask": res["segm"]["AP"]}
    if res.get("split_half"):
        out["halves"] = {"box": res["split_half"]["bbox"], "mask": res["split_half"]["segm"]}
    return out
