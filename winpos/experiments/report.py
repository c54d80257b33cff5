"""Summary, tables and plot of the reproduction: per (row, condition, multiplier) the box / mask AP per seed, the
zero-shot AP, and the paired comparisons of ``PAIRS`` (``winpos.experiments.stats``) with how many were tested."""
from __future__ import annotations

import textwrap

from winpos.experiments.protocol import CONDITIONS, PAIRS, PRETRAIN_SIZE, ROWS, label
from winpos.experiments.stats import describe, paired


def summarize(protocol: dict, stage0: dict | None, stage1: dict, runs: list[dict]) -> dict:
    """``runs``: the results of the stage-2 runs (finetuned, with a seed) and of the zero-shot evaluations."""
    table, zero_shot = {}, {}
    for out in runs:
        s = out["spec"]
        row, cond = s["name"].split("/")[:2]
        k = label(s["size"] / PRETRAIN_SIZE)
        if s["iters"] == 0:
            zero_shot.setdefault(row, {}).setdefault(cond, {})[k] = {"box": out["bbox"]["AP"], "mask": out["segm"]["AP"]}
            continue
        cell = table.setdefault(row, {}).setdefault(cond, {}).setdefault(k, {"box": {}, "mask": {}})
        cell["box"][str(s["seed"])] = out["bbox"]["AP"]
        cell["mask"][str(s["seed"])] = out["segm"]["AP"]
    finetuned = [out for out in runs if out["spec"]["iters"] > 0]
    summary = {"protocol": protocol, "stage0": stage0, "stage1": stage1, "stage2": table, "zero_shot": zero_shot,
               # runs made since do_train seeds the global RNGs repeat bit for bit; the others are one draw each
               "finetuned_rng_seeded": {"seeded": sum(bool(out.get("global_rng_seeded")) for out in finetuned),
                                        "runs": len(finetuned)}}
    summary["pairs"] = compare_pairs(summary)
    return summary


def _keys(d: dict) -> list[str]:
    return sorted(d, key=lambda k: float(k[:-1]))


def compare_pairs(summary: dict) -> list[dict]:
    """Every pair of ``PAIRS`` in every (condition, multiplier) where both rows ran: the zero-shot difference (one
    evaluation each: no interval) and the finetuned paired difference per seed (box and mask AP)."""
    st2, zs = summary["stage2"], summary["zero_shot"]
    pairs = []
    for treat, base in PAIRS:
        for c in CONDITIONS:
            ks = set(st2.get(treat, {}).get(c, {})) | set(zs.get(treat, {}).get(c, {}))
            for k in _keys({k: 0 for k in ks}):
                za, zb = zs.get(base, {}).get(c, {}).get(k), zs.get(treat, {}).get(c, {}).get(k)
                a, b = st2.get(base, {}).get(c, {}).get(k), st2.get(treat, {}).get(c, {}).get(k)
                if (za is None or zb is None) and (a is None or b is None):
                    continue
                entry = {"treatment": treat, "baseline": base, "condition": c, "multiplier": k,
                         "zero_shot_box": None if za is None or zb is None else zb["box"] - za["box"],
                         "zero_shot_mask": None if za is None or zb is None else zb["mask"] - za["mask"]}
                if a is not None and b is not None:
                    entry["box"] = paired(b["box"], a["box"])
                    entry["mask"] = paired(b["mask"], a["mask"])
                pairs.append(entry)
    return pairs


def _short(row: str) -> str:
    return ROWS[row].label.split(")")[0] + ")"


def format_pairs(summary: dict) -> str:
    """Markdown: each paired comparison, its zero-shot difference and its finetuned paired 95% interval."""
    pairs = summary["pairs"]
    tested = [e for e in pairs if e.get("box", {}).get("ci") is not None]
    lines = ["| pair | condition, grid | zero-shot box / mask | finetuned box AP: mean [95% CI] p (n) | "
             "finetuned mask AP |", "|---|---|---|---|---|"]
    for e in pairs:
        zero = "-" if e["zero_shot_box"] is None else f"{e['zero_shot_box']:+.1f} / {e['zero_shot_mask']:+.1f}"
        box = describe(e["box"]) if "box" in e else "-"
        mask = describe(e["mask"]) if "mask" in e else "-"
        lines.append(f"| {_short(e['treatment'])} - {_short(e['baseline'])} | {e['condition']} {e['multiplier']} | "
                     f"{zero} | {box} | {mask} |")
    lines.append(f"\n{len(tested)} finetuned pair tests (box AP), each at the 95% level with no correction for "
                 f"multiplicity: about {0.05 * len(tested):.1f} would exclude 0 by chance alone if no effect existed "
                 f"(Bonferroni: p < {0.05 / max(len(tested), 1):.4f} for a family-wise 5%).")
    return "\n".join(lines)


def format_zero_shot(summary: dict) -> str:
    """Markdown: box / mask AP of every stage-2 start at its new size without finetuning."""
    zs = summary["zero_shot"]
    cols = [(c, k) for c in CONDITIONS for k in _keys({k: 0 for r in zs.values() for k in r.get(c, {})})]
    lines = ["| row | " + " | ".join(f"{c} {k}" for c, k in cols) + " |", "|" + "---|" * (len(cols) + 1)]
    for row in ROWS:
        if row not in zs:
            continue
        vals = ["-" if zs[row].get(c, {}).get(k) is None else
                f"{zs[row][c][k]['box']:.1f} / {zs[row][c][k]['mask']:.1f}" for c, k in cols]
        lines.append(f"| {ROWS[row].label} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def format_table(summary: dict) -> str:
    """Markdown: finetuned box / mask AP, mean over seeds (n), per row and (condition, multiplier)."""
    st2 = summary["stage2"]
    cols = [(c, k) for c in CONDITIONS for k in _keys({k: 0 for r in st2.values() for k in r.get(c, {})})]
    lines = ["| row | " + " | ".join(f"{c} {k} box / mask (n)" for c, k in cols) + " |", "|" + "---|" * (len(cols) + 1)]
    for row in ROWS:
        if row not in st2:
            continue
        vals = []
        for c, k in cols:
            cell = st2[row].get(c, {}).get(k)
            if cell is None:
                vals.append("-")
                continue
            box, mask = list(cell["box"].values()), list(cell["mask"].values())
            vals.append(f"{sum(box) / len(box):.1f} / {sum(mask) / len(mask):.1f} ({len(box)})")
        lines.append(f"| {ROWS[row].label} | " + " | ".join(vals) + " |")
    seeded = summary.get("finetuned_rng_seeded")
    if seeded and seeded["runs"]:
        others = seeded["runs"] - seeded["seeded"]
        line = (f"\n{seeded['seeded']} of {seeded['runs']} finetuned runs were made with the global RNGs seeded from "
                "the run's seed (they repeat bit for bit)")
        if others:
            line += f"; the other {others} drew their proposal sampling from an unseeded stream (one random draw each)"
        lines.append(line + ".")
    return "\n".join(lines)


def format_stage0(stage0: dict) -> str:
    """WS@window across stage-0 training and the reliance losses, in a few lines."""
    hist = stage0["history"]
    steps = hist if len(hist) <= 6 else [hist[i * (len(hist) - 1) // 5] for i in range(6)]
    ws = ", ".join(f"{h['iter']}: {h['ws']:.2f}" for h in steps)
    r = stage0["reliance"]
    return (f"stage 0 WS@4 by iteration: {ws}\n"
            f"held-out loss: learned {r['learned']:.3f}, zeroed {r['zeroed']:.3f}, rolled 1 token "
            f"{r['rolled_1_token']:.3f}, rolled 1 window {r['rolled_1_window']:.3f}")


def format_stage0_variants(main: dict, variants: dict) -> str:
    """One line per stage-0 run: its setting, WS@4 at the end and the reliance losses (the main run first)."""
    lines = ["| stage 0 | mask ratio | loss on | global blocks | final WS@4 | held-out loss: learned / zeroed / "
             "rolled 1 token / rolled 1 window |", "|---|---|---|---|---|---|"]
    for name, res in [("main", main), *variants.items()]:
        if res is None:
            lines.append(f"| {name} | not run | | | | |")
            continue
        s, r = res["spec"], res["reliance"]
        lines.append(f"| {name} | {s['mask_ratio']:g} | {s.get('loss_on', 'all')} | "
                     f"{'yes' if s.get('global_blocks', True) else 'no'} | {res['history'][-1]['ws']:.2f} | "
                     f"{r['learned']:.3f} / {r['zeroed']:.3f} / {r['rolled_1_token']:.3f} / "
                     f"{r['rolled_1_window']:.3f} |")
    return "\n".join(lines)


_STYLE = {"naive": ("C3", "o", "-"), "abs2win": ("C2", "s", "-"), "control": ("C0", "v", "--"),
          "recursive": ("C1", "D", ":"), "rope": ("C4", "^", "-"), "lookhere": ("C5", "P", "-"),
          "relpos": ("C6", "X", "-"), "planted": ("C7", "o", "-."), "planted2win": ("C8", "s", "-.")}


def _curve_label(row: str, stage1: dict, reference: str | None) -> str:
    """A row's legend label; a row trained from its own stage-1 detector (not the one the reference line shows) gets
    that detector's 64 px box AP, so a reader compares each row with its own start."""
    enc = ROWS[row].pretrained
    ap = (stage1.get(enc) or {}).get("box_AP_64px")
    if ap is None or enc == reference:
        return ROWS[row].label
    return f"{ROWS[row].label} (64 px: {ap:.1f})"


def plot_curve(summary: dict, path: str, condition: str = "canvas") -> None:
    """The paper's resolution curve: box AP against the grid multiplier per row, zero-shot (left) and finetuned
    (right: mean over seeds, each seed a dot). One stage-1 detector's AP at 64 px (abs_learned when present) is a
    reference line; a row trained from another detector carries that detector's 64 px AP in its legend label. Rows
    that coincide (the control equals naive before finetuning) are drawn dashed over each other."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from winpos.utils.outputs import atomic_savefig

    fig, axes = plt.subplots(1, 2, figsize=(11.5, 4.8))
    handles = {}
    stage1 = summary.get("stage1") or {}
    ref = [(e, v["box_AP_64px"]) for e, v in sorted(stage1.items(), key=lambda kv: kv[0] != "abs_learned")
           if v and v.get("box_AP_64px")]
    reference = ref[0][0] if ref else None  # the detector the dotted line shows
    for ax, (key, title) in zip(axes, (("zero_shot", "zero-shot (the 64 px weights, no finetuning)"),
                                       ("stage2", "finetuned (mean over seeds; dots: seeds)"))):
        data, drawn = summary[key], []
        present = [r for r in ROWS if r in data]
        for i, row in enumerate(present):
            cells = data[row].get(condition, {})
            ks = _keys(cells)
            if not ks:
                continue
            color, marker, style = _STYLE.get(row, ("k", "o", "-"))
            xs = [float(k[:-1]) for k in ks]
            if key == "zero_shot":
                ys = [cells[k]["box"] for k in ks]
            else:  # rows side by side around each multiplier (x 1.03 apart), so their seeds do not overlap
                xs = [x * 1.03 ** (i - (len(present) - 1) / 2) for x in xs]
                ys = [sum(cells[k]["box"].values()) / len(cells[k]["box"]) for k in ks]
                for x, k in zip(xs, ks):
                    ax.plot([x] * len(cells[k]["box"]), list(cells[k]["box"].values()), ".", color=color, ms=3)
            label = _curve_label(row, stage1, reference)
            (line,) = ax.plot(xs, ys, style, marker=marker, color=color, ms=5, mfc="none", label=label)
            handles.setdefault(label, line)
            drawn += xs
        if ref and drawn:
            enc, value = ref[0]
            ax.axhline(value, color="0.5", lw=0.8, ls=":")
            ax.text(0.99, value, f"{enc} at 64 px (stage 1): {value:.1f}", transform=ax.get_yaxis_transform(),
                    ha="right", va="bottom", fontsize=7, color="0.35")
        if not drawn:
            ax.text(0.5, 0.5, "no finished runs" if key == "stage2" else "no zero-shot runs", ha="center",
                    va="center", transform=ax.transAxes, color="0.4")
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(title, fontsize=10)
            continue
        ax.set_xscale("log", base=2)
        ticks = sorted({float(k[:-1]) for r in present for k in data[r].get(condition, {})})
        if len(ticks) == 1:
            ax.set_xlim(ticks[0] / 1.15, ticks[0] * 1.15)
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{t:g}x" for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel(f"token grid multiplier (x the 16x16 grid of {PRETRAIN_SIZE} px)")
        ax.set_ylabel("box AP (pycocotools)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(len(handles), 3), fontsize=8,
               frameon=False)
    proto = summary["protocol"]
    n = len(proto.get("seeds", ()))
    what = ("same-size objects on a larger canvas" if condition == "canvas" else "the 64 px images upscaled")
    fine = (f"; finetuned {proto.get('finetune_iters')} iterations, {n} seeds" if summary["stage2"] else "")
    fig.suptitle(textwrap.fill(f"HieraDet Mask R-CNN trained at {PRETRAIN_SIZE} px with a learned absolute embedding,"
                               f" at larger grids ({condition}: {what}){fine}", 110), fontsize=10)
    legend_rows = -(-len(handles) // 3)
    fig.tight_layout(rect=(0, 0.03 + 0.04 * legend_rows, 1, 1))
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)
