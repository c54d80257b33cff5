"""Tables and plots of ``winpos.d2.reproduce`` results: mean and spread over seeds per row, condition and grid."""
from __future__ import annotations

import statistics
import textwrap

from winpos.d2.reproduce import CONDITIONS, PRETRAIN_SIZE, ROWS, label


def _mean_std(values):
    values = list(values)
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def summarize(p: Protocol, stage1: dict, runs: list[dict]) -> dict:
    """Mean, sample std and per-seed values of box / mask AP per (row, condition, multiplier) in ``"stage2"``;
    the evaluations without finetuning (names ending in ``zero-shot``) per cell in ``"zero_shot"``."""
    table, zero_shot = {}, {}
    for out in runs:
        s = out["spec"]
        row, cond = s["name"].split("/")[:2]
        k = label(s["size"] / PRETRAIN_SIZE)
        if s["name"].endswith("zero-shot"):
            zero_shot.setdefault(row, {}).setdefault(cond, {})[k] = {"box": out["bbox"]["AP"], "mask": out["segm"]["AP"]}
            continue
        cell = table.setdefault(row, {}).setdefault(cond, {}).setdefault(k, {"box": [], "mask": [], "seeds": []})
        cell["box"].append(out["bbox"]["AP"])
        cell["mask"].append(out["segm"]["AP"])
        cell["seeds"].append(s["seed"])
    for row in table.values():
        for cond in row.values():
            for cell in cond.values():
                for key in ("box", "mask"):
                    cell[f"{key}_mean"], cell[f"{key}_std"] = _mean_std(cell[key])
    return {"protocol": {k: v for k, v in vars(p).items()}, "stage1": stage1, "stage2": table, "zero_shot": zero_shot}


def format_zero_shot(summary: dict) -> str:
    """Markdown table of the stage-2 starts evaluated without finetuning, and the 64 px AP of each stage-1 detector
    with and without its token embedding."""
    zs, st1 = summary.get("zero_shot", {}), summary["stage1"]
    cols = [(c, k) for c in CONDITIONS for k in _multiplier_labels(zs, c)]
    lines = ["| row | 64 px box AP (embedding zeroed) | " + " | ".join(f"{c} {k} box / mask AP" for c, k in cols) + " |",
             "|" + "---|" * (len(cols) + 2)]
    for row, cells in zs.items():
        info = st1[ROWS[row].pretrained]
        at64 = "-" if info.get("box_AP_64px") is None else f"{info['box_AP_64px']:.1f}"
        if info.get("box_AP_64px_no_embedding") is not None:
            at64 += f" ({info['box_AP_64px_no_embedding']:.1f})"
        vals = ["-" if cells.get(c, {}).get(k) is None else
                f"{cells[c][k]['box']:.1f} / {cells[c][k]['mask']:.1f}" for c, k in cols]
        lines.append(f"| {ROWS[row].label} | {at64} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def compare_pairs(summary: dict) -> list[dict]:
    """Each converted row against its naive partner (same stage-1 checkpoint), per (condition, multiplier) where
    both finished: the difference of mean box AP, the per-seed differences (same seed = same data order and head
    initialisation) and whether the difference exceeds the seed spread (the larger std of the two rows; needs
    >= 2 seeds each). Evaluations without finetuning have no seed: their difference is listed as ``zero_shot``."""
    st2, zs = summary["stage2"], summary.get("zero_shot", {})
    pairs = []
    for conv, row in ROWS.items():
        naive = next((r for r, v in ROWS.items() if v.pretrained == row.pretrained and not v.convert), None)
        if not row.convert or naive is None:
            continue
        for c in CONDITIONS:
            for k in sorted(set(st2.get(conv, {}).get(c, {})) | set(zs.get(conv, {}).get(c, {})), key=lambda x: float(x[:-1])):
                a, b = st2.get(naive, {}).get(c, {}).get(k), st2.get(conv, {}).get(c, {}).get(k)
                za, zb = zs.get(naive, {}).get(c, {}).get(k), zs.get(conv, {}).get(c, {}).get(k)
                entry = {"naive": naive, "converted": conv, "condition": c, "multiplier": k,
                         "zero_shot": None if za is None or zb is None else zb["box"] - za["box"]}
                if a is not None and b is not None:
                    sa, sb = dict(zip(a.get("seeds", []), a["box"])), dict(zip(b.get("seeds", []), b["box"]))
                    spread = max(a["box_std"], b["box_std"]) if min(len(a["box"]), len(b["box"])) >= 2 else None
                    delta = b["box_mean"] - a["box_mean"]
                    entry.update(delta=delta, per_seed=[sb[s] - sa[s] for s in sorted(set(sa) & set(sb))],
                                 spread=spread, beyond_spread=None if spread is None else abs(delta) > spread)
                pairs.append(entry)
    return pairs


def format_pairs(summary: dict) -> str:
    """Markdown table of ``compare_pairs``: does the abs -> abs-win conversion beat naive interpolation?"""
    lines = ["| pair | condition, grid | converted - naive, box AP (per seed) | seed std (larger) | beyond the spread? "
             "| before finetuning |", "|---|---|---|---|---|---|"]
    for e in compare_pairs(summary):
        a, b = ROWS[e["naive"]].label.split(")")[0] + ")", ROWS[e["converted"]].label.split(")")[0] + ")"
        if "delta" in e:
            seeds = ", ".join(f"{d:+.1f}" for d in e["per_seed"])
            diff = f"{e['delta']:+.1f} ({seeds})"
            spread = "-" if e["spread"] is None else f"{e['spread']:.1f}"
            verdict = "1 seed: no spread" if e["beyond_spread"] is None else "yes" if e["beyond_spread"] else "no"
        else:
            diff, spread, verdict = "-", "-", "-"
        zero = "-" if e["zero_shot"] is None else f"{e['zero_shot']:+.1f}"
        lines.append(f"| {b} - {a} | {e['condition']} {e['multiplier']} | {diff} | {spread} | {verdict} | {zero} |")
    return "\n".join(lines)


def _multiplier_labels(st2: dict, condition: str) -> list[str]:
    found = {k for cells in st2.values() for k in cells.get(condition, {})}
    return sorted(found, key=lambda k: float(k[:-1]))


def format_table(summary: dict) -> str:
    """Markdown table: one line per row, box / mask AP mean +- std per (condition, multiplier), WS of its start."""
    st2 = summary["stage2"]
    cols = [(c, k) for c in CONDITIONS for k in _multiplier_labels(st2, c)]
    n_seeds = len(summary["protocol"]["seeds"])
    head = ("| row | stage-1 WS@4 (at 2x / 4x as used) | " + " | ".join(f"{c} {k} box / mask AP" for c, k in cols)
            + " |")
    lines = [head, "|" + "---|" * (len(cols) + 2)]
    for row, cells in st2.items():
        ws = summary["stage1"][ROWS[row].pretrained]["window_structure"]
        if ws is None:
            ws_txt = "n/a (no embedding)"
        else:
            kind = "abswin" if ROWS[row].convert or "ws_naive_2x" not in ws else "naive"
            ws_txt = f"{ws['ws']:.2f} ({kind}: {ws[f'ws_{kind}_2x']:.2f} / {ws[f'ws_{kind}_4x']:.2f})"
        vals = []
        for c, k in cols:
            cell = cells.get(c, {}).get(k)
            if cell is None:
                vals.append("-")
            elif len(cell["box"]) == 1:  # one seed: no spread to show
                vals.append(f"{cell['box_mean']:.1f} / {cell['mask_mean']:.1f} (1 seed)")
            else:
                n = "" if len(cell["box"]) == n_seeds else f" (n={len(cell['box'])})"
                vals.append(f"{cell['box_mean']:.1f} ± {cell['box_std']:.1f} / "
                            f"{cell['mask_mean']:.1f} ± {cell['mask_std']:.1f}{n}")
        lines.append(f"| {ROWS[row].label} | {ws_txt} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def plot_results(summary: dict, path: str) -> None:
    """Box AP (mean and per-seed points) per row, one panel per (condition, multiplier)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    st2 = summary["stage2"]
    panels = [(c, k) for c in CONDITIONS for k in _multiplier_labels(st2, c)]
    rows = list(st2)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.2), sharey=True, squeeze=False)
    used = set()
    for ax, (c, k) in zip(axes[0], panels):
        for i, row in enumerate(rows):
            cell = st2[row].get(c, {}).get(k)
            if cell is None:
                continue
            naive = ROWS[row].pretrained.startswith("abs") and ROWS[row].pretrained != "abswin" and not ROWS[row].convert
            color = "C2" if ROWS[row].convert else "C3" if naive else "C0"  # green: converted, red: naive abs
            used.add(color)
            ax.bar(i, cell["box_mean"], color=color, alpha=0.55)
            ax.errorbar(i, cell["box_mean"], yerr=cell["box_std"], color="k", capsize=3)
            ax.plot([i] * len(cell["box"]), cell["box"], "k.", ms=4)
            start = summary.get("zero_shot", {}).get(row, {}).get(c, {}).get(k)
            if start is not None:  # the same weights before finetuning
                ax.plot(i, start["box"], "x", color="C3", ms=7, mew=2,
                        label="before finetuning" if not ax.get_legend_handles_labels()[0] else None)
        grid = round(PRETRAIN_SIZE // 4 * float(k[:-1]))
        ax.set_title(f"{c}, {k} grid ({grid}x{grid} tokens)", fontsize=10)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([ROWS[r].label.split(")")[0] + ") " + r for r in rows], rotation=45, ha="right", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        if ax is axes[0][0]:  # what the colours mean, once
            from matplotlib.patches import Patch

            handles = [Patch(color=c, alpha=0.55, label=t) for c, t in (
                ("C3", "abs, naive interpolation"), ("C2", "abs -> abs-win on import"),
                ("C0", "pretrained with its encoding")) if c in used]
            handles += [h for h in ax.get_legend_handles_labels()[0] if h.get_label() == "before finetuning"]
            ax.legend(handles=handles, fontsize=7, loc="lower right")
        elif ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="lower right")
    axes[0][0].set_ylabel("box AP (pycocotools), mean ± std over seeds")
    title = (f"Finetuning a 64 px-pretrained HieraDet Mask R-CNN at a larger token grid "
             f"({summary['protocol']['finetune_iters']} iterations each)")
    fig.suptitle(textwrap.fill(title, width=max(36, int(8.5 * 4.2 * len(panels)))), fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
