"""``benchmark.py scaling``: forward time and peak memory against input size for each encoding, with the fitted
growth exponent (time ~ tokens^k); window-only models should give k near 1, global blocks push it towards 2."""
from __future__ import annotations

import math

import torch

from winpos.bench.timing import interleaved_medians, peak_rss_mib, print_table
from winpos.errors import WinposError
from winpos.utils.outputs import atomic_savefig

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


def local_exponents(points) -> list[tuple[int, int, float]]:
    """``(tokens_a, tokens_b, k)`` for neighbouring distinct token counts: the slope of log time between them."""
    by_tokens = {}
    for p in sorted(points, key=lambda p: p["tokens"]):
        by_tokens.setdefault(p["tokens"], p["seconds"])
    toks = list(by_tokens)
    return [(a, b, math.log(by_tokens[b] / by_tokens[a]) / math.log(b / a)) for a, b in zip(toks, toks[1:])]


def fit_exponent(tokens, seconds) -> float:
    """Least-squares slope of log(time) against log(tokens)."""
    lx, ly = [math.log(t) for t in tokens], [math.log(s) for s in seconds]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


DEFAULT_SIZES = ((256, 256), (384, 384), (512, 512), (512, 768), (768, 768))


def parse_sizes(text: str) -> tuple[tuple[int, int], ...]:
    """``"256,512x768"`` -> ``((256, 256), (512, 768))`` (``H`` or ``HxW`` in pixels)."""
    sizes = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        try:
            hw = tuple(int(v) for v in item.lower().split("x"))
        except ValueError:
            hw = ()
        if len(hw) not in (1, 2) or min(hw) <= 0:
            raise WinposError(f"size {item!r} in {text!r}: write sizes as H or HxW in pixels, e.g. 256,512x768")
        sizes.append(hw * 2 if len(hw) == 1 else hw)
    if len(sizes) < 2:
        raise WinposError(f"sizes {text!r}: the growth exponent needs at least two sizes")
    return tuple(sizes)


def check_preset(preset: str) -> str:
    """Return ``preset`` if it names a ViTDet preset, else raise a WinposError listing them (the scaling variants
    are ViTDet recipes)."""
    from winpos.backbones.registry import PRESETS, _import_models

    _import_models()
    vit = sorted(p for p in PRESETS if p.startswith("vitdet"))
    if preset not in vit:
        raise WinposError(f"--preset {preset!r} is not a ViTDet preset; the scaling variants are ViTDet recipes: "
                          f"choose one of {', '.join(vit)}")
    return preset


def run(preset="vitdet_b", sizes=DEFAULT_SIZES, repeats=2, warmup=1, memory=True, plot_path=None) -> dict:
    """Time every variant of ``preset`` (a ViTDet preset) at each size; returns the numbers (memory: peak RSS
    growth of one forward, in a spawned process) and the fitted exponents."""
    check_preset(preset)
    rows, results = [], {"preset": preset, "threads": torch.get_num_threads(), "repeats": repeats, "warmup": warmup,
                         "variants": {}}
    for size in sizes:
        fns = {v: _forward(preset, v, size) for v in VARIANTS}
        times = interleaved_medians(fns, repeats=repeats, warmup=warmup, desc=f"timing {size[0]}x{size[1]}")
        for v, t in times.items():
            mem = peak_rss_mib(_forward, preset, v, size) if memory else None
            tokens = (size[0] // 16) * (size[1] // 16)
            rows.append({"variant": v, "size": f"{size[0]}x{size[1]}", "tokens": tokens, "median_s": t,
                         "peak_rss_mib": mem})
            results["variants"].setdefault(v, []).append({"size": size, "tokens": tokens, "seconds": t,
                                                          "peak_rss_mib": mem})
    for v, pts in results["variants"].items():
        results.setdefault("exponent", {})[v] = fit_exponent([p["tokens"] for p in pts], [p["seconds"] for p in pts])
        results.setdefault("local_exponent", {})[v] = local_exponents(pts)
    print(f"scaling of {preset} forward, batch 1, fp32, {results['threads']} threads, median of {repeats} after "
          f"{warmup} warm-up")
    print_table("time and memory vs input size", rows, ["variant", "size", "tokens", "median_s", "peak_rss_mib"])
    print_table("fitted growth exponent (time ~ tokens^k)",
                [{"variant": v, "k": k} for v, k in results["exponent"].items()], ["variant", "k"])
    local_rows = [{"variant": v, **{f"{a}->{b}": k for a, b, k in ks}} for v, ks in results["local_exponent"].items()]
    if local_rows and len(local_rows[0]) > 1:
        print_table("local growth exponent between neighbouring token counts (where global blocks take over)",
                    local_rows, list(local_rows[0]))
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
        if all(p["peak_rss_mib"] is not None for p in pts):  # memory is optional
            axes[1].loglog(toks, [p["peak_rss_mib"] for p in pts], marker="o", label=v)
    axes[0].set(xlabel="tokens (image px / 16)^2", ylabel="forward time (s)",
                title=f"{results['preset']} forward time vs tokens ({results['threads']} CPU threads)")
    axes[1].set(xlabel="tokens", ylabel="peak RSS growth (MiB)", title="peak memory of one forward")
    for ax in axes:
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=120)
    plt.close(fig)
