"""Text and figure of the declared equivalence study (``winpos.experiments.footing.equivalence_study``, analysed by
``footing_analysis.analyze_equivalence``): the verdict sentence, D1 / D2 with TOST's two p values once every declared
pipeline is whole (withheld before: the stopping rule), the power, the detectors' AP and their reliance on the
embedding. The number formats are the equal-footing report's (``footing_report``)."""
from __future__ import annotations

from winpos.experiments.footing_report import _mi, _p, _signed

__all__ = ["format_equivalence", "plot_equivalence"]


def format_equivalence(result: dict) -> str:
    """The equivalence study's report (``footing_analysis.analyze_equivalence``): the verdict sentence, D1 / D2 with
    their per-pipeline values, 95% interval, t / sign-flip / Holm p and TOST's two p values, the evaluation noise
    beside the pipeline sd, the power, the detectors' AP and reliance."""
    declared = result["declared_pipelines"]
    whole = result["whole_pipelines"]
    head = "INTERIM, no verdict" if not result["complete"] else "complete"
    lines = [f"equivalence study (declared before its runs; pipelines {declared[0]}-{declared[-1]}): "
             f"{len(whole)} of {len(declared)} pipelines whole: {head}"
             + (f" ({result['interim']})" if result["interim"] else ""),
             "", result["sentence"], ""]
    for family in ("box", "mask"):
        what = "the decision" if family == "box" else "described the same way"
        lines.append(f"{family} AP ({what}; Holm over D1, D2 for the t p and, apart, for the TOST p; margin "
                     f"+-{result['margin']:g}):")
        for name, t in result["tests"][family].items():
            lines.append(f"  {name} {t['claim']}")
            if t["n"] < 2:
                lines.append(f"     n={t['n']}: no interval yet")
                continue
            if t["verdict"].startswith("interim"):  # the declared stopping rule: no peeking
                lines.append(f"     n={t['n']}: the interval, p values and per-pipeline differences are withheld "
                             f"until the study is whole ({t['verdict']})")
                continue
            per = ", ".join(f"p{p} {d:+.2f}" for p, d in zip(t["pipelines"], t["diffs"]))
            lines.append(f"     n={t['n']} mean {t['mean']:+.3f} [{t['ci'][0]:+.3f}, {t['ci'][1]:+.3f}] (95%; 90% "
                         f"[{t['ci90'][0]:+.3f}, {t['ci90'][1]:+.3f}])  sd {t['sd']:.3f}  p_t {_p(t['p_t'])}  "
                         f"p_sign-flip {_p(t['p_sign_flip'])}  Holm p {_p(t['p_holm'])}")
            lines.append(f"     TOST p lower {_p(t['tost_p_lower'])} / upper {_p(t['tost_p_upper'])}, Holm "
                         f"{_p(t['tost_p_holm'])}  -> {t['verdict']}")
            lines.append(f"     per pipeline: {per}")
            noise = result["evaluation_noise"][family].get(name) or {}
            if noise.get("sd_eval") is not None:
                lines.append(f"     evaluation noise (split halves, {noise['n']} pipelines): sd {noise['sd_eval']:.3f} "
                             f"AP beside the pipeline sd {t['sd']:.3f}")
    pw = result["power"]["declared"]
    lines.append(f"\npower as declared (n = {pw['n']}, pipeline sd {pw['sd']:g}): t test at a true +-0.3 AP "
                 f"{pw['t_at_0.3']:.2f} (alpha 0.05) / {pw['t_at_0.3_holm']:.2f} (Holm's first step, 0.025), "
                 f"at 0.5 {pw['t_at_0.5']:.2f}; TOST at a true 0 {pw['tost_at_0']:.2f} / {pw['tost_at_0_holm']:.2f}")
    if "observed_sd" in result["power"] and result["complete"]:  # the contrast's sd: withheld while interim
        o = result["power"]["observed_sd"]
        lines.append(f"power at the observed sd {o['sd']:.3f}: t at 0.3 {o['t_at_0.3']:.2f}, TOST at 0 "
                     f"{o['tost_at_0']:.2f}")
    lines.append(f"\nabs detectors, 64 px: box AP {_mi(result['ap64']['box'])}, mask {_mi(result['ap64']['mask'])}")
    rel = result["reliance"]
    if rel["box"]["n"]:
        lines.append(f"reliance, 64 px AP lost when the embedding is zeroed: box {_signed(rel['box'])}, mask "
                     f"{_signed(rel['mask'])}")
    if result["zero_shot"] is None or result["finetuned"] is None:
        lines.append("zero-shot and finetuned AP per row at canvas 1.25x: withheld while interim (their difference "
                     "is D1 / D2's estimate)")
        return "\n".join(lines)
    for row, v in result["zero_shot"].items():
        lines.append(f"zero-shot canvas 1.25x {row:8s} box {_mi(v['box'])} / mask {_mi(v['mask'])}")
    for row, v in result["finetuned"].items():
        lines.append(f"finetuned canvas 1.25x {row:8s} box {_mi(v['box'])} / mask {_mi(v['mask'])}")
    return "\n".join(lines)


def _jitter(i: int) -> float:
    """A fixed horizontal offset per dot (-0.05..+0.05, repeating), so that 24 dots at one x stay apart."""
    return ((i * 7) % 11 - 5) / 100


def _verdict_label(verdict: str, margin: float) -> str:
    """The verdict in the figure's words: 'shown', 'equivalent', 'undecided', and both when both hold."""
    if verdict.startswith("shown") and "within" in verdict:
        return f"shown, and within\n+-{margin:g} AP"
    return verdict.split(":")[0].split(" (")[0]


def plot_equivalence(result: dict, path: str) -> bool:
    """The equivalence study in one figure: per test (D1 finetuned, D2 zero-shot) the per-pipeline abs-win - naive
    box AP (dots), the mean with its 95% interval (the t test) and 90% interval (TOST), the zero line and the
    +-margin band; right, each pipeline's reliance (64 px box AP lost when the embedding is zeroed). The title says
    interim until every declared pipeline is whole. Returns False (draws nothing) before any pipeline has a D1 or D2
    value."""
    box = result["tests"]["box"]
    if not any(t["n"] for t in box.values()):
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from winpos.utils.outputs import atomic_savefig

    m = result["margin"]
    fig, axes = plt.subplots(1, 2, figsize=(11.5, 4.8), gridspec_kw={"width_ratios": [1.6, 1]})
    ax = axes[0]
    spans = [m * 1.6]
    names = list(box)
    for j, name in enumerate(names):
        t = box[name]
        if t["verdict"].startswith("interim"):  # the declared stopping rule: no dots before the study is whole
            ax.text(j, 0.5 * m, f"n={t['n']}: withheld\nuntil every declared\npipeline is whole", ha="center",
                    va="bottom", fontsize=8, color="0.3")
            continue
        d = t["diffs"]
        spans += [abs(v) for v in d]
        ax.plot([j - 0.1 + _jitter(i) for i in range(len(d))], d, ".", color="0.35", ms=7, alpha=0.8, zorder=2)
        if t["n"] >= 2:
            spans += [abs(v) for v in t["ci"]]
            ax.errorbar([j + 0.12], [t["mean"]], yerr=[[t["mean"] - t["ci"][0]], [t["ci"][1] - t["mean"]]],
                        fmt="o", color="tab:red", capsize=5, mfc="none", zorder=3, label="mean, 95% CI" if j == 0 else None)
            ax.errorbar([j + 0.2], [t["mean"]], yerr=[[t["mean"] - t["ci90"][0]], [t["ci90"][1] - t["mean"]]],
                        fmt="none", color="tab:blue", capsize=3, lw=2.5, zorder=3,
                        label="90% CI (TOST: inside the band = equivalent)" if j == 0 else None)
            ax.annotate(f"{t['mean']:+.2f} [{t['ci'][0]:+.2f}, {t['ci'][1]:+.2f}]\nTOST p {t['tost_p_lower']:.3f} / "
                        f"{t['tost_p_upper']:.3f}\nt p {t['p_t']:.3f}\n{_verdict_label(t['verdict'], m)}",
                        (j + 0.28, t["mean"]), fontsize=7.5, va="center", color="tab:red")
    ax.axhspan(-m, m, color="tab:green", alpha=0.12, label=f"equivalence margin +-{m:g} AP")
    ax.axhline(0, color="k", lw=0.8)
    half = max(spans) * 1.15
    ax.set_ylim(-half, half)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([f"{n}: finetuned (4 seeds)" if n == "D1" else f"{n}: zero-shot" for n in names])
    ax.set_xlim(-0.5, len(names) + 0.2)
    ax.set_ylabel("abs-win - naive, box AP at canvas 1.25x\n(a dot per pipeline, its own evaluation set)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7.5, loc="lower left")
    rel = result["reliance_per_pipeline"]
    ax2 = axes[1]
    if rel:
        vals = list(rel.values())
        ax2.plot(range(len(vals)), vals, "o", color="tab:purple", ms=5)
        r = result["reliance"]["box"]
        if r["ci"]:
            ax2.axhspan(r["ci"][0], r["ci"][1], color="tab:purple", alpha=0.12)
            ax2.axhline(r["mean"], color="tab:purple", lw=1, label=f"mean {r['mean']:.2f} [{r['ci'][0]:.2f}, "
                                                                      f"{r['ci'][1]:.2f}]")
            ax2.legend(fontsize=8)
        ax2.set_xticks(range(len(vals)))
        ax2.set_xticklabels([str(p) for p in rel], fontsize=7)
    ax2.axhline(0, color="k", lw=0.8)
    ax2.set_xlabel("pipeline")
    ax2.set_ylabel("64 px box AP lost with the embedding zeroed")
    ax2.set_title("reliance of the detectors on their embedding", fontsize=9)
    ax2.grid(alpha=0.3)
    n, total = len(result["whole_pipelines"]), len(result["declared_pipelines"])
    state = "complete" if result["complete"] else f"INTERIM: {n} of {total} pipelines whole, no verdict"
    s = result["study"]
    fig.suptitle(f"Equivalence study: abs-win vs naive at canvas 1.25x (stage 1 {s['stage1_iters']} it, "
                 f"finetuning {s['finetune_iters']} it; {state})", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)
    return True
