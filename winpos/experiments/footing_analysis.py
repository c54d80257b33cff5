"""The equal-footing study's analysis (``winpos.experiments.footing`` runs and collects it): the tests declared
before the runs (``TESTS``, T1-T6, each a one-sample t test over pipelines with the exact sign-flip p beside it and
Holm's adjustment over its family), the study's summary (``analyze``) and the diagnosis of the abs rows, described
and not tested (``diagnosis``)."""
from __future__ import annotations

import statistics
from dataclasses import asdict

from winpos.experiments.stats import holm, mean_interval, n_for_power, power_paired, t_test

T1_MARGIN = 1.0  # box AP: RoPE is non-inferior to relpos when rope - relpos > -1.0 AP
ALPHA = 0.05
TESTS = {
    "T1": "RoPE - relpos, box AP at 64 px, paired by pipeline; non-inferiority at a margin of 1.0 AP (one-sided)",
    "T2": "LookHere - RoPE, zero-shot box AP averaged over canvas 2x and 4x, paired by pipeline (two-sided)",
    "T3": "abs-win - naive after finetuning at canvas 4x, per-pipeline mean over finetuning seeds (two-sided)",
    "T4": "abs-win - control after finetuning at canvas 4x, per-pipeline mean over finetuning seeds (two-sided)",
    "T5": "abs-win - naive after finetuning at canvas 1.25x (the demo's cell), per-pipeline mean over finetuning "
          "seeds (two-sided)",
    "T6": "abs-win - control after finetuning at canvas 1.25x (the demo's cell), per-pipeline mean over finetuning "
          "seeds (two-sided)",
}
REPLICATION = {  # declared 2026-12-04 (commit 70af6b9) before its runs: T5 / T6 again, on new pipelines only
    "R5": ("T5", "abs-win - naive after finetuning at canvas 1.25x, per-pipeline mean over finetuning seeds, over the "
                 "replication's pipelines only (two-sided; Holm over R5, R6)"),
    "R6": ("T6", "abs-win - control after finetuning at canvas 1.25x, per-pipeline mean over finetuning seeds, over "
                 "the replication's pipelines only (two-sided; Holm over R5, R6)"),
}
DECLARED_FAMILY = ("T1", "T2", "T3", "T4")  # Holm over these four, as declared before the runs
# T5 / T6 were added (dated amendment) after T1 / T2 had run but before any finetuning run: their Holm adjustment is
# over all six tests, so adding them cannot make a verdict of the declared four easier, nor their own


def _paired(a: dict, b: dict, metric: str) -> list:
    return [a[p][metric] - b[p][metric] for p in sorted(set(a) & set(b), key=int)]


def _detector_means(fin: dict, treat: str, base: str, cell: str, metric: str, seeds) -> list:
    """Per pipeline whose runs of both rows are there for every one of ``seeds``: the mean over the seeds of
    treatment - baseline (a detector-level mean). A pipeline with a seed missing is left out, not averaged over
    fewer seeds."""
    out = []
    a, b = fin.get(treat, {}).get(cell, {}), fin.get(base, {}).get(cell, {})
    want = [str(s) for s in seeds]
    for p in sorted(set(a) & set(b), key=int):
        if all(s in a[p] and s in b[p] for s in want):
            out.append(statistics.fmean(a[p][s][metric] - b[p][s][metric] for s in want))
    return out


def declared_tests(data: dict, metric: str, declared_n: int = 6, seeds=(0, 1, 2)) -> dict:
    """T1-T6 on ``metric`` ("box" or "mask": each its own family), with Holm's adjustment over the declared four
    for T1-T4 and over all six for T5 / T6 (``holm_family``). A test with fewer than ``declared_n`` pipelines (the
    number declared) gets its numbers but no verdict (interim); the finetuning tests count a pipeline once all
    its ``seeds`` (the finetuning seeds) are there."""
    ap, zs, fin = data["ap64"], data["zero_shot"], data["finetuned"]
    t2 = {}
    for enc in ("lookhere", "rope"):
        cells = [zs.get(enc, {}).get(c, {}) for c in ("canvas 2x", "canvas 4x")]
        t2[enc] = {p: {metric: (cells[0][p][metric] + cells[1][p][metric]) / 2}
                   for p in set(cells[0]) & set(cells[1])}
    diffs = {
        "T1": (_paired(ap.get("rope", {}), ap.get("relpos", {}), metric), T1_MARGIN, "greater"),
        "T2": (_paired(t2["lookhere"], t2["rope"], metric), 0.0, "two-sided"),
        "T3": (_detector_means(fin, "abs2win", "naive", "canvas 4x", metric, seeds), 0.0, "two-sided"),
        "T4": (_detector_means(fin, "abs2win", "control", "canvas 4x", metric, seeds), 0.0, "two-sided"),
        "T5": (_detector_means(fin, "abs2win", "naive", "canvas 1.25x", metric, seeds), 0.0, "two-sided"),
        "T6": (_detector_means(fin, "abs2win", "control", "canvas 1.25x", metric, seeds), 0.0, "two-sided"),
    }
    tests = {name: dict(t_test(d, shift, alt), claim=TESTS[name]) for name, (d, shift, alt) in diffs.items()}
    four = [k for k in tests if k in DECLARED_FAMILY]
    adjusted = {**holm({k: tests[k]["p_t"] for k in tests}), **holm({k: tests[k]["p_t"] for k in four})}
    adjusted_sf = {**holm({k: tests[k]["p_sign_flip"] for k in tests}),
                   **holm({k: tests[k]["p_sign_flip"] for k in four})}
    for name, t in tests.items():
        t["p_holm"], t["p_sign_flip_holm"] = adjusted[name], adjusted_sf[name]
        t["holm_family"] = list(four) if name in DECLARED_FAMILY else list(tests)
        t["verdict"] = _verdict(name, t) if t["n"] >= declared_n or t["n"] == 0 else \
            f"interim: {t['n']} of the {declared_n} declared pipelines, no verdict"
    return tests


def replication_tests(data: dict, rep: dict, metric: str, declared_n: int, seeds=(0, 1, 2)) -> dict:
    """R5 / R6 on ``metric``: T5 / T6's contrasts over the replication's pipelines alone (``rep`` is its collected
    data), Holm over the two; beside each, the same contrast pooled over the study's and the replication's pipelines
    (``pooled``: a description, no p value enters a verdict). A test with fewer than ``declared_n`` whole pipelines
    gets its numbers as an interim description and no verdict."""
    rows = {"R5": "naive", "R6": "control"}
    cell = "canvas 1.25x"
    tests = {}
    for name, (original, claim) in REPLICATION.items():
        diffs = _detector_means(rep["finetuned"], "abs2win", rows[name], cell, metric, seeds)
        first = _detector_means(data["finetuned"], "abs2win", rows[name], cell, metric, seeds)
        tests[name] = dict(t_test(diffs, 0.0, "two-sided"), claim=claim, replicates=original,
                           pooled=dict(mean_interval(first + diffs), n=len(first) + len(diffs)))
    adjusted = holm({k: t["p_t"] for k, t in tests.items()})
    adjusted_sf = holm({k: t["p_sign_flip"] for k, t in tests.items()})
    for name, t in tests.items():
        t["p_holm"], t["p_sign_flip_holm"], t["holm_family"] = adjusted[name], adjusted_sf[name], list(REPLICATION)
        t["verdict"] = _verdict(name, t) if t["n"] >= declared_n or t["n"] == 0 else \
            f"interim: {t['n']} of the {declared_n} declared pipelines, no verdict"
    return tests


def _verdict(name: str, t: dict) -> str:
    if t["n"] < 2:
        return f"not run (n={t['n']})"
    if t["p_holm"] < ALPHA:
        if name == "T1":
            return f"RoPE non-inferior to relpos at a {T1_MARGIN:g} AP margin (Holm-adjusted p < {ALPHA})"
        return ("confirmed: the first row is better" if t["mean"] > 0 else "confirmed: the second row is better") + \
            f" (Holm-adjusted p < {ALPHA})"
    if t["ci"][0] > 0 or t["ci"][1] < 0:
        return "a lead: the interval excludes 0 but the family-wise correction does not hold"
    return "not shown: the correction does not hold and the interval includes 0" if name != "T1" else \
        f"not shown: non-inferiority at {T1_MARGIN:g} AP is not established"


def analyze(f, data: dict) -> dict:
    """The study's results (``f`` is the study's ``footing.Footing``: only its ``pipelines`` and
    ``finetune_seeds`` and ``replication_pipelines`` are read, so this module need not import footing, which
    imports it): per encoding its 64 px AP over pipelines, the zero-shot cells, the stage-0 readouts, T1-T6 (box and
    mask families), the finetuned AP, the power of T3-T6 and, when ``data`` has the replication's runs
    (``data["replication"]``), R5 / R6 with its detectors' AP and diagnosis."""
    per_enc = {enc: {m: mean_interval([v[m] for _, v in sorted(vals.items(), key=lambda kv: int(kv[0]))])
                     for m in ("box", "mask")} for enc, vals in data["ap64"].items()}
    zero = {row: {cell: {m: mean_interval([v[m] for v in vals.values()]) for m in ("box", "mask")}
                  for cell, vals in cells.items()} for row, cells in data["zero_shot"].items()}
    stage0 = {}
    for enc, pipes in data["stage0"].items():
        ws = [v["history"][-1]["ws"] for v in pipes.values() if v["history"][-1]["ws"] is not None]
        stage0[enc] = {"final_ws": mean_interval(ws) if ws else None,
                       "final_loss": mean_interval([v["history"][-1]["loss"] for v in pipes.values()])}
    n = len(f.pipelines)
    seeds = f.finetune_seeds
    tests = {"box": declared_tests(data, "box", n, seeds), "mask": declared_tests(data, "mask", n, seeds)}
    power = {}
    for name in ("T3", "T4", "T5", "T6"):  # how many pipelines would decide each finetuning test
        t = tests["box"][name]
        if t["n"] >= 2 and t.get("sd"):
            power[name] = {"observed_effect": t["mean"], "sd": t["sd"], "n": t["n"],
                           "power_at_observed": power_paired(t["mean"], t["sd"], t["n"]),
                           "n_for_80pct": n_for_power(t["mean"], t["sd"]),
                           "n_for_80pct_at_half_effect": n_for_power(t["mean"] / 2, t["sd"])}
    def whole(pipes):  # the pipelines with every finetuning seed, in order (a detector-level mean each)
        return [v for _, v in sorted(pipes.items(), key=lambda kv: int(kv[0])) if all(str(s) in v for s in seeds)]

    finetuned = {row: {cell: {m: mean_interval([statistics.fmean(v[str(s)][m] for s in seeds) for v in whole(pipes)])
                              for m in ("box", "mask")} for cell, pipes in cells.items()}
                 for row, cells in data["finetuned"].items()}
    out_rep = None
    rep = data.get("replication")
    if rep is not None:
        rn = len(f.replication_pipelines)
        out_rep = {"pipelines": list(f.replication_pipelines), "missing": rep["missing"],
                   "tests": {m: replication_tests(data, rep, m, rn, seeds) for m in ("box", "mask")},
                   "ap64": {m: mean_interval([v[m] for _, v in sorted(rep["ap64"].get("abs", {}).items(),
                                                                        key=lambda kv: int(kv[0]))])
                            for m in ("box", "mask")},
                   "finetuned": {row: {m: mean_interval([statistics.fmean(v[str(s)][m] for s in seeds)
                                                         for v in whole(cells.get("canvas 1.25x", {}))])
                                       for m in ("box", "mask")} for row, cells in rep["finetuned"].items()},
                   "diagnosis": diagnosis(rep)}
    return {"study": asdict(f), "data": data, "ap64": per_enc, "zero_shot": zero, "finetuned": finetuned,
            "stage0": stage0, "tests": tests, "power": power, "t4_power": power.get("T4"),
            "diagnosis": diagnosis(data), "replication": out_rep}


def diagnosis(data: dict) -> dict:
    """Why the abs rows differ as little or as much as they do; described, not tested (not declared), each a mean
    with its 95% t-interval over pipelines: ``reliance`` (64 px AP as trained minus with the embedding zeroed),
    ``window_structure`` (of the stage-1 embedding: WS@4 at 64 px, after naive and after abs-win resizing) and
    ``zero_shot_gain`` (abs-win minus naive per zero-shot cell, paired by pipeline)."""
    ne, ap = data.get("no_embedding") or {}, data["ap64"].get("abs", {})
    pipes = sorted(set(ne) & set(ap), key=int)
    out = {"reliance": {m: mean_interval([ap[p][m] - ne[p][m] for p in pipes]) for m in ("box", "mask")},
           "window_structure": {}, "zero_shot_gain": {}}
    structures = [ne[p]["window_structure"] for p in sorted(ne, key=int) if ne[p].get("window_structure")]
    for key in (structures[0] if structures else {}):
        out["window_structure"][key] = mean_interval([w[key] for w in structures])
    naive, aw = data["zero_shot"].get("naive", {}), data["zero_shot"].get("abs2win", {})
    for cell in sorted(set(naive) & set(aw)):
        both = sorted(set(naive[cell]) & set(aw[cell]), key=int)
        out["zero_shot_gain"][cell] = {m: mean_interval([aw[cell][p][m] - naive[cell][p][m] for p in both])
                                       for m in ("box", "mask")}
    return out
