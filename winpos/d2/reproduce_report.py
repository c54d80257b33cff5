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
        cell = table.setdefault(row, {}).setdefault(cond, {}).setdefault(k, {"box": [], "mask": []})
        cell["box"].append(out["bbox"]["AP"])
        cell["mask"].append(out["segm"]["AP"])
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
    for ax, (c, k) in zip(axes[0], panels):
        for i, row in enumerate(rows):
            cell = st2[row].get(c, {}).get(k)
            if cell is None:
                continue
            naive = ROWS[row].pretrained.startswith("abs") and ROWS[row].pretrained != "abswin" and not ROWS[row].convert
            color = "C2" if ROWS[row].convert else "C3" if naive else "C0"  # green: converted, red: naive abs
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
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="lower right")
    axes[0][0].set_ylabel("box AP (pycocotools), mean ± std over seeds")
    title = (f"Finetuning a 64 px-pretrained HieraDet Mask R-CNN at a larger token grid "
             f"({summary['protocol']['finetune_iters']} iterations each)")
    fig.suptitle(textwrap.fill(title, width=max(36, int(8.5 * 4.2 * len(panels)))), fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
