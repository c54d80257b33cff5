"""Figures for the window-similarity diagnostic (matplotlib, headless: figures are drawn on Agg canvases
without pyplot, so importing this module never changes the user's backend).

1. ``plot_embedding_grids``: one channel and a 3-component PCA (as RGB) of each grid, with the attention window
   grid drawn over them: native / naively interpolated / abs-win, side by side.
2. ``plot_period_scan``: WS against the period, with the attention window and each curve's peak marked.
3. ``plot_window_similarity``: the window-by-window cosine matrix and the per-offset similarity map.

``plot_all`` draws the three for one ``EmbeddingInfo`` at one target image size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from matplotlib.figure import Figure

from winpos.diagnostics.extract import EmbeddingInfo
from winpos.diagnostics.metrics import (SCAN_MAX_SIDE, PeriodScan, naive_resize, offset_similarity_map, period_scan,
                                        scan_peak, window_similarity, window_similarity_matrix, window_tiles)
from winpos.errors import WinposError
from winpos.utils.outputs import atomic_savefig

__all__ = ["plot_embedding_grids", "plot_period_scan", "plot_window_similarity", "plot_all", "states_at",
           "prepare_report_dir"]

Panel = tuple[str, torch.Tensor]  # (label, (C, H, W) grid)
CLEAR_PERIOD_WS = 0.3  # below this the scan's maximum is noise of a smooth map, not a period


def prepare_report_dir(out_dir, inputs=(), force: bool = False, flag: str = "--out") -> Path:
    """The output policy of a plot folder, before any work: a folder that already holds a ``report.json`` or
    figures (PNG / PDF) is refused unless ``force``; with ``force`` the earlier report and the figures it lists are
    removed, so the folder never holds figures that its report does not list. Returns the folder."""
    import json

    from winpos.utils.outputs import check_output_dir

    out = Path(out_dir)
    earlier = sorted(p.name for p in out.glob("*") if p.suffix.lower() in (".png", ".pdf")) if out.is_dir() else []
    check_output_dir(out, input_files=inputs, planned=["report.json", *earlier], force=force, flag=flag)
    report = out / "report.json"
    if force and report.is_file():
        try:
            listed = [Path(p) for c in json.loads(report.read_text()).get("checkpoints", [])
                      for e in c.get("embeddings", []) for p in e.get("plots", [])]
        except (ValueError, AttributeError):
            listed = []
        for p in listed:
            if p.parent.resolve() == out.resolve() and p.suffix.lower() in (".png", ".pdf"):
                p.unlink(missing_ok=True)
                p.with_suffix(".pdf").unlink(missing_ok=True)
        report.unlink()
    return out


def _save(fig: Figure, path: Path, pdf: bool) -> list[Path]:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_savefig(fig, path, dpi=110)  # constrained layout fits the labels
        out = [path]
        if pdf:
            atomic_savefig(fig, path.with_suffix(".pdf"))
            out.append(path.with_suffix(".pdf"))
    except OSError as e:
        raise WinposError(f"cannot write figure '{path}' ({e.strerror or e}); choose an output folder you can "
                          "write to") from e
    return out


def _pca_basis(E: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Mean (C,) and top-3 principal directions (C, 3) of the C-vectors of ``E (C, H, W)``."""
    X = E.detach().double().flatten(1).numpy()  # (C, H*W)
    mean = X.mean(1)
    Xc = X - mean[:, None]
    evals, evecs = np.linalg.eigh(Xc @ Xc.T)  # C x C covariance: cheaper than an SVD of the H*W x C data
    basis = evecs[:, np.argsort(evals)[::-1][:3]]
    if basis.shape[1] < 3:  # fewer than 3 channels: pad with zero components (shown as black)
        basis = np.pad(basis, ((0, 0), (0, 3 - basis.shape[1])))
    return mean, basis


def _pca_rgb(E: torch.Tensor, mean, basis, lo, hi) -> np.ndarray:
    X = E.detach().double().flatten(1).T.numpy()
    proj = (X - mean) @ basis  # (H*W, 3)
    rgb = np.clip((proj - lo) / np.maximum(hi - lo, 1e-12), 0, 1)
    return rgb.reshape(E.shape[1], E.shape[2], 3)


def _draw_windows(ax, H: int, W: int, w: int, color: str = "white") -> None:
    """Window boundaries every ``w`` tokens from (0, 0); pixel k covers [k-0.5, k+0.5] in imshow."""
    # one collection per direction: hundreds of axvline artists make layout and drawing slow on big grids
    dense = max(H, W) / w > 24  # many windows: thinner lines so the embedding stays visible
    lw, alpha = (0.3, 0.5) if dense else (0.6, 0.7)
    ax.vlines(np.arange(w, W, w) - 0.5, -0.5, H - 0.5, colors=color, lw=lw, alpha=alpha)
    ax.hlines(np.arange(w, H, w) - 0.5, -0.5, W - 0.5, colors=color, lw=lw, alpha=alpha)


def _token_axes(ax, stride: int) -> None:
    ax.set_xlabel("x (tokens)")
    ax.set_ylabel("y (tokens)")
    top = ax.secondary_xaxis("top", functions=(lambda t: (t + 0.5) * stride, lambda p: p / stride - 0.5))
    top.set_xlabel("x (px)", fontsize=8)
    top.tick_params(labelsize=7)


def _ws_text(E: torch.Tensor, w: int) -> str:
    try:
        return f"WS@{w} {window_similarity(E, w):.2f} (centred {window_similarity(E, w, centred=True):.2f})"
    except ValueError:
        return f"< 2 full {w}x{w} windows"


def plot_embedding_grids(panels: Sequence[Panel], window: int, stride: int, path, title: str = "",
                         channel: int | None = None, pdf: bool = False) -> list[Path]:
    """Row 1: one channel of each grid; row 2: its PCA as RGB (basis and colour range from the first grid).

    Args:
        panels: ``[(label, E (C, H, W)), ...]``; the first is the reference (native).
        window: window size in tokens drawn as a grid; stride: patch stride in px (for the px axis).
        channel: channel to show; default the one with the most window-periodic energy in the first grid.
    Returns:
        The written files.
    """
    ref = panels[0][1].detach().float()
    why = ""
    if channel is None:
        channel, why = _most_periodic_channel(ref, window)
    mean, basis = _pca_basis(ref)
    ref_proj = (ref.double().flatten(1).T.numpy() - mean) @ basis
    lo, hi = np.percentile(ref_proj, 1, axis=0), np.percentile(ref_proj, 99, axis=0)
    vmax = float(ref[channel].abs().max()) or 1.0
    fig = Figure(figsize=(4.6 * len(panels), 9.4), layout="constrained")
    axes = fig.subplots(2, len(panels), squeeze=False)
    for j, (label, E) in enumerate(panels):
        E = E.detach().float()
        C, H, W = E.shape
        head = f"{label}\n{H}x{W} tokens = {H * stride}x{W * stride} px\n{_ws_text(E, window)}"
        ax = axes[0, j]
        im = ax.imshow(E[channel].numpy(), cmap="RdBu_r", vmin=-vmax, vmax=vmax, interpolation="nearest")
        _draw_windows(ax, H, W, window, color="black")
        ax.set_title(f"{head}\nchannel {channel}{why}", fontsize=9)
        _token_axes(ax, stride)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="embedding value")
        ax = axes[1, j]
        ax.imshow(_pca_rgb(E, mean, basis, lo, hi), interpolation="nearest")
        _draw_windows(ax, H, W, window)
        ax.set_title("PCA of the C channels as RGB\n(components of the native grid)", fontsize=9)
        _token_axes(ax, stride)
    fig.suptitle((title + "\n" if title else "") + f"position embedding; lines: {window}x{window}-token attention "
                 "windows anchored at (0, 0)", fontsize=11)
    return _save(fig, path, pdf)


def _most_periodic_channel(E: torch.Tensor, w: int) -> tuple[int, str]:
    """The channel with the largest window-periodic energy fraction (or the largest variance), and why."""
    try:
        tiles = window_tiles(E, w, centred=True)  # (nh, nw, C, w, w)
    except ValueError:
        return int(E.flatten(1).var(dim=1).argmax()), " (largest variance in the first grid)"
    periodic = (tiles.mean(axis=(0, 1)) ** 2).sum(axis=(-1, -2))  # per channel, (C,)
    ratio = periodic / np.maximum((tiles ** 2).sum(axis=(0, 1, 3, 4)), 1e-30)
    return int(ratio.argmax()), " (most window-periodic in the first grid)"


def plot_period_scan(panels: Sequence[Panel], window: int, stride: int, path, title: str = "",
                     max_period: int = 64, pdf: bool = False, scans: Sequence | None = None) -> list[Path]:
    """Centred WS(p) for each grid over p = 2 .. min(H, W)/2 (capped at ``max_period``); window and peaks marked.

    ``scans``: optional precomputed ``{"periods", "ws"}`` per panel (as in ``report.measure_grid``), or None
    entries to compute here.
    """
    fig = Figure(figsize=(8.5, 5.2), layout="constrained")
    ax = fig.subplots()
    for k, (label, E) in enumerate(panels):
        top = min(min(E.shape[-2:]) // 2, max_period)
        if top < 2:
            continue
        pre = scans[k] if scans is not None and k < len(scans) else None
        if pre is not None:
            scan = _scan_from_dict(pre)
        else:
            try:
                scan = period_scan(E, range(2, top + 1), centred=True, max_side=SCAN_MAX_SIDE)
            except ValueError:  # constant over positions (zero-initialized): no curve to draw
                ax.plot([], [], label=f"{label}: constant over positions, no period to scan")
                continue
        peak_ws = float(scan.ws[list(scan.periods).index(scan.peak)])
        clear = peak_ws >= CLEAR_PERIOD_WS
        crop = f"; top-left {SCAN_MAX_SIDE}x{SCAN_MAX_SIDE} scanned" if max(E.shape[1:]) > SCAN_MAX_SIDE else ""
        what = f"peak {scan.peak}" if clear else f"no clear period (max {peak_ws:.2f})"
        # later curves dashed and thinner, so a curve lying on top of the native one leaves it visible
        line, = ax.plot(scan.periods, scan.ws, marker=".", ms=3, lw=2.2 if k == 0 else 1.2, ls="-" if k < 2 else "--",
                        label=f"{label} ({E.shape[1]}x{E.shape[2]} tokens{crop}), {what}")
        if clear:
            ax.plot([scan.peak], [peak_ws], marker="*", ms=14, color=line.get_color(), markeredgecolor="black")
    ax.axvline(window, color="black", ls="--", lw=1, label=f"attention window {window} tokens ({window * stride} px)")
    ax.set_xlabel("period p (tokens)")
    ax.set_ylabel("window similarity WS(p), centred cosine")
    secax = ax.secondary_xaxis("top", functions=(lambda t: t * stride, lambda p: p / stride))
    secax.set_xlabel("period (px)")
    ax.set_ylim(min(-0.1, ax.get_ylim()[0]), 1.05)
    ax.axhline(0, color="grey", lw=0.5)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    ax.set_title((title + "\n" if title else "") + "period scan: the peak (star) is the period the embedding "
                 "repeats with", fontsize=10)
    return _save(fig, path, pdf)


def _scan_from_dict(d) -> PeriodScan:
    periods, ws = np.asarray(d["periods"]), np.asarray(d["ws"])
    return PeriodScan(periods, ws, scan_peak(periods, ws))


def plot_window_similarity(panels: Sequence[Panel], window: int, path, title: str = "", max_windows: int = 512,
                           pdf: bool = False) -> list[Path]:
    """Row 1: window-by-window centred cosine matrix; row 2: per-offset mean cosine across windows."""
    fig = Figure(figsize=(4.8 * len(panels), 9.4), layout="constrained")
    axes = fig.subplots(2, len(panels), squeeze=False)
    for j, (label, E) in enumerate(panels):
        ax, ax2 = axes[0, j], axes[1, j]
        n = (E.shape[1] // window) * (E.shape[2] // window)
        step = max(1, int(np.ceil(n / max_windows)))
        try:
            M = window_similarity_matrix(E, window, centred=True, step=step)
            off = offset_similarity_map(E, window, centred=True)
            ws = window_similarity(E, window, centred=True)
        except ValueError:
            flat = E.detach().flatten(1)
            why = ("is constant over positions\n(e.g. zero-initialized): no window\nstructure to compare"
                   if bool((flat.max(1).values == flat.min(1).values).all()) else
                   f"holds fewer than 2 full\n{window}x{window} windows")
            for a in (ax, ax2):
                a.text(0.5, 0.5, f"{label}:\nthe {E.shape[1]}x{E.shape[2]}-token grid {why}", ha="center",
                       va="center", transform=a.transAxes)
                a.set_axis_off()
            continue
        im = ax.imshow(M, cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest",
                       extent=(-0.5, n - 0.5, n - 0.5, -0.5))
        nw = E.shape[2] // window
        sub = f", 1 in {step} shown" if step > 1 else ""
        ax.set_title(f"{label}\n{n} windows ({E.shape[1] // window}x{nw}){sub}\n"
                     f"WS (centred) = {ws:.2f}", fontsize=9)
        ax.set_xlabel("window index (row-major)")
        ax.set_ylabel("window index (row-major)")
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="cosine similarity")
        im2 = ax2.imshow(off, cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
        ax2.set_title(f"per-offset similarity across windows\nmean {off.mean():.2f}", fontsize=9)
        ax2.set_xlabel("offset in window, x (tokens)")
        ax2.set_ylabel("offset in window, y (tokens)")
        fig.colorbar(im2, ax=ax2, fraction=0.046, pad=0.04, label="mean cosine")
    fig.suptitle((title + "\n" if title else "") + f"do all {window}x{window}-token windows see the same embedding? "
                 "(centred cosine; 1 = identical)", fontsize=11)
    return _save(fig, path, pdf)


def states_at(info: EmbeddingInfo, image_px) -> list[Panel]:
    """The grids to compare at ``image_px``: native, naive interpolation, and abs-win (when it has parts)."""
    hw = info.grid_hw_for(image_px)
    same = " (= native: same size)" if tuple(hw) == tuple(info.grid.shape[1:]) else ""
    panels: list[Panel] = [("native", info.grid),
                           ("naive bicubic interpolation" + (" (antialias)" if info.antialias else "") + same,
                            naive_resize(info.grid, hw, antialias=info.antialias))]
    ab = info.abswin_at(hw)
    if ab is not None:
        kind = "abs-win (this model)" if info.abswin_source == "checkpoint" else "abs-win (converted)"
        panels.append((kind + same, ab))
    return panels


def plot_all(info: EmbeddingInfo, image_px, out_dir, tag: str, window: int | None = None,
             pdf: bool = False, scans: Sequence | None = None) -> list[Path]:
    """Write ``{tag}_embedding.png``, ``{tag}_period_scan.png`` and ``{tag}_window_similarity.png``.

    ``scans``: precomputed period scans for (native, naive, abs-win), as ``report.measure_grid`` returns them.
    """
    w = window or info.window
    panels = states_at(info, image_px)
    out = Path(out_dir)
    h, wd = info.image_hw
    name = (f"{info.format}: {info.name} (window {w} tokens = {w * info.stride} px)\n"
            f"native size {h}x{wd} px ({info.native_from or 'from the checkpoint'})")
    files = plot_embedding_grids(panels, w, info.stride, out / f"{tag}_embedding.png", name, pdf=pdf)
    files += plot_period_scan(panels, w, info.stride, out / f"{tag}_period_scan.png", name, pdf=pdf, scans=scans)
    files += plot_window_similarity(panels, w, out / f"{tag}_window_similarity.png", name, pdf=pdf)
    return files
