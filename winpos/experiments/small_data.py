"""Small data at CPU scale: with a few dozen labelled images of a new task, which part of a pretrained windowed
detector should one finetune?

The study (declared in docs/small_data.md before its runs) starts from the detector shipped with winpos (the demo's
HieraDet Mask R-CNN, trained at 64 px on the one-class shapes data: it finds and segments shapes, but has never
been told circles from stars) and teaches it the **four-class** shapes task from ``n`` training images. The class
layers of its box and mask predictors have another shape there and start from their initialisation (detectron2's
loader skips them); everything else loads. The recipes differ only in what trains (``train.freeze``,
``winpos.d2.freeze``):

- ``full``: every parameter;
- ``trunk``: the HieraDet trunk frozen; the pyramid, the RPN and the RoI heads train;
- ``heads``: trunk, pyramid and RPN frozen; only the RoI heads train.

Each (recipe, ``n``, seed) run trains the same number of iterations at the same learning rate. The seed draws the
training images (the shapes generator's seed ``TRAIN_SEED + seed``; the ``n`` = 16 set is the first 16 images of
the ``n`` = 128 one) and the data order; every run is evaluated on one held-out set of ``VAL_IMAGES`` images drawn
from their own seed (``VAL_SEED``), so a difference between recipes at one seed is the recipe's. Per ``n`` and
recipe, ``trunk`` - ``full`` and ``heads`` - ``full`` paired by seed: mean with its 95% t-interval, t-test, the
exact sign-flip p, Holm over the four contrasts; a contrast is "better" or "worse" when its Holm-adjusted t p is
below 0.05, else "undecided".

Every run is a subprocess with one fixed torch thread (``winpos.experiments.runs``), identified by what made it,
so the same command continues from the finished runs; nothing keeps the finetuned weights.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

from winpos.d2.freeze import FREEZE_PRESETS
from winpos.errors import WinposError
from winpos.experiments.stats import format_ci
from winpos.experiments import runs as R
from winpos.experiments.protocol import PRETRAIN_SIZE

RECIPES = ("full", "trunk", "heads")  # full first: the baseline of every contrast
FREEZE = {"full": FREEZE_PRESETS["none"], "trunk": FREEZE_PRESETS["trunk"], "heads": FREEZE_PRESETS["heads"]}
TRAIN_IMAGES = (16, 128)
SEEDS = (0, 1, 2, 3)
ITERS, LR, WARMUP = 300, 2e-4, 20
TRAIN_SEED, VAL_SEED, VAL_IMAGES = 1000, 999, 300
VERDICTS = {"better": "better than full finetuning (t-test, Holm over the four contrasts)",
            "worse": "worse than full finetuning (t-test, Holm over the four contrasts)",
            "undecided": "undecided: not shown different from full finetuning"}


def _check(recipes, train_images, seeds) -> tuple:
    recipes, train_images, seeds = tuple(recipes), tuple(int(n) for n in train_images), tuple(int(s) for s in seeds)
    bad = [r for r in recipes if r not in RECIPES]
    if bad:
        raise WinposError(f"unknown recipe(s) {bad}; choose from {', '.join(RECIPES)}")
    if not recipes or recipes[0] != "full" or len(set(recipes)) != len(recipes):
        raise WinposError(f"recipes {list(recipes)} must start with full (the baseline) and list each once, "
                          "e.g. full,trunk,heads")
    if not train_images or min(train_images) < 1 or len(set(train_images)) != len(train_images):
        raise WinposError(f"training-set sizes {list(train_images)} must be distinct positive counts, e.g. 16,128")
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise WinposError(f"seeds {list(seeds)} must be distinct non-negative integers, e.g. 0,1,2,3")
    return recipes, train_images, seeds


def shapes_params(n: int, seed: int) -> dict:
    """The shapes-generator parameters of a run: ``n`` four-class 64 px training images drawn from the seed's
    stream, and the shared held-out evaluation set."""
    return dict(image_size=PRETRAIN_SIZE, train_images=n, val_images=VAL_IMAGES, min_objects=1, max_objects=6,
                seed=TRAIN_SEED + seed, val_seed=VAL_SEED)


def small_data_specs(config: str, checkpoint: str, output_dir, recipes=RECIPES, train_images=TRAIN_IMAGES,
                     seeds=SEEDS, iters: int = ITERS, lr: float = LR, threads: int = 1) -> list[dict]:
    """One detection spec per (``n``, seed, recipe), in that order (the recipes of one seed side by side)."""
    recipes, train_images, seeds = _check(recipes, train_images, seeds)
    out = []
    for n in train_images:
        for seed in seeds:
            for recipe in recipes:
                spec = dict(name=f"{recipe}/n{n}/seed{seed}", kind="detect", config=config, encoding="abs_learned",
                            size=PRETRAIN_SIZE, shapes=shapes_params(n, seed), classes="shapes", iters=iters,
                            seed=seed, lr=float(lr), init=checkpoint, warmup=WARMUP, threads=threads,
                            keep_weights=False, out=str(Path(output_dir) / recipe / f"n{n}" / f"seed{seed}"))
                if FREEZE[recipe]:
                    spec["freeze"] = list(FREEZE[recipe])
                out.append(spec)
    return out


def _recipe_of(spec: dict) -> str:
    held = tuple(spec.get("freeze") or ())
    for recipe, prefixes in FREEZE.items():
        if held == prefixes:
            return recipe
    raise WinposError(f"run {spec.get('name')} freezes {list(held)}, which is no recipe of the study")


def analyze(runs: list) -> dict:
    """Per ``n``: each recipe's AP per seed with its mean and 95% interval, and each recipe - full (paired by seed)
    with the t-test, the exact sign-flip p and the verdict, Holm's adjustment over every contrast."""
    from winpos.experiments.stats import holm, mean_interval, t_test

    table: dict = {}
    for run in runs:
        spec = run["spec"]
        n = str(spec["shapes"]["train_images"])
        table.setdefault(n, {}).setdefault(_recipe_of(spec), {})[str(spec["seed"])] = {
            kind: run[kind]["AP"] for kind in ("bbox", "segm")}
    summary: dict = {"ap": {}, "contrasts": {}}
    for n, per in table.items():
        summary["ap"][n] = {recipe: {"per_seed": seeds, "bbox": mean_interval([v["bbox"] for v in seeds.values()]),
                                     "segm": mean_interval([v["segm"] for v in seeds.values()])}
                            for recipe, seeds in per.items()}
        base = per.get("full")
        if base is None:
            raise WinposError(f"the runs at n={n} hold no full-finetuning baseline")
        for recipe, seeds in per.items():
            if recipe == "full":
                continue
            common = sorted(set(seeds) & set(base), key=int)
            c = {"n_images": int(n), "recipe": recipe, "seeds": common}
            for kind in ("bbox", "segm"):
                c[kind] = t_test([seeds[s][kind] - base[s][kind] for s in common])
            summary["contrasts"][f"{recipe}-full@{n}"] = c
    adjusted = holm({name: c["bbox"]["p_t"] for name, c in summary["contrasts"].items()})
    for name, c in summary["contrasts"].items():
        c["p_t_holm"] = adjusted[name]
        if c["p_t_holm"] is not None and c["p_t_holm"] < 0.05:
            c["verdict"] = "better" if c["bbox"]["mean"] > 0 else "worse"
        else:
            c["verdict"] = "undecided"
    return summary


def _claim(output_dir, settings: dict) -> Path:
    """``output_dir`` for these settings: created with its ``study.json``, or accepted when it holds the same."""
    from winpos.experiments.reproduce import claim_settings_folder

    return claim_settings_folder(output_dir, settings, "study.json", "a small-data study")


def run_small_data(config: str, checkpoint: str, manifest: str, output_dir="output/small_data", recipes=RECIPES,
                   train_images=TRAIN_IMAGES, seeds=SEEDS, iters: int = ITERS, lr: float = LR, workers: int = 1,
                   threads: int = 1, log=print) -> dict:
    """Run the study (see the module docstring) or continue it; returns the summary (also
    ``<output_dir>/summary.json`` and ``<output_dir>/small_data.png``)."""
    from winpos.experiments.demo import check_stage1
    from winpos.utils.outputs import atomic_write_json

    recipes, train_images, seeds = _check(recipes, train_images, seeds)
    check_stage1(checkpoint, manifest)
    settings = {"recipes": list(recipes), "train_images": list(train_images), "seeds": list(seeds), "iters": iters,
                "lr": float(lr), "threads": threads, "val_images": VAL_IMAGES, "val_seed": VAL_SEED,
                "train_seed": TRAIN_SEED, "checkpoint": Path(checkpoint).name}
    out = _claim(output_dir, settings)
    specs = small_data_specs(config, checkpoint, out, recipes, train_images, seeds, iters, lr, threads)
    for spec in specs:
        R.finished(spec)  # a folder of another run is refused before any work
    t0 = time.time()
    log(f"{len(specs)} runs of {iters} iterations: recipes {', '.join(recipes)} x {len(train_images)} training-set "
        f"sizes ({', '.join(map(str, train_images))} images) x {len(seeds)} seeds, {workers} at a time")
    done = R.run_pool(specs, workers, log)
    summary = analyze(done)
    seconds: dict = {}
    for run in done:
        seconds.setdefault(_recipe_of(run["spec"]), []).append(run["seconds"])
    summary.update(protocol=settings, seconds={r: statistics.fmean(v) for r, v in seconds.items()},
                   minutes=(time.time() - t0) / 60, started_utc=min(r["started_utc"] for r in done),
                   runs_minutes=sum(r["seconds"] for r in done) / 60)
    atomic_write_json(out / "summary.json", summary)
    plot_small_data(summary, str(out / "small_data.png"))
    return summary


def format_small_data(summary: dict) -> str:
    """The study as text: box / mask AP per recipe and training-set size, then one line per contrast."""
    proto = summary.get("protocol", {})
    lines = [f"four-class shapes from the shipped one-class detector, {proto.get('iters', '?')} iterations, "
             f"evaluated on {proto.get('val_images', '?')} held-out images; box AP per seed, mean [95% CI], mask AP:"]
    for n, per in summary["ap"].items():
        for recipe, row in per.items():
            seeds = ", ".join(f"{row['per_seed'][s]['bbox']:.2f}" for s in sorted(row["per_seed"], key=int))
            b, m = row["bbox"], row["segm"]
            ci = "" if b["ci"] is None else f" [{b['ci'][0]:.2f}, {b['ci'][1]:.2f}]"
            secs = summary.get("seconds", {}).get(recipe)
            lines.append(f"  n={n:>4} {recipe:<6}: {seeds}; mean {b['mean']:.2f}{ci}; mask {m['mean']:.2f}"
                         + (f"  ({secs / 60:.1f} min a run)" if secs else ""))
    for name, c in summary["contrasts"].items():
        b = c["bbox"]
        if b["ci"] is None:
            lines.append(f"{name}: n={b['n']}, too few seeds for a test")
            continue
        per = ", ".join(f"{d:+.2f}" for d in b["diffs"])
        lines.append(f"{c['recipe']} - full at n={c['n_images']}, box AP: per seed {per}; {format_ci(b)} 95% CI, t p="
                     f"{b['p_t']:.4f} (Holm {c['p_t_holm']:.4f}), sign-flip p={b['p_sign_flip']:.3f}; mask AP "
                     f"{format_ci(c['segm'])}")
        lines.append(f"  -> {c['recipe']} at n={c['n_images']}: {VERDICTS[c['verdict']]}")
    return "\n".join(lines)


def plot_small_data(summary: dict, path: str) -> None:
    """Left: box AP against the number of training images, one marker per run, a line through each recipe's
    means. Right: each recipe - full with its 95% interval and verdict, per training-set size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from winpos.utils.outputs import atomic_savefig

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    sizes = sorted(summary["ap"], key=int)
    recipes = [r for r in RECIPES if any(r in summary["ap"][n] for n in sizes)]
    for i, recipe in enumerate(recipes):
        xs, means = [], []
        for n in sizes:
            row = summary["ap"][n].get(recipe)
            if row is None:
                continue
            x = int(n) * (1 + 0.06 * (i - 1))  # a little apart, on the log axis
            vals = [v["bbox"] for v in row["per_seed"].values()]
            a.plot([x] * len(vals), vals, "o", color=f"C{i}", ms=4, alpha=0.6)
            xs.append(x)
            means.append(row["bbox"]["mean"])
        a.plot(xs, means, "-D", color=f"C{i}", label=f"{recipe} (mean)", ms=6)
    a.set_xscale("log")
    a.set_xticks([int(n) for n in sizes], [f"{n} images" for n in sizes])
    a.minorticks_off()
    a.set_ylabel("box AP, 4 classes (held-out set)")
    a.set_title("finetuned from the one-class detector: one dot per seed", fontsize=9)
    a.legend(fontsize=8)
    names = list(summary["contrasts"])
    for j, name in enumerate(names):
        c = summary["contrasts"][name]
        res = c["bbox"]
        color = f"C{recipes.index(c['recipe'])}" if c["recipe"] in recipes else "k"
        if res["ci"] is not None:
            lo, hi = res["ci"]
            b.errorbar([res["mean"]], [j], xerr=[[res["mean"] - lo], [hi - res["mean"]]], fmt="D", color=color,
                       capsize=4)
        b.plot(res["diffs"], [j] * len(res["diffs"]), "o", color=color, alpha=0.5, ms=4)
        b.annotate(f"{c['verdict']} (Holm p={c['p_t_holm']:.3g})" if c["p_t_holm"] is not None else "no test",
                   (1.02, j), xycoords=("axes fraction", "data"), fontsize=7, va="center")
    b.axvline(0, color="0.5", lw=0.8)
    b.set_yticks(range(len(names)), [f"{summary['contrasts'][k]['recipe']} - full, n={summary['contrasts'][k]['n_images']}"
                                     for k in names], fontsize=8)
    b.set_ylim(-0.6, len(names) - 0.4)
    b.set_xlabel("box AP difference to full finetuning (dots: seeds; bar: 95% CI)")
    b.set_title("what freezing costs or gains, paired by seed", fontsize=9)
    proto = summary.get("protocol", {})
    fig.suptitle(f"small data: four-class shapes from the shipped one-class HieraDet detector, "
                 f"{proto.get('iters', '?')} iterations each (CPU)", fontsize=10)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=120)
    plt.close(fig)


def load_summary(output_dir) -> dict:
    """The study's ``summary.json``, or one line saying how to make it."""
    from winpos.experiments.reproduce import load_summary as load

    return load(output_dir, "--small-data")
