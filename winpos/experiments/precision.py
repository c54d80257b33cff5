"""Mixed precision at CPU scale: does training or evaluating the shipped detector in bf16 or fp16 autocast cost box
AP against float32?

The study (declared in docs/precision.md before its runs) starts from the stage-1 checkpoint shipped with winpos
(the demo's HieraDet Mask R-CNN, trained at 64 px in float32) and asks two questions:

- **Inference**: the same weights evaluated in float32, bf16 autocast and fp16 autocast, at the detector's training
  size (64 px) and at ``multiplier`` times its grid (the demo's cell). Deterministic: one evaluation each, on the
  same images, so a difference is the precision's own.
- **Training**: the detector finetuned at ``multiplier`` for ``iters`` iterations in each precision (fp16 with a
  GradScaler, as detectron2's ``AMPTrainer``; bf16 without) with the same seeds, so the same data order and head
  initialisation, and evaluated in float32. Per seed, the difference to float32; over seeds, the mean with its 95%
  t-interval, the exact sign-flip p and two one-sided tests (TOST) of equivalence within +-``MARGIN`` box AP.
  Finetuning rounds differently in each precision and training turns rounding into seed-sized noise, so this is a
  statement about that noise, not about one run.

Every run is a subprocess with one fixed torch thread (``winpos.experiments.runs``), identified by what made it, so
the same command continues from the finished runs. Nothing here needs a GPU; on CPU fp16 has no native matmul and
is several times slower than float32, bf16 faster where the CPU has bf16 instructions.
"""
from __future__ import annotations

import time
from pathlib import Path

from winpos.errors import WinposError
from winpos.experiments.stats import format_ci
from winpos.experiments import runs as R
from winpos.experiments.protocol import Protocol, label, stage2_spec, zero_shot_spec

PRECISIONS = ("fp32", "bf16", "fp16")  # fp32 first: the baseline of every difference
MARGIN = 1.0  # box AP: the declared equivalence margin of the training contrasts (docs/precision.md)
ROW = "naive"  # the shipped weights as they are (no conversion): the precision is the only change
VERDICTS = {"equivalent": "equivalent within +-{m:g} box AP (TOST, Holm over the contrasts)",
            "different": "different from float32 (t-test, Holm over the contrasts)",
            "undecided": "undecided: neither shown different nor equivalent within +-{m:g} box AP"}


def _check_precisions(precisions) -> tuple:
    precisions = tuple(precisions)
    bad = [p for p in precisions if p not in PRECISIONS]
    if bad:
        raise WinposError(f"unknown precision(s) {bad}; choose from {', '.join(PRECISIONS)}")
    if not precisions or precisions[0] != "fp32" or len(set(precisions)) != len(precisions):
        raise WinposError(f"precisions {list(precisions)} must start with fp32 (the baseline) and list each once, "
                          "e.g. fp32,bf16,fp16")
    return precisions


def _with_precision(spec: dict, precision: str, amp_eval: bool) -> dict:
    """``spec`` run in ``precision``: float32 specs stay as they are (same identity as any float32 run)."""
    if precision == "fp32":
        return spec
    return dict(spec, amp=precision, amp_eval=amp_eval)


def precision_specs(p: Protocol, checkpoint: str, precisions=PRECISIONS) -> tuple[list, list]:
    """The inference specs (every precision at 1x and at ``p.multipliers[0]``, evaluated in that precision) and
    the training specs (every precision x seed at ``p.multipliers[0]``, evaluated in float32)."""
    precisions = _check_precisions(precisions)
    (k,), (condition,) = p.multipliers, p.conditions
    zero, fine = [], []
    for prec in precisions:
        for m in (1, k):
            s = dict(zero_shot_spec(p, ROW, m, condition), init=checkpoint)
            s.update(name=f"infer/{prec}/{label(m)}", out=str(Path(p.output_dir) / "infer" / prec / label(m)))
            zero.append(_with_precision(s, prec, amp_eval=True))
        for seed in p.seeds:
            s = dict(stage2_spec(p, ROW, k, condition, seed), init=checkpoint)
            s.update(name=f"train/{prec}/seed{seed}", out=str(Path(p.output_dir) / "train" / prec / f"seed{seed}"))
            fine.append(_with_precision(s, prec, amp_eval=False))
    return zero, fine


def _precision_of(spec: dict) -> str:
    return spec.get("amp") or "fp32"


def analyze(zero_runs: list, fine_runs: list, margin: float = MARGIN) -> dict:
    """The inference table (AP per precision and size, difference to float32) and, per training contrast
    (precision - fp32, paired by seed), the t-test, the exact sign-flip p, TOST within +-``margin`` and the
    verdict, with Holm's adjustment over the contrasts (t-tests and TOSTs apart)."""
    from winpos.experiments.stats import holm, tost, t_test

    infer: dict = {}
    for run in zero_runs:
        spec = run["spec"]
        infer.setdefault(label(spec["size"] / 64), {})[_precision_of(spec)] = {
            kind: run[kind]["AP"] for kind in ("bbox", "segm")}
    per: dict = {}
    for run in fine_runs:
        spec = run["spec"]
        per.setdefault(_precision_of(spec), {})[spec["seed"]] = {kind: run[kind]["AP"] for kind in ("bbox", "segm")}
    if "fp32" not in per:
        raise WinposError("the training runs hold no float32 baseline")
    contrasts = {}
    for prec, runs in per.items():
        if prec == "fp32":
            continue
        seeds = sorted(set(runs) & set(per["fp32"]))
        c = {"seeds": seeds}
        for kind in ("bbox", "segm"):
            diffs = [runs[s][kind] - per["fp32"][s][kind] for s in seeds]
            c[kind] = t_test(diffs)
            if kind == "bbox":
                c["tost"] = tost(diffs, margin)
        contrasts[prec] = c
    p_t = holm({prec: c["bbox"]["p_t"] for prec, c in contrasts.items()})
    p_tost = holm({prec: c["tost"]["p"] for prec, c in contrasts.items()})
    for prec, c in contrasts.items():
        c["p_t_holm"], c["p_tost_holm"] = p_t[prec], p_tost[prec]
        if c["p_tost_holm"] is not None and c["p_tost_holm"] < 0.05:
            c["verdict"] = "equivalent"
        elif c["p_t_holm"] is not None and c["p_t_holm"] < 0.05:
            c["verdict"] = "different"
        else:
            c["verdict"] = "undecided"
    return {"margin": margin, "inference": infer, "training": per, "contrasts": contrasts}


def _seconds(runs: list) -> dict:
    out: dict = {}
    for run in runs:
        out.setdefault(_precision_of(run["spec"]), []).append(run["seconds"])
    return {prec: sum(v) / len(v) for prec, v in out.items()}


def run_precision(config: str, checkpoint: str, manifest: str, output_dir="output/precision", multiplier=1.25,
                  condition: str = "canvas", iters: int = 150, seeds=(0, 1, 2, 3, 4), precisions=PRECISIONS,
                  workers: int = 1, threads: int = 1, lr: float = 2e-4, log=print) -> dict:
    """Run the study (see the module docstring) or continue it; returns the summary (also
    ``<output_dir>/summary.json``)."""
    from winpos.experiments.demo import check_stage1
    from winpos.experiments.reproduce import claim_folder
    from winpos.utils.outputs import atomic_write_json

    precisions = _check_precisions(precisions)
    p = Protocol(config=config, output_dir=str(output_dir), rows=(ROW,), multipliers=(multiplier,),
                 conditions=(condition,), seeds=tuple(seeds), finetune_iters=iters, finetune_lr=float(lr),
                 workers=workers, threads=threads)
    p.validate()
    check_stage1(checkpoint, manifest)
    out = claim_folder(p)
    zero, fine = precision_specs(p, checkpoint, precisions)
    for spec in zero + fine:
        R.finished(spec)  # a folder of another run is refused before any work
    t0 = time.time()
    log(f"inference: the shipped detector in {', '.join(precisions)} at 1x and {label(multiplier)} its grid")
    zero_runs = R.run_pool(zero, workers, log)
    log(f"training: {len(fine)} runs of {iters} iterations at {label(multiplier)} ({len(seeds)} seeds x "
        f"{len(precisions)} precisions), evaluated in float32, {workers} at a time")
    fine_runs = R.run_pool(fine, workers, log)
    summary = analyze(zero_runs, fine_runs)
    summary.update(protocol={"checkpoint": Path(checkpoint).name, "multiplier": multiplier, "condition": condition,
                             "iters": iters, "lr": lr, "seeds": list(seeds), "precisions": list(precisions),
                             "threads": threads},
                   train_seconds=_seconds(fine_runs), minutes=(time.time() - t0) / 60,
                   started_utc=min(r["started_utc"] for r in zero_runs + fine_runs))
    atomic_write_json(out / "summary.json", summary)
    plot_precision(summary, str(out / "precision.png"))
    return summary


def format_precision(summary: dict) -> str:
    """The study as text: the inference table, the training table and one verdict line per contrast."""
    m = summary["margin"]
    lines = ["inference (the shipped weights, one evaluation each; box / mask AP, difference to fp32):"]
    for size, row in summary["inference"].items():
        base = row.get("fp32")
        cells = []
        for prec, ap in row.items():
            cell = f"{prec} {ap['bbox']:.2f} / {ap['segm']:.2f}"
            if base is not None and prec != "fp32":
                cell += f" ({ap['bbox'] - base['bbox']:+.2f} / {ap['segm'] - base['segm']:+.2f})"
            cells.append(cell)
        lines.append(f"  {size:>6}: " + " | ".join(cells))
    proto = summary.get("protocol", {})
    lines.append(f"training ({proto.get('iters', '?')} iterations at {label(proto.get('multiplier', 0))}, "
                 f"evaluated in fp32; box AP per seed):")
    for prec, runs in summary["training"].items():
        per = ", ".join(f"{runs[s]['bbox']:.2f}" for s in sorted(runs, key=int))
        secs = summary.get("train_seconds", {}).get(prec)
        lines.append(f"  {prec}: {per}" + (f"  ({secs / 60:.1f} min a run)" if secs else ""))
    for prec, c in summary["contrasts"].items():
        b, t = c["bbox"], c["tost"]
        if b["ci"] is None:
            lines.append(f"{prec} - fp32: n={b['n']}, too few seeds for a test")
            continue
        per = ", ".join(f"{d:+.2f}" for d in b["diffs"])
        lines.append(f"{prec} - fp32, box AP: per seed {per}; {format_ci(b)} 95% CI, t p={b['p_t']:.3f} (Holm "
                     f"{c['p_t_holm']:.3f}), sign-flip p={b['p_sign_flip']:.3f}; TOST +-{m:g}: p={t['p_lower']:.3f} / "
                     f"{t['p_upper']:.3f} (Holm {c['p_tost_holm']:.3f}); mask AP {format_ci(c['segm'])}")
        lines.append(f"  -> {prec}: {VERDICTS[c['verdict']].format(m=m)}")
    return "\n".join(lines)


def plot_precision(summary: dict, path: str) -> None:
    """Left: inference box AP per precision at each size. Right: finetuned box AP per seed and precision, seeds
    joined across precisions, with the mean difference to fp32 and its interval in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from winpos.utils.outputs import atomic_savefig

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    sizes = list(summary["inference"])
    precs = [p for p in PRECISIONS if any(p in summary["inference"][s] for s in sizes)]
    width = 0.8 / max(len(precs), 1)
    for i, prec in enumerate(precs):
        vals = [summary["inference"][s].get(prec, {}).get("bbox", float("nan")) for s in sizes]
        bars = a.bar([j + i * width for j in range(len(sizes))], vals, width, label=prec)
        a.bar_label(bars, fmt="%.1f", fontsize=7)
    a.set_xticks([j + width * (len(precs) - 1) / 2 for j in range(len(sizes))],
                 [f"{s} grid" for s in sizes])
    low = min(v["bbox"] for s in sizes for v in summary["inference"][s].values())
    a.set_ylim(max(0.0, low - 5), None)
    a.set_ylabel("box AP")
    a.set_title("inference: same weights, one evaluation each")
    a.legend(fontsize=8)
    train = summary["training"]
    order = [p for p in PRECISIONS if p in train]
    seeds = sorted({s for runs in train.values() for s in runs}, key=int)
    for s in seeds:
        xs = [i for i, p in enumerate(order) if s in train[p]]
        b.plot(xs, [train[order[i]][s]["bbox"] for i in xs], "-o", color="0.6", lw=0.8, ms=4)
    for i, prec in enumerate(order):
        vals = [train[prec][s]["bbox"] for s in train[prec]]
        c = summary["contrasts"].get(prec)
        text = "" if c is None or c["bbox"]["ci"] is None else f"{format_ci(c['bbox'])}\nvs fp32: {c['verdict']}"
        b.errorbar([i + 0.12], [sum(vals) / len(vals)], fmt="D", color="C3", ms=6)
        b.annotate(text, (i + 0.2, sum(vals) / len(vals)), fontsize=7, va="center")
    b.set_xticks(range(len(order)), order)
    b.set_xlim(-0.3, len(order) + 0.2)
    b.set_ylabel("box AP (evaluated in fp32)")
    proto = summary.get("protocol", {})
    b.set_title(f"finetuned {proto.get('iters', '?')} it at {label(proto.get('multiplier', 0))}: "
                "one line per seed, red = mean", fontsize=9)
    fig.suptitle(f"mixed precision, shipped shapes detector (CPU); equivalence margin \u00b1{summary['margin']:g} box AP",
                 fontsize=10)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=120)
    plt.close(fig)


def load_summary(output_dir) -> dict:
    """The study's ``summary.json``, or one line saying how to make it."""
    from winpos.experiments.reproduce import load_summary as load

    return load(output_dir, "--precision")
