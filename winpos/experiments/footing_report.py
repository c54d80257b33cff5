"""Tables and figure of the equal-footing study (``winpos.experiments.footing``): every encoding's 64 px AP over
pipelines, its zero-shot AP at each larger grid with a dot per pipeline (absolute AP, never a share of its own),
the stage-0 readouts and the declared tests T1-T4 with Holm's adjustment."""
from __future__ import annotations

from winpos.experiments.footing import TESTS, ZERO_SHOT, zero_shot_rows
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
    for family in ("box", "mask"):
        lines.append(f"\ndeclared tests, {family} AP (Holm over T1-T4; a test not run counts as p = 1):")
        for name, t in result["tests"][family].items():
            ci = "-" if t["ci"] is None else f"[{t['ci'][0]:+.2f}, {t['ci'][1]:+.2f}]"
            mean = "-" if t["mean"] is None else f"{t['mean']:+.2f}"
            claim = TESTS[name].replace("box AP", f"{family} AP")
            lines.append(f"  {name} {claim}\n     n={t['n']} mean {mean} {ci}  p_t {_p(t['p_t'])}  "
                         f"p_sign-flip {_p(t['p_sign_flip'])}  Holm p {_p(t['p_holm'])}  -> {t['verdict']}")
    mae = result.get("hiera_mae")
    if mae:
        h = mae["history"]
        lines.append(f"\nHiera's MAE as stage 0, {h[-1]['iter']} iterations: WS@4 "
                     + " -> ".join(f"{r['ws']:.2f}@{r['iter']}" for r in _thin(h))
                     + "; reliance (held-out loss) "
                     + ", ".join(f"{k} {v:.3f}" for k, v in mae["reliance"].items()))
    return "\n".join(lines)


def plot_footing(result: dict, path: str) -> None:
    """Left: 64 px box AP per encoding (a dot per pipeline, the mean and its 95% interval). Right: zero-shot box AP
    against the grid (canvas 1x = 64 px, 2x, 4x), a line per encoding through the means and a dot per pipeline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from winpos.outputs import atomic_savefig

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
