"""Figures of the doctor's block-term reading (``winpos.diagnostics.terms``), one per term, drawn on Agg canvases
without pyplot (importing this module never changes the user's backend).

* ``plot_rope``: per rotation slot (fastest frequency on the left), the angle range over all token pairs trained
  vs at the new size, one panel per block kind, slots that meet angles never seen shaded red; below, the angle
  step per token with the pi line above which a slot aliases.
* ``plot_relpos``: per block kind, which learned offset each token offset reads after the table is resampled
  (the identity where nothing changes), offsets that did not exist in training shaded.
* ``plot_abs_windows``: the doctor's [BUG]: which pretrained embedding row each token reads, naively interpolated
  (every window a different piece) beside abs-win (every window the same), the attention windows drawn.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from winpos.diagnostics.plots import _save

__all__ = ["figure_names", "plot_abs_windows", "plot_rope", "plot_relpos", "plot_terms"]

NEW_COLOR, REF_COLOR, SHADE = "tab:red", "tab:blue", "#f4c7c3"


def _slot_order(ref_span: np.ndarray) -> np.ndarray:
    """Slots from the fastest (largest trained range) to the slowest: the frequency ladder reads left to right."""
    return np.argsort(-ref_span, kind="stable")


def _block_ranges(blocks) -> str:
    """Block indexes with runs folded, so a title fits its panel: ``0-6, 8-14, 16-22, 24-30``."""
    runs, out = [], []
    for i in sorted(blocks):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    for a, b in runs:
        out.append(str(a) if a == b else f"{a}, {b}" if b == a + 1 else f"{a}-{b}")
    return ", ".join(out)


def plot_rope(reports, path, title: str = "", pdf: bool = False) -> list[Path]:
    """One column per RoPE ``TermReport`` (block kind). Per-head slots are drawn for the worst head: the angle range
    of the head that turned least in training (the one that meets unseen angles first), the step of the fastest."""
    fig = Figure(figsize=(5.2 * len(reports), 6.4), layout="constrained")
    axes = fig.subplots(2, len(reports), squeeze=False)
    for col, rep in enumerate(reports):
        new, ref = rep.data["new"], rep.data["ref"]
        heads = ref.span.shape[0]
        least = ref.span.argmin(0)  # per slot, the head that turned least over the trained offsets
        cols = np.arange(ref.span.shape[1])
        ref_span, new_span = ref.span[least, cols], new.span[least, cols]
        ref_step, new_step = ref.step.max(0), new.step.max(0)
        worst = " (least-turning head)" if heads > 1 else ""
        hot, alias = rep.data["new_angles"].any(0), rep.data["aliased"].any(0)
        order = _slot_order(ref_span)
        x = np.arange(len(order))
        top, bottom = axes[0, col], axes[1, col]
        for i, slot in enumerate(order):
            if hot[slot]:
                top.axvspan(i - 0.5, i + 0.5, color=SHADE, lw=0)
            if alias[slot]:
                bottom.axvspan(i - 0.5, i + 0.5, color=SHADE, lw=0)
        w = 0.38
        top.bar(x - w / 2, ref_span[order], w, color=REF_COLOR,
                label=f"trained ({ref.grid[0]}x{ref.grid[1]} tokens){worst}")
        top.bar(x + w / 2, new_span[order], w, color=NEW_COLOR, label=f"now ({new.grid[0]}x{new.grid[1]} tokens)")
        top.axhline(math.pi, color="k", ls="--", lw=1)
        top.text(len(x) - 0.5, math.pi * 1.08, "half a turn (pi)", ha="right", va="bottom", fontsize=8)
        top.set_yscale("log")
        top.set_ylim(top=max(math.pi, float(new_span.max()), float(ref_span.max())) * 2.5)
        top.set_ylabel("angle range over token pairs (rad)")
        blocks = _block_ranges(rep.group.blocks)
        k = int(rep.data["new_angles"].sum())
        what = (f"{k} of {rep.data['new_angles'].size} (head, slot) pairs meet unseen angles\n(shaded: in some head)"
                if heads > 1 else f"{k} slot{'s' if k != 1 else ''} rotate into unseen angles (shaded)")
        top.set_title(f"{rep.level}: {rep.group.kind} blocks ({blocks})\n{what}", fontsize=9)
        top.legend(fontsize=8, loc="upper right")
        fastest = " (fastest head)" if heads > 1 else ""
        bottom.plot(x, ref_step[order], "o-", color=REF_COLOR, ms=4, label=f"trained{fastest}")
        bottom.plot(x, new_step[order], "s--", color=NEW_COLOR, ms=4, label=f"now{fastest}")
        bottom.axhline(math.pi, color="k", ls="--", lw=1)
        bottom.text(len(x) - 0.5, math.pi * 1.08, "aliasing above pi", ha="right", va="bottom", fontsize=8)
        bottom.set_yscale("log")
        bottom.set_ylim(top=max(math.pi * 2.5, float(new_step.max()) * 2, float(ref_step.max()) * 2))
        ratio = float(np.max(rep.data["step_ratio"]))
        scale = "same step" if abs(ratio - 1) < 1e-3 else (f"steps x{ratio:.3g} (compressed)" if ratio < 1
                                                          else f"steps x{ratio:.3g} (stretched)")
        bottom.set_title(f"angle step between neighbouring tokens: {scale}", fontsize=9)
        bottom.set_ylabel("angle per token step (rad)")
        bottom.set_xlabel("rotation slot, fastest frequency first")
        bottom.legend(fontsize=8, loc="lower left")
        for ax in (top, bottom):
            ax.set_xlim(-0.5, len(x) - 0.5)
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(fig, path, pdf)


def plot_relpos(reports, path, title: str = "", pdf: bool = False) -> list[Path]:
    """One panel per relpos ``TermReport``: the learned offset (table position, in trained offsets) that each token
    offset reads after linear resampling, against the identity."""
    fig = Figure(figsize=(4.6 * len(reports), 4.2), layout="constrained")
    axes = fig.subplots(1, len(reports), squeeze=False)[0]
    for ax, rep in zip(axes, reports):
        stored, used = rep.data["stored"][0], rep.data["used"][0]
        reach, trained = (used - 1) // 2, (stored - 1) // 2
        d = np.arange(-reach, reach + 1)
        # linear resampling (align_corners=False): output index i reads input position (i + 0.5) * L / L' - 0.5
        read = np.clip((d + reach + 0.5) * stored / used - 0.5, 0, stored - 1) - trained
        if reach > trained:
            ax.axvspan(-reach - 0.5, -trained - 0.5, color=SHADE, lw=0, label="offsets new at this size")
            ax.axvspan(trained + 0.5, reach + 0.5, color=SHADE, lw=0)
        ax.plot(d, d, color=REF_COLOR, lw=1, ls="--", label="as trained (identity)")
        ax.plot(d, read, color=NEW_COLOR, lw=1.8, label=f"read now (table {stored} -> {used})")
        blocks = _block_ranges(rep.group.blocks)
        ax.set_title(f"{rep.level}: {rep.group.kind} blocks ({blocks})\nstretch x{rep.data['stretch'][0]:.3g}",
                     fontsize=9)
        ax.set_xlabel("token offset d (y; x is the same)")
        ax.set_ylabel("learned offset whose bias it reads")
        ax.legend(fontsize=8, loc="upper left")
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(fig, path, pdf)


def _source_colours(sy: np.ndarray, sx: np.ndarray, n: tuple) -> np.ndarray:
    """RGB per token from the (row, column) of the embedding cell it reads: red grows down, blue grows right."""
    r, b = np.broadcast_arrays(sy[:, None] / max(n[0] - 1, 1), sx[None, :] / max(n[1] - 1, 1))
    return np.stack([r, np.full(r.shape, 0.35), b], -1)


def plot_abs_windows(grid, pretrain_grid, window: int, path, title: str = "", pdf: bool = False) -> list[Path]:
    """Left: the token grid coloured by the pretrained embedding cell each token reads after naive resizing
    (``pretrain_grid`` stretched over ``grid``); right: abs-win, the window embedding tiled (each token reads cell
    ``(y mod w, x mod w)``). White lines: the ``window``-token attention windows."""
    from winpos.diagnostics.plots import _draw_windows

    (H, W), (ph, pw) = grid, pretrain_grid
    naive = _source_colours(np.floor((np.arange(H) + 0.5) * ph / H), np.floor((np.arange(W) + 0.5) * pw / W), (ph, pw))
    tiled = _source_colours(np.arange(H) % window, np.arange(W) % window, (window, window))
    fig = Figure(figsize=(10, 5.2), layout="constrained")
    axes = fig.subplots(1, 2)
    for ax, img, label in ((axes[0], naive, f"naive resize {ph}x{pw} -> {H}x{W} (today): every window reads a "
                                            "different piece"),
                           (axes[1], tiled, f"abs-win (the fix): every {window}x{window} window reads the same "
                                            "embedding")):
        ax.imshow(img, interpolation="nearest")
        _draw_windows(ax, H, W, window)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("x (tokens)")
        ax.set_ylabel("y (tokens)")
    fig.suptitle((title + "\n" if title else "") + "colour = the embedding cell a token reads (nearest; red: row, "
                 "blue: column); white lines = attention windows", fontsize=10)
    return _save(fig, path, pdf)


def _draws_abs(doctor) -> bool:
    return doctor is not None and not doctor.ok and bool(doctor.pretrain_grid) and bool(doctor.window_sizes)


def figure_names(doctor, stem: str) -> list[str]:
    """The file names ``plot_terms(doctor.terms, ..., stem, doctor=doctor)`` writes (PNG)."""
    names = [f"{stem}_abs_windows.png"] if _draws_abs(doctor) else []
    return names + [f"{stem}_{term.lower()}.png" for term in ("RoPE", "relpos")
                    if any(r.term == term for r in doctor.terms)]


def plot_terms(reports, out_dir, stem: str, title: str = "", pdf: bool = False, doctor=None) -> list[Path]:
    """``plot_rope`` and ``plot_relpos`` for the terms present in ``reports``: ``<stem>_rope.png``,
    ``<stem>_relpos.png`` in ``out_dir``, and with a ``doctor`` report that found the bug, ``plot_abs_windows``
    (``<stem>_abs_windows.png``). Returns the written paths."""
    out = []
    if _draws_abs(doctor):
        out += plot_abs_windows(doctor.grid, doctor.pretrain_grid, doctor.window_sizes[0],
                                Path(out_dir) / f"{stem}_abs_windows.png", title=f"absolute embedding: {title}",
                                pdf=pdf)
    for term, fn in (("RoPE", plot_rope), ("relpos", plot_relpos)):
        mine = [r for r in reports if r.term == term]
        if mine:
            out += fn(mine, Path(out_dir) / f"{stem}_{term.lower()}.png", title=f"{term}: {title}", pdf=pdf)
    return out
