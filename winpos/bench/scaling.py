"""``benchmark.py scaling``: forward time and peak memory against input size for each encoding, with the fitted
growth exponent (time ~ tokens^k); window-only models should give k near 1, global blocks push it towards 2."""
from __future__ import annotations

import math
from functools import partial

import torch

from winpos.bench.timing import interleaved_medians, peak_rss_mib, print_table

VARIANTS = {
    "window-only (abswin, no global blocks)": dict(recipe="paper", global_blocks=(), global_pos="none"),
    "paper (abswin + relpos in 4 global blocks)": dict(recipe="paper"),
    "original (abs + relpos everywhere)": dict(recipe="original"),
    "rope": dict(recipe="rope"),
    "lookhere": dict(recipe="lookhere"),
}


def _build(preset, variant, size):
    from winpos.backbones import create

    return create(preset, img_size=max(size), drop_path_rate=0.0, **VARIANTS[variant]).eval()


def _forward(preset, variant, size):
    model = _build(preset, variant, size)
    x = torch.randn(1, 3, *size)

    def run():
        with torch.no_grad():
            return model(x)

    return run


def fit_exponent(tokens, seconds) -> float:
    """Least-squares slope of log(time) against log(tokens)."""
    lx, ly = [math.log(t) for t in tokens], [math.log(s) for s in seconds]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def run(preset="vitdet_b", sizes=((256, 256), (384, 384), (512, 512), (512, 768), (768, 768)), repeats=2,
        memory=True, plot_path=None) -> dict:
    rows, results = [], {"preset": preset, "threads": torch.get_num_threads(), "variants": {}}
    for size in sizes:
        fns = {v: _forward(preset, v, size) for v in VARIANTS}
        times = interleaved_medians(fns, repeats=repeats, warmup=1)
        for v, t in times.items():
            mem = peak_rss_mib(_forward, preset, v, size) if memory else float("nan")
            tokens = (size[0] // 16) * (size[1] // 16)
            rows.append({"variant": v, "size": f"{size[0]}x{size[1]}", "tokens": tokens, "median_s": t,
                         "peak_rss_mib": mem})
            results["variants"].setdefault(v, []).append({"size": size, "tokens": tokens, "seconds": t,
                                                          "peak_rss_mib": mem})
    for v, pts in results["variants"].items():
        results.setdefault("exponent", {})[v] = fit_exponent([p["tokens"] for p in pts], [p["seconds"] for p in pts])
    print(f"scaling of {preset} forward, batch 1, fp32, {results['threads']} threads")
    print_table("time and memory vs input size", rows, ["variant", "size", "tokens", "median_s", "peak_rss_mib"])
    print_table("fitted growth exponent (time ~ tokens^k)",
                [{"variant": v, "k": k} for v, k in results["exponent"].items()], ["variant", "k"])
    if plot_path:
        plot(results, plot_path)
    return results


def plot(results, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for v, pts in results["variants"].items():
        toks = [p["tokens"] for p in pts]
        label = f"{v} (k={results['exponent'][v]:.2f})"
        axes[0].loglog(toks, [p["seconds"] for p in pts], marker="o", label=label)
        axes[1].loglog(toks, [p["peak_rss_mib"] for p in pts], marker="o", label=v)
    axes[0].set(xlabel="tokens (image px / 16)^2", ylabel="forward time (s)",
                title=f"{results['preset']} forward time vs tokens ({results['threads']} CPU threads)")
    axes[1].set(xlabel="tokens", ylabel="peak RSS growth (MiB)", title="peak memory of one forward")
    for ax in axes:
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
