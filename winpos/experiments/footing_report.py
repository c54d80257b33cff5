"""Tables and figure of the equal-footing study (``winpos.experiments.footing``): every encoding's 64 px AP over
pipelines, its zero-shot AP at each larger grid with a dot per pipeline (absolute AP, never a share of its own),
the stage-0 readouts, the finetuned abs detectors, the declared tests T1-T6 with Holm's adjustment and the declared
replication of T5 / T6 (R5 / R6 on new pipelines, beside T5 / T6 in ``plot_replication``)."""
from __future__ import annotations

from winpos.experiments.footing import FINETUNE_CELLS, TESTS, ZERO_SHOT, zero_shot_rows
from winpos.experiments.protocol import label

_COLORS = {"rope": "tab:orange", "relpos": "tab:green", "lookhere": "tab:purple", "abs": "tab:blue",
           "naive": "tab:blue", "abs2win": "tab:red"}


def _mi(entry, digits: int = 1) -> str:
    if not entry or entry.get("mean") is None:
        return "-"
    if entry["ci"] is None:
        return f"{entry['mean']:.{digits}f} (n={entry['n']})"
    lo, hi = entry["ci"]
    return f"{entry['mean']:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}] (n={entry['n']})"


def _signed(entry) -> str:
    """A difference: mean [95% CI] (n) with signs, two decimals."""
    if not entry or entry.get("mean") is None:
        return "-"
    ci = "" if entry["ci"] is None else f" [{entry['ci'][0]:+.2f}, {entry['ci'][1]:+.2f}]"
    return f"{entry['mean']:+.2f}{ci} (n={entry['n']})"


def _p(v) -> str:
    return "-" if v is None else f"{v:.4f}"


def _thin(history: list, most: int = 8) -> list:
    """About ``most`` rows of a stage-0 history, the first and the last always among them."""
    picked = history[:: max(len(history) // (most - 1), 1)]
    return picked if picked[-1] is history[-1] else picked + [history[-1]]


def format_footing(result: dict) -> str:
    lines = ["encoding   64 px box AP [95% CI over pipelines]   64 px mask AP              stage-0 final WS@4 / loss"]
    for enc, ap in result["ap64"].items():
        s0 = result["stage0"].get(enc) or {}
        ws = _mi(s0.get("final_ws"), 2) if s0.get("final_ws") else "none (no abs embedding)"
        loss = s0.get("final_loss", {}).get("mean")
        lines.append(f"{enc:10s} {_mi(ap['box']):38s} {_mi(ap['mask']):26s} {ws} / "
                     f"{'-' if loss is None else f'{loss:.3f}'}")
    lines.append("\nzero-shot box AP (absolute; mean [95% CI] over pipelines):")
    for row, cells in result["zero_shot"].items():
        lines.append(f"  {row:9s} " + "; ".join(f"{cell}: {_mi(v['box'])}" for cell, v in sorted(cells.items())))
    fin = result.get("finetuned") or {}
    if fin:
        lines.append("\nfinetuned box / mask AP (abs detectors; per pipeline the mean over finetuning seeds; "
                     "mean [95% CI] over pipelines):")
        for row, cells in fin.items():
            lines.append(f"  {row:9s} " + "; ".join(f"{cell}: {_mi(v['box'])} / {_mi(v['mask'])}"
                                                    for cell, v in sorted(cells.items())))
    study = result.get("study") or {}
    if study.get("eval_images") is None and not study.get("drawn_seeds"):
        seeds = ", ".join(str(x) for x in study.get("finetune_seeds") or ())
        lines.append(f"\nevery interval of this study covers training randomness only: all pipelines are evaluated on "
                     f"the same images and finetuned with the same seeds ({seeds}), so neither is sampled")
    for family in ("box", "mask"):
        lines.append(f"\ndeclared tests, {family} AP (Holm over T1-T4 as declared, T5-T6 over all six; a test not run "
                     "counts as p = 1):")
        for name, t in result["tests"][family].items():
            ci = "-" if t["ci"] is None else f"[{t['ci'][0]:+.2f}, {t['ci'][1]:+.2f}]"
            mean = "-" if t["mean"] is None else f"{t['mean']:+.2f}"
            claim = TESTS[name].replace("box AP", f"{family} AP")
            lines.append(f"  {name} {claim}\n     n={t['n']} mean {mean} {ci}  p_t {_p(t['p_t'])}  "
                         f"p_sign-flip {_p(t['p_sign_flip'])}  Holm p {_p(t['p_holm'])}  -> {t['verdict']}")
    for name, pw in (result.get("power") or {}).items():
        need, half = (v or "over 500" for v in (pw["n_for_80pct"], pw["n_for_80pct_at_half_effect"]))
        lines.append(f"\npower of {name} (box): effect {pw['observed_effect']:+.2f}, sd {pw['sd']:.2f} over {pw['n']} "
                     f"pipelines -> power {pw['power_at_observed']:.2f}; 80% power needs {need} pipelines "
                     f"({half} at half the effect)")
    lines += _diagnosis_lines(result.get("diagnosis") or {}, "the abs detectors")
    lines += _replication_lines(result.get("replication"))
    mae = result.get("hiera_mae")
    if mae:
        h = mae["history"]
        lines.append(f"\nthe masked stage-0 variant (hiera_mae: loss on masked units, masked tokens kept in the encoder, "
                     f"a linear decoder; not Hiera's MAE), {h[-1]['iter']} iterations: WS@4 "
                     + " -> ".join(f"{r['ws']:.2f}@{r['iter']}" for r in _thin(h))
                     + "; reliance (held-out loss) "
                     + ", ".join(f"{k} {v:.3f}" for k, v in mae["reliance"].items()))
    return "\n".join(lines)


def _diagnosis_lines(diag: dict, whose: str) -> list:
    if not (diag.get("reliance", {}).get("box", {}).get("n") or diag.get("zero_shot_gain")):
        return []
    lines = [f"\ndiagnosis of {whose} (described, not a declared test; mean [95% CI] over pipelines):"]
    rel = diag["reliance"]
    if rel["box"]["n"]:
        lines.append(f"  64 px AP lost when the embedding is zeroed: box {_signed(rel['box'])}, "
                     f"mask {_signed(rel['mask'])}")
    ws = diag.get("window_structure") or {}
    if "ws" in ws:
        lines.append(f"  stage-1 embedding, centred WS@4 at 64 px {_mi(ws['ws'], 2)}; resized to k times the grid:")
        for how, name in (("naive", "naive"), ("abswin", "abs-win")):
            lines.append(f"    {name}: " + "; ".join(f"{k.split('_')[-1]} {_mi(v, 2)}" for k, v in ws.items()
                                                 if k.startswith(f"ws_{how}_")))
    for cell, g in (diag.get("zero_shot_gain") or {}).items():
        lines.append(f"  zero-shot abs-win - naive, {cell}: box {_signed(g['box'])}, mask {_signed(g['mask'])}")
    return lines


def _replication_lines(rep) -> list:
    """The declared replication of T5 / T6 (R5 / R6 over new pipelines only, Holm over the two)."""
    if not rep:
        return []
    pipes = rep["pipelines"]
    lines = [f"\nreplication of T5 / T6 over pipelines {pipes[0]}-{pipes[-1]} (declared before its runs; "
             f"{len(rep['missing'])} of its runs missing): abs 64 px box AP {_mi(rep['ap64']['box'])}, "
             f"mask {_mi(rep['ap64']['mask'])}"]
    for row, v in rep["finetuned"].items():
        lines.append(f"  finetuned canvas 1.25x {row:9s} box {_mi(v['box'])} / mask {_mi(v['mask'])}")
    for family in ("box", "mask"):
        lines.append(f"  replication tests, {family} AP (Holm over R5, R6; pipelines 0-5 do not enter them):")
        for name, t in rep["tests"][family].items():
            ci = "-" if t["ci"] is None else f"[{t['ci'][0]:+.2f}, {t['ci'][1]:+.2f}]"
            mean = "-" if t["mean"] is None else f"{t['mean']:+.2f}"
            pooled = f"\n     pooled with the study's pipelines (a description): {_signed(t['pooled'])}" if t["n"] else ""
            lines.append(f"  {name} (= {t['replicates']} again) {t['claim']}\n     n={t['n']} mean {mean} {ci}  "
                         f"p_t {_p(t['p_t'])}  p_sign-flip {_p(t['p_sign_flip'])}  Holm p {_p(t['p_holm'])}  -> "
                         f"{t['verdict']}{pooled}")
    lines += [line.replace("\n", "\n  ", 1) if i == 0 else "  " + line
              for i, line in enumerate(_diagnosis_lines(rep.get("diagnosis") or {}, "the replication's detectors"))]
    return lines


def plot_footing(result: dict, path: str) -> None:
    """Left: 64 px box AP per encoding (a dot per pipeline, the mean and its 95% interval). Right: zero-shot box AP
    against the grid (canvas 1x = 64 px, 2x, 4x), a line per encoding through the means and a dot per pipeline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from winpos.utils.outputs import atomic_savefig

    data = result["data"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.6), gridspec_kw={"width_ratios": [1, 1.3, 1.3]})
    ax = axes[0]
    encs = list(result["ap64"])
    for i, enc in enumerate(encs):
        vals = [v["box"] for v in data["ap64"][enc].values()]
        ax.plot([i] * len(vals), vals, ".", color=_COLORS.get(enc, "k"), ms=6, alpha=0.7)
        m = result["ap64"][enc]["box"]
        if m["ci"]:
            ax.errorbar([i + 0.15], [m["mean"]], yerr=[[m["mean"] - m["ci"][0]], [m["ci"][1] - m["mean"]]],
                        fmt="o", color=_COLORS.get(enc, "k"), capsize=4, mfc="none")
    allv = [v["box"] for e in encs for v in data["ap64"][e].values()]
    if allv:  # at least +-2 AP around the points, so a 0.1 AP difference does not fill the panel
        mid, half = (max(allv) + min(allv)) / 2, max((max(allv) - min(allv)) / 2 + 0.5, 2.0)
        ax.set_ylim(mid - half, mid + half)
    ax.set_xticks(range(len(encs)))
    ax.set_xticklabels(encs)
    ax.set_xlim(-0.5, len(encs) - 0.3)
    ax.set_ylabel("box AP at 64 px (stage 1)")
    ax.set_title("64 px: dots = pipelines, circle = mean, 95% CI", fontsize=9)
    ax.grid(alpha=0.3)
    for ax, cond in zip(axes[1:], ("canvas", "upscaled")):
        ks = [k for c, k in ZERO_SHOT if c == cond]
        for enc in encs:
            for row in zero_shot_rows(enc):
                # at 1x every row is its stage-1 detector (the abs-win conversion is exact at 64 px)
                xs, means = [1], [result["ap64"][enc]["box"]["mean"]]
                for k in ks:
                    cell = data["zero_shot"].get(row, {}).get(f"{cond} {label(k)}", {})
                    if not cell:
                        continue
                    vals = [v["box"] for v in cell.values()]
                    off = 1.0 + 0.03 * (encs.index(enc) - 1.5) + (0.02 if row == "abs2win" else 0)
                    ax.plot([k * off] * len(vals), vals, ".", color=_COLORS.get(row, "k"), ms=4, alpha=0.6)
                    xs.append(k)
                    means.append(sum(vals) / len(vals))
                if len(xs) > 1:
                    name = {"naive": "abs (naive)", "abs2win": "abs -> abs-win"}.get(row, row)
                    ax.plot(xs, means, "--" if row == "abs2win" else "-", marker="o", mfc="none",
                            color=_COLORS.get(row, "k"), label=name)
        ax.set_xscale("log", base=2)
        ax.set_xticks([1] + ks)
        ax.set_xticklabels(["1x (64 px)"] + [f"{k:g}x" for k in ks])
        ax.minorticks_off()
        ax.set_xlabel("token grid multiplier")
        ax.set_ylabel("box AP, zero-shot")
        what = "same-size objects, larger canvas" if cond == "canvas" else "64 px images upscaled"
        ax.set_title(f"zero-shot, {cond} ({what}); dots = pipelines", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    s = result["study"]
    n = max((len(v) for v in data["ap64"].values()), default=0)
    fig.suptitle(f"Equal footing: every encoding pretrained with itself (stage 0 {s['stage0_iters']} it, stage 1 "
                 f"{s['stage1_iters']} it at 64 px); independent pipelines per encoding: up to {n}", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)


_FINETUNE_NAMES = {"naive": "naive", "abs2win": "abs-win", "control": "control\n(zero window)"}


def _cell_tests(cell: str) -> list:
    """The declared finetuning tests of one cell, in order (e.g. T3, T4 for canvas 4x)."""
    return [n for n, claim in TESTS.items() if f"at {cell}" in claim]


def plot_finetuned(result: dict, path: str) -> bool:
    """The finetuned abs detectors (T3-T6), a column per finetuning cell. Top: box AP of naive / abs-win / control,
    a dot per pipeline that has every finetuning seed (its mean over them), joined by a grey line within the
    pipeline. Bottom: what the tests test, the paired difference per pipeline (abs-win - naive, abs-win - control),
    its mean with the test's 95% t-interval, the zero line, n and the Holm-adjusted p. A cell with no such pipeline
    yet says so. Returns False (and writes nothing) when no finetuning run is there at all."""
    data = result["data"]["finetuned"]
    if not any(data.values()):
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from winpos.utils.outputs import atomic_savefig

    s = result["study"]
    seeds = [str(x) for x in s["finetune_seeds"]]
    cells = [f"{c} {label(k)}" for c, k in FINETUNE_CELLS]
    rows = list(_FINETUNE_NAMES)
    fig, axes = plt.subplots(2, len(cells), figsize=(5.6 * len(cells), 8.2), squeeze=False,
                             gridspec_kw=dict(height_ratios=(1.15, 1)))
    for col, cell in enumerate(cells):
        ax, dax = axes[0][col], axes[1][col]
        per = {r: {p: sum(v[x]["box"] for x in seeds) / len(seeds)
                   for p, v in data.get(r, {}).get(cell, {}).items() if all(x in v for x in seeds)} for r in rows}
        pipes = sorted({p for r in rows for p in per[r]}, key=int)
        for p in pipes:
            xs = [i for i, r in enumerate(rows) if p in per[r]]
            ax.plot(xs, [per[rows[i]][p] for i in xs], "-", color="0.75", lw=0.8, zorder=1)
        for i, r in enumerate(rows):
            vals = list(per[r].values())
            ax.plot([i] * len(vals), vals, ".", color=_COLORS.get(r, "tab:gray"), ms=8, zorder=2)
        allv = [v for r in rows for v in per[r].values()]
        if allv:  # at least +-1.5 AP around the points, so a 0.1 AP difference does not fill the panel
            mid, half = (max(allv) + min(allv)) / 2, max((max(allv) - min(allv)) / 2 + 0.3, 1.5)
            ax.set_ylim(mid - half, mid + half)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([_FINETUNE_NAMES[r] for r in rows])
        ax.set_xlim(-0.5, len(rows) - 0.5)
        ax.set_ylabel(f"box AP after finetuning at {cell}")
        ax.set_title(f"{cell}: {len(pipes)} pipeline{'s' * (len(pipes) != 1)} with seeds {', '.join(seeds)} "
                     "(grey line: one detector)", fontsize=9)
        ax.grid(alpha=0.3)

        names = _cell_tests(cell)
        box = result["tests"]["box"]
        spans = [0.0]
        for j, name in enumerate(names):
            t = box[name]
            d = t["diffs"]  # per pipeline with every finetuning seed: what the test averages
            spans += d
            dax.plot([j] * len(d), d, ".", color="0.35", ms=8, zorder=2)
            if t["n"] >= 2 and t["ci"] is not None:
                spans += list(t["ci"])
                dax.errorbar([j + 0.18], [t["mean"]], yerr=[[t["mean"] - t["ci"][0]], [t["ci"][1] - t["mean"]]],
                             fmt="o", color="tab:red", capsize=5, mfc="none", zorder=3)
                dax.annotate(f"{t['mean']:+.2f}\n[{t['ci'][0]:+.2f}, {t['ci'][1]:+.2f}]\nHolm p {t['p_holm']:.2f}",
                             (j + 0.26, t["mean"]), fontsize=8, va="center", color="tab:red")
        dax.axhline(0, color="k", lw=0.8)
        half = max(max(abs(v) for v in spans) * 1.15, 1.0)
        dax.set_ylim(-half, half)
        dax.set_xticks(range(len(names)))
        dax.set_xticklabels([f"{n}: abs-win - {'naive' if '- naive' in TESTS[n] else 'control'}" for n in names])
        dax.set_xlim(-0.5, len(names) - 0.3)
        dax.set_ylabel("paired difference, box AP")
        n_t = [box[n]["n"] for n in names]
        dax.set_title(f"what {' / '.join(names)} test: a dot per pipeline, mean and 95% t-interval (n = "
                      f"{', '.join(map(str, n_t))})", fontsize=9)
        dax.grid(alpha=0.3)
        if not allv:
            for a, y in ((ax, 0.5), (dax, 0.75)):
                a.text(0.5, y, "not run yet", transform=a.transAxes, ha="center", va="center", color="0.4")
                a.set_yticks([])
    fig.suptitle(f"Finetuned abs detectors ({s['finetune_iters']} iterations); "
                 "a dot = one pipeline's mean over its finetuning seeds", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)
    return True


def plot_replication(result: dict, path: str) -> bool:
    """T5 / T6 and their declared replication R5 / R6 side by side (box AP after finetuning at canvas 1.25x): per
    contrast a panel with a dot per pipeline (its mean over the finetuning seeds), first the study's pipelines, then
    the replication's new ones, then all of them pooled (a description), each with its mean, 95% t-interval and,
    for the tests, Holm's p. Returns False (and draws nothing) before any replication run has finished."""
    rep = result.get("replication")
    if not rep or not any(t["n"] for t in rep["tests"]["box"].values()):
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from winpos.experiments.stats import mean_interval
    from winpos.utils.outputs import atomic_savefig

    first_pipes = result["study"]["pipelines"]
    fig, axes = plt.subplots(1, 2, figsize=(11.5, 4.6), sharey=True)
    spans = [0.0]
    for ax, name in zip(axes, ("R5", "R6")):
        r = rep["tests"]["box"][name]
        t = result["tests"]["box"][r["replicates"]]
        pooled = dict(mean_interval(t["diffs"] + r["diffs"]), p_holm=None)
        groups = ((f"{r['replicates']}: pipelines {first_pipes[0]}-{first_pipes[-1]}\n(the study)", t),
                  (f"{name}: pipelines {rep['pipelines'][0]}-{rep['pipelines'][-1]}\n(declared replication)", r),
                  ("pooled, all pipelines\n(a description)", dict(pooled, diffs=t["diffs"] + r["diffs"])))
        for j, (_, g) in enumerate(groups):
            d = g["diffs"]
            spans += d
            ax.plot([j - 0.08] * len(d), d, ".", color="0.35", ms=8, zorder=2)
            if g.get("n", len(d)) >= 2 and g.get("ci") is not None:
                spans += list(g["ci"])
                ax.errorbar([j + 0.1], [g["mean"]], yerr=[[g["mean"] - g["ci"][0]], [g["ci"][1] - g["mean"]]],
                            fmt="o", color="tab:red", capsize=5, mfc="none", zorder=3)
                p = g.get("p_holm")
                holm = "" if p is None else "\nHolm p <= 0.001" if p <= 0.001 else f"\nHolm p {p:.3f}"
                ax.annotate(f"{g['mean']:+.2f}\n[{g['ci'][0]:+.2f}, {g['ci'][1]:+.2f}]{holm}", (j + 0.17, g["mean"]),
                            fontsize=8, va="center", color="tab:red")
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xticks(range(3))
        ax.set_xticklabels([g[0] for g in groups], fontsize=8)
        ax.set_xlim(-0.4, 2.75)
        base = "naive" if name == "R5" else "the control"
        ax.set_title(f"abs-win - {base}, box AP after finetuning at canvas 1.25x\n({r['n']} of "
                     f"{len(rep['pipelines'])} replication pipelines whole; verdict: {r['verdict'].split(':')[0]})",
                     fontsize=9)
        ax.grid(alpha=0.3)
    half = max(max(abs(v) for v in spans) * 1.15, 0.5)
    axes[0].set_ylim(-half, half)
    axes[0].set_ylabel("paired difference per pipeline, box AP\n(mean over 3 finetuning seeds)")
    fig.suptitle("The demo's cell over independently trained detectors: T5 / T6 and their declared replication",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)
    return True


# ------------------------------------------------------------------------------ the declared equivalence study
