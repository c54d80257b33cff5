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


def declared_tests(data: dict, metric: str, declared_n: int = 6, seeds=(0, 1, 2), interim: str | None = None) -> dict:
    """T1-T6 on ``metric`` ("box" or "mask": each its own family), with Holm's adjustment over the declared four
    for T1-T4 and over all six for T5 / T6 (``holm_family``). A test with fewer than ``declared_n`` pipelines (the
    number declared) gets its numbers but no verdict (interim); the finetuning tests count a pipeline once all
    its ``seeds`` (the finetuning seeds) are there. ``interim`` (a reason: fewer pipelines or other seeds asked for
    than declared) makes every verdict interim."""
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
        t["verdict"] = f"interim: {interim}, no verdict" if interim and t["n"] else \
            _verdict(name, t) if t["n"] >= declared_n or t["n"] == 0 else \
            f"interim: {t['n']} of the {declared_n} declared pipelines, no verdict"
    return tests


def replication_view(f):
    """The replication's pipelines and seeds as declared, in the form ``interim_reason`` reads."""
    from types import SimpleNamespace

    return SimpleNamespace(declared_pipelines=f.replication_pipelines, pipelines=f.replication_pipelines,
                           finetune_seeds=f.finetune_seeds, declared_seeds=f.declared_seeds)


def interim_reason(f) -> str | None:
    """Why a report of study ``f`` (a ``footing.Footing``) can give no verdict whatever has run: it asks for fewer
    of the declared pipelines, or other finetuning seeds, than were declared (None when it asks for them all)."""
    declared = tuple(f.declared_pipelines)
    if tuple(f.finetune_seeds) != tuple(f.declared_seeds):
        return f"finetuning seeds {list(f.finetune_seeds)} asked for, {list(f.declared_seeds)} declared"
    if not set(declared) <= set(f.pipelines):
        return f"{len(set(f.pipelines) & set(declared))} of the {len(declared)} declared pipelines asked for"
    return None


def replication_tests(data: dict, rep: dict, metric: str, declared_n: int, seeds=(0, 1, 2),
                      interim: str | None = None) -> dict:
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
        t["verdict"] = f"interim: {interim}, no verdict" if interim and t["n"] else \
            _verdict(name, t) if t["n"] >= declared_n or t["n"] == 0 else \
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
    n = len(f.declared_pipelines)
    seeds = f.finetune_seeds
    interim = interim_reason(f)
    tests = {m: declared_tests(data, m, n, seeds, interim) for m in ("box", "mask")}
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
                   "tests": {m: replication_tests(data, rep, m, rn, seeds,
                                                  interim_reason(replication_view(f))) for m in ("box", "mask")},
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


# ------------------------------------------------------------------------------ the declared equivalence study
EQUIVALENCE_MARGIN = 0.25  # box AP: abs-win and naive are equivalent when abs-win - naive lies within +-0.25
PLANNING_SD = 0.45  # the pipeline sd the study was sized with (the earlier pipelines' abs-win - naive)
EQUIVALENCE = {  # declared before its runs (docs/equal_footing.md, "The equivalence study"); Holm over D1, D2
    "D1": "abs-win - naive after finetuning at canvas 1.25x, per-pipeline mean over its 4 finetuning seeds",
    "D2": "abs-win - naive zero-shot at canvas 1.25x (the same detector, no finetuning)",
}


def equivalence_tests(data: dict, metric: str, declared_n: int, seeds, interim: str | None = None) -> dict:
    """D1 / D2 on ``metric``: each a two-sided one-sample t test over pipelines with the exact sign-flip p beside
    it, and TOST at +-``EQUIVALENCE_MARGIN``; Holm over {D1, D2} for the t p and, apart, for the TOST p. Verdict
    (only with ``declared_n`` whole pipelines and no ``interim`` reason): "shown" when the Holm-adjusted t p <
    0.05, "equivalent within +-0.25" when the Holm-adjusted TOST p < 0.05, both when both, else "undecided"."""
    from winpos.experiments.stats import tost

    cell = "canvas 1.25x"
    zs = data["zero_shot"]
    diffs = {"D1": _detector_means(data["finetuned"], "abs2win", "naive", cell, metric, seeds),
             "D2": _paired(zs.get("abs2win", {}).get(cell, {}), zs.get("naive", {}).get(cell, {}), metric)}
    pipes = {"D1": _whole_pipelines(data["finetuned"], "abs2win", "naive", cell, seeds),
             "D2": sorted(set(zs.get("abs2win", {}).get(cell, {})) & set(zs.get("naive", {}).get(cell, {})), key=int)}
    tests = {}
    for name, d in diffs.items():
        t = dict(t_test(d, 0.0, "two-sided"), claim=EQUIVALENCE[name], pipelines=pipes[name])
        e = tost(d, EQUIVALENCE_MARGIN, ALPHA)
        t.update(tost_p_lower=e["p_lower"], tost_p_upper=e["p_upper"], tost_p=e["p"], ci90=e["ci"],
                 margin=EQUIVALENCE_MARGIN)
        tests[name] = t
    adjusted = holm({k: t["p_t"] for k, t in tests.items()})
    adjusted_tost = holm({k: t["tost_p"] for k, t in tests.items()})
    for name, t in tests.items():
        t["p_holm"], t["tost_p_holm"], t["holm_family"] = adjusted[name], adjusted_tost[name], list(EQUIVALENCE)
        if interim or t["n"] < declared_n:
            why = interim or f"{t['n']} of the {declared_n} declared pipelines whole"
            t["verdict"] = f"interim: {why}, no verdict"
        else:
            t["verdict"] = _equivalence_verdict(t)
    return tests


def _whole_pipelines(fin: dict, treat: str, base: str, cell: str, seeds) -> list:
    a, b = fin.get(treat, {}).get(cell, {}), fin.get(base, {}).get(cell, {})
    want = [str(s) for s in seeds]
    return [p for p in sorted(set(a) & set(b), key=int) if all(s in a[p] and s in b[p] for s in want)]


def _equivalence_verdict(t: dict) -> str:
    if t["n"] < 2:
        return f"not run (n={t['n']})"
    shown = t["p_holm"] < ALPHA
    equivalent = t["tost_p_holm"] < ALPHA
    side = "abs-win better than naive" if t["mean"] > 0 else "naive better than abs-win"
    if shown and equivalent:
        return f"shown ({side}), and within +-{t['margin']:g} AP: a difference smaller than the margin"
    if shown:
        return f"shown: {side} (Holm-adjusted t p < {ALPHA})"
    if equivalent:
        return f"equivalent within +-{t['margin']:g} AP (Holm-adjusted TOST p < {ALPHA})"
    return "undecided: neither a difference nor equivalence within the margin is shown"


def evaluation_noise(data: dict, metric: str, seeds) -> dict:
    """The evaluation noise of D1 / D2 from the two halves of each pipeline's own evaluation set: per pipeline the
    contrast on the even images minus on the odd ones; its sd over pipelines / 2 estimates the sd that evaluating
    on all the images adds to a pipeline's contrast (a half has twice the variance of the whole set, and the
    difference of two halves twice that of a half). Beside it the pipeline sd of the test (both in AP)."""
    cell = "canvas 1.25x"
    fin, zs = data["finetuned"], data["zero_shot"]
    out = {}
    splits = {}
    a, b = fin.get("abs2win", {}).get(cell, {}), fin.get("naive", {}).get(cell, {})
    want = [str(s) for s in seeds]
    splits["D1"] = [statistics.fmean((a[p][s]["halves"][metric][0] - b[p][s]["halves"][metric][0])
                                     - (a[p][s]["halves"][metric][1] - b[p][s]["halves"][metric][1]) for s in want)
                    for p in _whole_pipelines(fin, "abs2win", "naive", cell, seeds)
                    if all("halves" in a[p][s] and "halves" in b[p][s] for s in want)]
    za, zb = zs.get("abs2win", {}).get(cell, {}), zs.get("naive", {}).get(cell, {})
    splits["D2"] = [(za[p]["halves"][metric][0] - zb[p]["halves"][metric][0])
                    - (za[p]["halves"][metric][1] - zb[p]["halves"][metric][1])
                    for p in sorted(set(za) & set(zb), key=int) if "halves" in za[p] and "halves" in zb[p]]
    for name, d in splits.items():
        out[name] = {"n": len(d), "sd_eval": statistics.stdev(d) / 2 if len(d) >= 2 else None}
    return out


def analyze_equivalence(f, data: dict) -> dict:
    """The equivalence study's results (``f`` its ``footing.Footing``, ``data`` its ``collect``): D1 / D2 (box AP
    the decision, mask AP described the same way), the evaluation noise beside the pipeline sd, the power as
    declared and at the observed sd, the abs detectors' 64 px AP and reliance (AP lost when the embedding is
    zeroed), the finetuned and zero-shot AP per row, how many pipelines are whole, and the verdict sentence."""
    from winpos.experiments.stats import power_tost

    declared = tuple(f.declared_pipelines)
    interim = interim_reason(f)
    seeds = f.finetune_seeds
    tests = {m: equivalence_tests(data, m, len(declared), seeds, interim) for m in ("box", "mask")}
    noise = {m: evaluation_noise(data, m, seeds) for m in ("box", "mask")}
    d1 = tests["box"]["D1"]
    n = len(declared)
    power = {"declared": {"n": n, "sd": PLANNING_SD, "alpha_first_holm_step": ALPHA / 2,
                          "t_at_0.3": power_paired(0.3, PLANNING_SD, n), "t_at_0.3_holm": power_paired(
                              0.3, PLANNING_SD, n, ALPHA / 2),
                          "t_at_0.5": power_paired(0.5, PLANNING_SD, n),
                          "tost_at_0": power_tost(0.0, PLANNING_SD, n, EQUIVALENCE_MARGIN, ALPHA),
                          "tost_at_0_holm": power_tost(0.0, PLANNING_SD, n, EQUIVALENCE_MARGIN, ALPHA / 2)}}
    if d1["n"] >= 2 and d1.get("sd"):
        power["observed_sd"] = {"sd": d1["sd"], "t_at_0.3": power_paired(0.3, d1["sd"], n),
                                "tost_at_0": power_tost(0.0, d1["sd"], n, EQUIVALENCE_MARGIN, ALPHA)}
    whole = d1["pipelines"]
    cell = "canvas 1.25x"

    def rows(block):  # row -> mean [CI] over pipelines at the cell
        return {row: {m: mean_interval([v[m] for _, v in sorted(cells[cell].items(), key=lambda kv: int(kv[0]))])
                      for m in ("box", "mask")} for row, cells in block.items() if cell in cells}

    diag = diagnosis(data)
    ne, ap = data.get("no_embedding") or {}, data["ap64"].get("abs", {})
    reliance_per = {p: ap[p]["box"] - ne[p]["box"] for p in sorted(set(ne) & set(ap), key=int)}
    complete = interim is None and len(whole) == n
    finetuned = zero = None  # each row's mean at the cell: their difference is D1 / D2's estimate, withheld while interim
    if complete:
        zero = rows(data["zero_shot"])
        finetuned = {row: {m: mean_interval([statistics.fmean(v[str(s)][m] for s in seeds) for p, v in
                                             sorted(cells.get(cell, {}).items(), key=lambda kv: int(kv[0]))
                                             if all(str(s) in v for s in seeds)]) for m in ("box", "mask")}
                     for row, cells in data["finetuned"].items()}
    return {"study": asdict(f), "data": data, "declared_pipelines": list(declared), "whole_pipelines": whole,
            "interim": interim, "complete": complete, "tests": tests, "evaluation_noise": noise,
            "power": power, "margin": EQUIVALENCE_MARGIN,
            "ap64": {m: mean_interval([v[m] for _, v in sorted(ap.items(), key=lambda kv: int(kv[0]))])
                     for m in ("box", "mask")},
            "reliance": diag["reliance"], "reliance_per_pipeline": reliance_per,
            "finetuned": finetuned, "zero_shot": zero,
            "sentence": equivalence_sentence(d1, n, len(whole))}


def _p3(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def equivalence_short(t: dict) -> str | None:
    """The verdict as the demo's closing line quotes it (D1, box AP), or None while the study is interim."""
    if t["n"] < 2 or t["verdict"].startswith(("interim", "not run")):
        return None
    return (f"{t['mean']:+.2f} box AP [95% CI {t['ci'][0]:+.2f}, {t['ci'][1]:+.2f}] over {t['n']} detectors, TOST p "
            f"{_p3(t['tost_p_lower'])} / {_p3(t['tost_p_upper'])}: {t['verdict'].split(' (Holm')[0]}")


def equivalence_sentence(t: dict, declared_n: int, whole: int) -> str:
    """The study's result in one sentence a researcher can quote (D1, box AP)."""
    if t["n"] < 2:
        return f"Interim: {whole} of {declared_n} declared pipelines whole; no estimate yet."
    est = (f"abs-win - naive after finetuning at canvas 1.25x is {t['mean']:+.2f} box AP [95% CI "
           f"{t['ci'][0]:+.2f}, {t['ci'][1]:+.2f}] over {t['n']} independently trained detectors (TOST p "
           f"{_p3(t['tost_p_lower'])} / {_p3(t['tost_p_upper'])} at +-{t['margin']:g}, t p {_p3(t['p_t'])})")
    if t["verdict"].startswith("interim"):  # the stopping rule: nothing to read before every pipeline is whole
        return (f"Interim ({whole} of {declared_n} declared pipelines whole, no verdict): the estimate is withheld "
                "until every declared pipeline is whole (no peeking).")
    word = t["verdict"].split(" (Holm")[0]
    return f"{est[0].upper()}{est[1:]}: {word} (Holm over D1 / D2)."
