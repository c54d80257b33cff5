"""Numbers and verdicts for one position embedding at several image sizes, and the driver behind the
``winpos-posemb`` command (winpos.cli.posemb_viz).

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
from winpos.utils.outputs import atomic_write

__all__ = ["measure_grid", "target_entry", "analyze", "verdict", "default_targets", "run_posemb_viz"]

# The verdict thresholds, named in every verdict they decide. WS is the centred window similarity.
NO_PATTERN_WS = 0.1  # a reference WS below this: the embedding has no window pattern for interpolation to break
KEPT_FRACTION = 0.8  # naive interpolation keeps at least this fraction of the reference WS: alignment kept
BROKEN_FRACTION = 0.5  # ... less than this fraction: alignment broken
THRESHOLDS = (f"thresholds: no window pattern below WS {NO_PATTERN_WS}; kept >= {KEPT_FRACTION:.0%} of the "
              f"reference WS, broken < {BROKEN_FRACTION:.0%}")


def convert_command(info: EmbeddingInfo | None = None) -> str:
    """The converter command that builds this checkpoint as abs-win, with its path and preset filled in where known
    (several matching presets: the first, the others named)."""
    src = getattr(info, "source", "<object>") if info is not None else "<object>"
    src = src if src != "<object>" else "CKPT"
    presets = list(getattr(info, "presets", []) or [])
    to = presets[0] if presets else "PRESET"
    out = f"{Path(src).stem}_abswin.safetensors" if src != "CKPT" else "OUT.safetensors"
    cmd = f"winpos-convert --input {src} --output {out} --to {to} --pos-embed abswin"
    if len(presets) > 1:
        cmd += f" (or --to {' / '.join(presets[1:])}, whichever has your model's depth)"
    elif not presets:
        cmd += " (PRESET: the winpos preset of your model, e.g. hieradet_bplus or vitdet_b)"
    return cmd


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
        try:
            scan = period_scan(E, range(2, top + 1), centred=True, max_side=SCAN_MAX_SIDE)
        except ValueError as e:  # constant over the scanned corner (a zero-initialized embedding)
            out["error"] = str(e)
            return out
        out["period_peak"] = scan.peak
        out["period_peak_ws"] = float(scan.ws[list(scan.periods).index(scan.peak)])
        out["period_scan"] = {"periods": [int(p) for p in scan.periods], "ws": [float(v) for v in scan.ws]}
    return out


def verdict(image_px, grid_hw, window: int, before: float | None, naive: float | None,
            abswin: float | None = None, is_abswin_family: bool = False, fix: str | None = None) -> str:
    """One plain-language sentence on what resizing does to window alignment at ``image_px``, naming the threshold
    that decided it (``NO_PATTERN_WS``, ``KEPT_FRACTION``, ``BROKEN_FRACTION``).

    ``before`` is the centred WS at the native size (None if fewer than 2 windows fit there, e.g. MAE's 14x14
    grid with 14x14 windows), ``naive`` / ``abswin`` the centred WS after naive interpolation / as abs-win.
    ``is_abswin_family``: the model already resizes the abs-win way (SAM2, timm abs-win, winpos abs-win), so
    there is nothing to fix. ``fix``: the command to print when naive interpolation breaks the alignment.
    """
    h, w = as_hw(image_px, "image size")
    where = f"at {h}x{w} px ({grid_hw[0]}x{grid_hw[1]} tokens, {window}x{window}-token windows)"
    fix = fix or convert_command()
    if is_abswin_family:
        ws = f"WS {abswin:.2f}" if abswin is not None else "fewer than 2 full windows to measure"
        other = f"; naive interpolation, which this model does not do, would give {naive:.2f}" \
            if naive is not None else ""
        return f"{where}: abs-win: resizing keeps the windows aligned, nothing to fix ({ws}{other})"
    if naive is None:
        return f"{where}: fewer than 2 full windows fit, so there is nothing to compare"
    ref = before if before is not None else abswin
    if ref is None:
        return f"{where}: WS {naive:.2f}; no native or abs-win reference to compare with"
    if ref < NO_PATTERN_WS:
        return (f"{where}: no window pattern (reference WS {ref:.2f} < {NO_PATTERN_WS}): the bug cannot matter for "
                "this embedding; nothing to fix")
    frac = naive / ref
    kept = f"naive keeps {max(frac, 0.0):.0%} of WS {ref:.2f} (-> {naive:.2f})"
    if frac < BROKEN_FRACTION:
        if before is None:  # e.g. MAE / ViTDet: the pretrained grid is a single window
            return (f"{where}: broken: each window gets a different piece of the pretrained embedding; {kept} of "
                    f"the tiled abs-win embedding, under the {BROKEN_FRACTION:.0%} threshold; fix: {fix}")
        return (f"{where}: broken: windows no longer see the same embedding; {kept}, under the "
                f"{BROKEN_FRACTION:.0%} threshold (abs-win keeps WS {abswin:.2f}); fix: {fix}")
    if frac < KEPT_FRACTION:
        return (f"{where}: weakened: {kept}, between the {BROKEN_FRACTION:.0%} (broken) and {KEPT_FRACTION:.0%} "
                f"(kept) thresholds; abs-win keeps WS {abswin:.2f}: {fix}")
    return f"{where}: kept: {kept}, at least the {KEPT_FRACTION:.0%} threshold; nothing to fix at this size"


def is_constant(E: torch.Tensor) -> bool:
    """Whether every channel of ``E (C, H, W)`` is constant over positions (no structure at all to measure)."""
    flat = E.detach().flatten(1).double()
    return bool((flat.max(dim=1).values - flat.min(dim=1).values).max() == 0) if flat.numel() else True


def target_entry(info: EmbeddingInfo, image_px, native: dict[str, Any], window: int | None = None,
                 max_period: int = 64) -> dict[str, Any]:
    """Metrics of ``info`` naively interpolated to, and built as abs-win at, ``image_px`` (int or pair, px)."""
    w = window or info.window
    hw = info.grid_hw_for(image_px)
    if is_constant(info.grid):
        h_px, w_px = as_hw(image_px, "image size")
        text = (f"at {h_px}x{w_px} px ({hw[0]}x{hw[1]} tokens, {w}x{w}-token windows): no window pattern (the "
                "embedding is constant over positions, e.g. zero-initialized and untrained): the bug cannot matter "
                "for this embedding; nothing to fix")
        empty = measure_grid(torch.zeros(1, *hw), w, max_period)
        return {"image_px": list(as_hw(image_px)), "grid_hw": list(hw), "scale": hw[0] / info.grid.shape[1],
                "naive": empty, "abswin": None, "verdict": text}
    naive = measure_grid(naive_resize(info.grid, hw, antialias=info.antialias), w, max_period)
    ab_grid = info.abswin_at(hw)
    ab = measure_grid(ab_grid, w, max_period) if ab_grid is not None else None
    text = verdict(image_px, hw, w, native["ws_centred"], naive["ws_centred"],
                   None if ab is None else ab["ws_centred"], info.abswin_source == "checkpoint",
                   fix=convert_command(info))
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
        ``{"name", "format", "source", "window", "stride", "antialias", "abswin_source", "notes", "native_from",
        "presets", "thresholds", "native": {...}, "targets": [{...}, ...], "verdicts": [str, ...]}``.
    """
    w = window or info.window
    native = measure_grid(info.grid, w, max_period)
    native["image_px"] = list(info.image_hw)
    sizes = list(target_sizes) if target_sizes is not None else list(default_targets(info))
    targets = [target_entry(info, s, native, w, max_period) for s in sizes]
    return {
        "name": info.name, "format": str(info.format), "source": info.source, "window": w, "stride": info.stride,
        "antialias": info.antialias, "abswin_source": info.abswin_source, "notes": list(info.notes),
        "native_from": info.native_from, "presets": list(info.presets), "thresholds": THRESHOLDS, "native": native,
        "targets": targets, "verdicts": [t["verdict"] for t in targets],
    }


def _out_dir(out_dir) -> Path:
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".winpos_write_test"
        probe.write_text("")  # output-policy: a writability probe, removed on the next line
        probe.unlink()
    except OSError as e:
        raise WinposError(f"output folder '{out}' cannot be written ({e.strerror or e}); choose a folder you can "
                          "write to with --out / out_dir=") from e
    return out


def run_posemb_viz(paths: Sequence[str | os.PathLike], out_dir, sizes: Sequence, window: int | None = None,
                   format: str = "auto", pdf: bool = False, progress: bool = True,
                   native_size=None) -> dict[str, Any]:
    """Analyze and plot the position embeddings of checkpoints at several image sizes.

    Args:
        paths: checkpoint files (any format ``winpos.checkpoints.io`` reads).
        out_dir: folder for the PNGs (and PDFs) and ``report.json``; created if missing.
        sizes: target image sizes in px (ints or pairs); empty means each format's defaults.
        window: window override in tokens; format: ``"auto"`` or a checkpoint format (see
            ``winpos.checkpoints.formats``).
        pdf: also write PDFs; progress: show a tqdm bar over checkpoints x sizes.
        native_size: the image size in px the checkpoints were trained at (abs-win sources; see
            ``effective_embeddings(resolution=)``); None reads it from each checkpoint.
    Returns:
        The report: ``{"out_dir", "checkpoints": [{"path", "embeddings": [analysis + "plots"]} or {"path",
        "error"}]}``; the same content is written to ``out_dir/report.json``. A checkpoint that cannot be read or
        analysed gets its one-line ``error`` and the others are still analysed and written.
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
    # every checkpoint is read before the progress bar starts, so an error is a line of its own, not one wrapped
    # in bar fragments; one that cannot be read is reported and the others go on
    loaded = []
    for path in paths:
        try:
            loaded.append((path, effective_embeddings(path, format=format, window=window, resolution=native_size),
                           None))
        except (WinposError, OSError) as e:
            loaded.append((path, [], f"{path}: {' '.join(str(e).split())}"))
    stems = [Path(p).stem for p in paths]
    stems = [s if stems.count(s) == 1 else f"{s}-{i + 1}" for i, s in enumerate(stems)]  # no two share plot names
    readable = sum(error is None for _, _, error in loaded)
    bar = tqdm(total=readable * max(1, len(sizes)), disable=not progress or not readable, desc="posemb",
               unit="ckpt x size")
    try:
        for (path, infos, error), stem in zip(loaded, stems):
            if error is None:
                try:
                    results = _analyze_and_plot(infos, sizes, window, out, stem, pdf, bar, plot_all)
                except (WinposError, OSError) as e:
                    error = f"{path}: {' '.join(str(e).split())}"
            if error is not None:
                report["checkpoints"].append({"path": str(path), "error": error})
            else:
                report["checkpoints"].append({"path": str(path), "embeddings": results})
    finally:
        bar.close()
    atomic_write(out / "report.json", lambda f: f.write(json.dumps(report, indent=2)), "w")
    return report


def _analyze_and_plot(infos, sizes, window, out, stem, pdf, bar, plot_all) -> list[dict]:
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
    return results
