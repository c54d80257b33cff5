"""Numbers and verdicts for one position embedding at several image sizes, and the driver behind the
``tools/posemb_viz.py`` command line.

``analyze(info, target_sizes)`` measures the embedding at its native size, naively interpolated to each target
(today's behaviour), and built as abs-win at each target (the fix, or the converted checkpoint). The verdicts use
the *centred* window similarity: a component shared by all positions (e.g. the near-constant low-frequency
channels of a sin-cos table) makes the raw WS high whether or not windows are aligned.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from winpos.diagnostics.extract import EmbeddingInfo, effective_embeddings
from winpos.diagnostics.metrics import (SCAN_MAX_SIDE, as_grid, naive_resize, period_scan, periodic_energy_ratio,
                                        window_similarity)
from winpos.errors import WinposError, as_hw
from winpos.outputs import atomic_write

__all__ = ["measure_grid", "target_entry", "analyze", "verdict", "default_targets", "run_posemb_viz"]

CONVERT_HINT = "convert with `tools/convert_checkpoint.py --pos-embed abswin`"
BUILD_HINT = "build it at the new size the abs-win way (resize only the global part, tile the window part)"


def default_targets(info: EmbeddingInfo) -> tuple[int, ...]:
    """Image sizes (px) worth checking: the detection size 1024 and twice the native size."""
    native = max(info.image_hw)
    return tuple(sorted({1024, 2 * native} - {native}))


def measure_grid(E: torch.Tensor, window: int, max_period: int = 64) -> dict[str, Any]:
    """All metrics of a ``(C, H, W)`` grid at ``window``, as plain Python numbers.

    Returns:
        ``{"grid_hw", "n_windows", "ws", "ws_centred", "energy_ratio", "period_peak" (tokens, centred scan),
        "period_peak_ws", "period_scan": {"periods", "ws"}, "error"}``; metrics are None (and ``error`` says
        why) when fewer than 2 full windows fit. A peak with a low ``period_peak_ws`` (< 0.3) is the noise maximum of a smooth map, not a period.
        The scan covers periods up to ``max_period`` on the top-left ``SCAN_MAX_SIDE`` tokens.
    """
    E = as_grid(E)  # validate and convert once; the metrics below accept the numpy grid as is
    C, H, W = E.shape
    out: dict[str, Any] = {"grid_hw": [int(H), int(W)], "n_windows": (H // window) * (W // window),
                           "ws": None, "ws_centred": None, "energy_ratio": None, "period_peak": None,
                           "period_peak_ws": None, "period_scan": None, "error": None}
    try:
        out["ws"] = window_similarity(E, window)
        out["ws_centred"] = window_similarity(E, window, centred=True)
        out["energy_ratio"] = periodic_energy_ratio(E, window)
    except ValueError as e:
        out["error"] = str(e)
        return out
    top = min(min(H, W) // 2, max_period)
    if top >= 2:
        scan = period_scan(E, range(2, top + 1), centred=True, max_side=SCAN_MAX_SIDE)
        out["period_peak"] = scan.peak
        out["period_peak_ws"] = float(scan.ws[list(scan.periods).index(scan.peak)])
        out["period_scan"] = {"periods": [int(p) for p in scan.periods], "ws": [float(v) for v in scan.ws]}
    return out


def verdict(image_px, grid_hw, window: int, before: float | None, naive: float | None,
            abswin: float | None = None, is_abswin_family: bool = False) -> str:
    """One plain-language sentence on what naive interpolation does to window alignment at ``image_px``.

    ``before`` is the centred WS at the native size (None if fewer than 2 windows fit there, e.g. MAE's 14x14
    grid with 14x14 windows), ``naive`` / ``abswin`` the centred WS after naive interpolation / as abs-win.
    """
    h, w = as_hw(image_px, "image size")
    where = f"interpolating to {h}x{w} px ({grid_hw[0]}x{grid_hw[1]} tokens) with {window}x{window}-token windows"
    fix = BUILD_HINT if is_abswin_family else CONVERT_HINT
    if naive is None:
        return f"{where}: fewer than 2 full windows fit, so there is nothing to compare"
    ref = before if before is not None else abswin
    fixed = f" (abs-win keeps WS at {abswin:.2f})" if abswin is not None else ""
    if ref is None:
        return f"{where}: WS {naive:.2f}; no native or abs-win reference to compare with"
    if ref < 0.1:
        return (f"{where}: WS {ref:.2f} -> {naive:.2f}; the embedding has no window-aligned structure to break, "
                "so naive interpolation is not misaligning windows here")
    if naive < 0.5 * ref and ref - naive > 0.1:
        if before is None:  # e.g. MAE / ViTDet: the pretrained grid is a single window
            return (f"{where}: each window gets a different piece of the pretrained embedding (WS {naive:.2f}), "
                    f"while tiling it (abs-win) gives every window the same full embedding (WS {abswin:.2f}); {fix}")
        return f"{where}: WS {before:.2f} -> {naive:.2f}, windows no longer see the same embedding{fixed}; {fix}"
    return f"{where}: WS {ref:.2f} -> {naive:.2f}, window alignment is essentially kept{fixed}"


def target_entry(info: EmbeddingInfo, image_px, native: dict[str, Any], window: int | None = None,
                 max_period: int = 64) -> dict[str, Any]:
    """Metrics of ``info`` naively interpolated to, and built as abs-win at, ``image_px`` (int or pair, px)."""
    w = window or info.window
    hw = info.grid_hw_for(image_px)
    naive = measure_grid(naive_resize(info.grid, hw, antialias=info.antialias), w, max_period)
    ab_grid = info.abswin_at(hw)
    ab = measure_grid(ab_grid, w, max_period) if ab_grid is not None else None
    text = verdict(image_px, hw, w, native["ws_centred"], naive["ws_centred"],
                   None if ab is None else ab["ws_centred"], info.abswin_source == "checkpoint")
    return {"image_px": list(as_hw(image_px)), "grid_hw": list(hw),
            "scale": hw[0] / info.grid.shape[1], "naive": naive, "abswin": ab, "verdict": text}


def analyze(info: EmbeddingInfo, target_sizes: Iterable | None = None, window: int | None = None,
            max_period: int = 64) -> dict[str, Any]:
    """Every number for one embedding, JSON-serializable.

    Args:
        info: from ``effective_embeddings``.
        target_sizes: image sizes in px (ints or pairs); default ``default_targets(info)``.
        window: window override in tokens (default: the format's).
        max_period: largest period the period scans try, in tokens.
    Returns:
        ``{"name", "format", "source", "window", "stride", "antialias", "abswin_source", "notes",
        "native": {...}, "targets": [{...}, ...], "verdicts": [str, ...]}``.
    """
    w = window or info.window
    native = measure_grid(info.grid, w, max_period)
    native["image_px"] = list(info.image_hw)
    sizes = list(target_sizes) if target_sizes is not None else list(default_targets(info))
    targets = [target_entry(info, s, native, w, max_period) for s in sizes]
    return {
        "name": info.name, "format": str(info.format), "source": info.source, "window": w, "stride": info.stride,
        "antialias": info.antialias, "abswin_source": info.abswin_source, "notes": list(info.notes),
        "native": native, "targets": targets, "verdicts": [t["verdict"] for t in targets],
    }


def _out_dir(out_dir) -> Path:
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".winpos_write_test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise WinposError(f"output folder '{out}' cannot be written ({e.strerror or e}); choose a folder you can "
                          "write to with --out / out_dir=") from e
    return out


def run_posemb_viz(paths: Sequence[str | os.PathLike], out_dir, sizes: Sequence, window: int | None = None,
                   format: str = "auto", pdf: bool = False, progress: bool = True) -> dict[str, Any]:
    """Analyze and plot the position embeddings of checkpoints at several image sizes.

    Args:
        paths: checkpoint files (any format ``winpos.checkpoints.io`` reads).
        out_dir: folder for the PNGs (and PDFs) and ``report.json``; created if missing.
        sizes: target image sizes in px (ints or pairs); empty means each format's defaults.
        window: window override in tokens; format: ``"auto"`` or a checkpoint format (see
            ``winpos.checkpoints.formats``).
        pdf: also write PDFs; progress: show a tqdm bar over checkpoints x sizes.
    Returns:
        The report: ``{"out_dir", "checkpoints": [{"path", "embeddings": [analysis + "plots"]}]}``; the same
        content is written to ``out_dir/report.json``.
    """
    from tqdm.auto import tqdm

    from winpos.diagnostics.plots import plot_all

    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if not paths:
        raise WinposError("no checkpoint paths given; pass one or more .pth/.pt/.pkl/.safetensors files")
    out = _out_dir(out_dir)
    sizes = list(sizes or [])
    report: dict[str, Any] = {"out_dir": str(out), "checkpoints": []}
    # every checkpoint is read (and refused, if it must be) before the progress bar starts, so an error is a
    # line of its own, not one wrapped in bar fragments
    loaded = [(path, effective_embeddings(path, format=format, window=window)) for path in paths]
    stems = [Path(p).stem for p in paths]
    stems = [s if stems.count(s) == 1 else f"{s}-{i + 1}" for i, s in enumerate(stems)]  # no two share plot names
    bar = tqdm(total=len(paths) * max(1, len(sizes)), disable=not progress, desc="posemb", unit="ckpt x size")
    try:
        for (path, infos), stem in zip(loaded, stems):
            results = [dict(analyze(info, target_sizes=[], window=window), plots=[]) for info in infos]
            for size in sizes or [None]:
                bar.set_postfix_str(f"{stem} @ {size or 'default sizes'}")
                for info, result in zip(infos, results):
                    for s in [size] if size is not None else default_targets(info):
                        t = target_entry(info, s, result["native"], result["window"])
                        result["targets"].append(t)
                        result["verdicts"].append(t["verdict"])
                        tag = f"{stem}_{info.name.replace('.', '_')}_{'x'.join(map(str, t['image_px']))}px"
                        scans = [m["period_scan"] if m else None for m in (result["native"], t["naive"], t["abswin"])]
                        result["plots"] += [str(p) for p in plot_all(info, s, out, tag, window=result["window"], pdf=pdf,
                                                                       scans=scans)]
                bar.update(1)
            report["checkpoints"].append({"path": str(path), "embeddings": results})
    finally:
        bar.close()
    atomic_write(out / "report.json", lambda f: f.write(json.dumps(report, indent=2)), "w")
    return report
