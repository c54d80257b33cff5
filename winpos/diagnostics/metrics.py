"""Window-similarity metrics on an effective position-embedding grid ``E`` of shape ``(C, H, W)``.

They measure how much every attention window receives the *same* position embedding, which is what a
weight-shared window attention learned to expect (these definitions are winpos's own, consistent with the
captions of the abs-win paper, Bolya et al., not with its numbers):

* ``window_similarity``: WS, the mean cosine between the flattened w x w x C tiles of every ordered pair of full
  windows anchored at (0, 0). 1 = every window sees an identical embedding; ~0 = no window structure.
* ``periodic_energy_ratio``: R_w, the fraction of centred energy in the projection onto w-periodic maps.
* ``period_scan``: WS(p) over periods p; its peak is the period the embedding actually has.
* ``offset_similarity_map``: per in-window offset, the mean cosine across windows of the C-vectors there.
* ``window_similarity_matrix``: the window-by-window cosine matrix.

All metrics compute in float64 on CPU. Means over pairs use ``|sum u_k|^2 - sum |u_k|^2`` of the unit vectors
u_k, so the cost is linear in the number of windows (SAM2 at 1024 px has 1024 8x8 windows; a period scan tries
thousands of 2x2 ones). A zero tile has cosine 0 with every other tile.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np
import torch

from winpos.errors import WinposError, as_hw
from winpos.posemb.abswin import abs_to_abswin, abswin_embedding
from winpos.posemb.interp import resize_grid

__all__ = [
    "window_similarity", "periodic_energy_ratio", "period_scan", "PeriodScan", "offset_similarity_map",
    "window_similarity_matrix", "SCAN_MAX_SIDE", "scan_peak", "as_grid", "naive_resize", "abswin_embed",
    "abswin_parts_from_grid", "window_tiles",
]


def as_grid(E, name: str = "embedding") -> np.ndarray:
    """Validate a ``(C, H, W)`` grid and return it as a float64 numpy array (numpy: the metrics are a handful
    of reductions, and single-threaded numpy is faster for them than torch on a busy CPU)."""
    if isinstance(E, torch.Tensor):
        E = E.detach().to("cpu", torch.float64).numpy()
    if not isinstance(E, np.ndarray):
        raise WinposError(f"{name} must be a (C, H, W) tensor or array, got {type(E).__name__}")
    if E.ndim != 3:
        raise WinposError(f"{name} must have shape (C, H, W), got {tuple(E.shape)}; for a (1, C, H, W) map pass "
                          "E[0], for a flat (1, N, C) one reshape it to a grid first (see winpos.diagnostics.extract)")
    E = E.astype(np.float64, copy=False)
    if not np.isfinite(E).all():
        raise WinposError(f"{name} has {int((~np.isfinite(E)).sum())} non-finite values (NaN/inf); the checkpoint is "
                          "corrupt or training diverged: reload the weights")
    return E


def _centre(E: np.ndarray) -> np.ndarray:
    return E - E.mean(axis=(1, 2), keepdims=True)  # per-channel mean over all positions


def _tiles(E: np.ndarray, w) -> np.ndarray:
    """``(nh, nw, C, wh, ww)`` full tiles of an already validated grid (see ``window_tiles``)."""
    wh, ww = as_hw(w, "window")
    C, H, W = E.shape
    nh, nw = H // wh, W // ww
    if nh * nw < 2:
        raise WinposError(
            f"only {nh * nw} full {wh}x{ww} window(s) fit in the {H}x{W} token grid, and window similarity needs "
            f"at least 2 to compare; resize the embedding to a larger grid (e.g. naive_resize or a larger target "
            f"image) or choose a window of at most {max(H, W) // 2} tokens"
        )
    return E[:, : nh * wh, : nw * ww].reshape(C, nh, wh, nw, ww).transpose(1, 3, 0, 2, 4)


def window_tiles(E, w, centred: bool = False) -> np.ndarray:
    """Cut the full ``w x w`` windows anchored at (0, 0) out of ``E (C, H, W)``.

    Args:
        centred: subtract the per-channel mean over all H x W positions first.
    Returns:
        ``(nh, nw, C, wh, ww)`` float64 tiles, row-major over windows. Partial windows at the bottom/right edges
        are dropped: they are zero-padded in the model, so their tiles are not comparable.
    Raises:
        ValueError: fewer than 2 full windows fit.
    """
    E = as_grid(E)
    return _tiles(_centre(E) if centred else E, w)


def _constant_error(centred: bool) -> ValueError:
    what = "constant per channel" if centred else "zero"
    return ValueError(f"the embedding is {what} over the compared windows, so every cosine is undefined; an "
                      "untrained (zero-initialized) embedding has no structure to measure: load trained weights")


def _unit_rows(x: np.ndarray, centred: bool) -> tuple[np.ndarray, np.ndarray]:
    """Normalize the last axis of ``x`` in place (it must be a fresh copy); zero rows stay zero, so their
    cosines count as 0. Returns ``(x, nonzero)``; raises if every row is zero."""
    norm = np.sqrt(np.einsum("...i,...i->...", x, x))
    nonzero = norm > 0
    if not nonzero.any():
        raise _constant_error(centred)
    x /= np.where(nonzero, norm, 1.0)[..., None]
    return x, nonzero


def _mean_pair_cos(u: np.ndarray, nonzero: np.ndarray) -> np.ndarray:
    """Mean cosine over ordered pairs i != j along axis 0 of unit (or zero) rows ``u (n, ..., D)``:
    (|sum_k u_k|^2 - sum_k |u_k|^2) / (n (n - 1)), with |u_k|^2 = 1 for the nonzero rows. Returns shape ``(...)``."""
    n = u.shape[0]
    s = u.sum(axis=0)
    return (np.einsum("...i,...i->...", s, s) - nonzero.sum(axis=0)) / (n * (n - 1))


def _flat_tiles(E: np.ndarray, w) -> np.ndarray:
    """``(n, C*wh*ww)`` copy of the full tiles of a validated grid."""
    tiles = _tiles(E, w)
    flat = tiles.reshape(tiles.shape[0] * tiles.shape[1], -1)  # a copy unless the tiles were contiguous
    return flat.copy() if np.may_share_memory(flat, E) else flat  # normalized in place next: never a view of E


def _ws(E: np.ndarray, w, centred: bool) -> float:
    """WS of a validated grid; ``E`` is already centred when ``centred`` (the flag only words the error)."""
    u, nonzero = _unit_rows(_flat_tiles(E, w), centred)
    return float(_mean_pair_cos(u, nonzero))


def window_similarity(E, w, centred: bool = False) -> float:
    """WS: mean over ordered pairs i != j of full windows of cos(vec(T_i), vec(T_j)).

    Args:
        E: ``(C, H, W)`` embedding grid (tensor or array).
        w: window size (int or ``(wh, ww)``), anchored at (0, 0).
        centred: subtract the per-channel mean over all H x W positions before cutting tiles, so a constant
            offset shared by all positions does not count as window structure.
    Returns:
        WS in [-1/(n-1), 1].
    """
    E = as_grid(E)
    return _ws(_centre(E) if centred else E, w, centred)


def window_similarity_matrix(E, w, centred: bool = False, step: int = 1) -> np.ndarray:
    """``(n, n)`` cosine similarity between the flattened full windows (row-major window order).

    ``step > 1`` keeps every ``step``-th window only (``(ceil(n/step),) * 2`` result), for plotting large grids:
    the full matrix of SAM2 at 2048 px is 4096 x 4096 over 6144-dim tiles.
    """
    E = as_grid(E)
    u, _ = _unit_rows(_flat_tiles(_centre(E) if centred else E, w)[::step], centred)
    return u @ u.T


def offset_similarity_map(E, w, centred: bool = False) -> np.ndarray:
    """``(wh, ww)`` map: at each in-window offset, the mean pairwise cosine across windows of the C-vectors."""
    tiles = window_tiles(E, w, centred)
    nh, nw, C, wh, ww = tiles.shape
    u, nonzero = _unit_rows(tiles.reshape(nh * nw, C, wh, ww).transpose(0, 2, 3, 1).copy(), centred)  # (n, wh, ww, C)
    return _mean_pair_cos(u, nonzero)


def periodic_energy_ratio(E, w) -> float:
    """R_w = ||Tile(mean full tile)||^2 / ||E_c||^2 over the full-window region, with E centred per channel.

    The mean tile is the orthogonal projection of the full-window region onto w-periodic maps, so R_w is the
    fraction of (centred) energy that repeats with period w. When all tiles have equal norm,
    WS_centred = (n * R_w - 1) / (n - 1).
    """
    tiles = window_tiles(E, w, centred=True)
    if not tiles.any():
        raise _constant_error(True)
    n = tiles.shape[0] * tiles.shape[1]
    mean_tile = tiles.mean(axis=(0, 1))
    return float(n * np.sum(mean_tile * mean_tile) / np.sum(tiles * tiles))


SCAN_MAX_SIDE = 192  # report/plot scans use the top-left 192x192 tokens: >= 3x3 windows at period 64


class PeriodScan(NamedTuple):
    """WS as a function of the window period: ``periods`` (P,) ints, ``ws`` (P,) floats, and ``peak``."""

    periods: np.ndarray
    ws: np.ndarray
    peak: int


def period_scan(E, periods: Sequence[int] | None = None, centred: bool = False, tol: float = 0.01,
                max_side: int | None = None) -> PeriodScan:
    """WS(p) for square windows of period p (default p = 2 .. min(H, W) // 2).

    ``peak`` is the smallest period whose WS is within ``tol`` of the maximum: a map with period p scores as
    high at 2p, 3p, ..., so the smallest such period is the one the embedding was learned (or stretched) with.
    ``max_side`` scans only the top-left ``max_side x max_side`` tokens (centring still uses the whole grid):
    a scan costs O(C H W) per period, which is minutes for a 512x512 grid on a CPU.
    """
    E = as_grid(E)
    if centred:
        E = _centre(E)  # centre on the whole grid, then crop
    if max_side is not None:
        E = E[:, :max_side, :max_side]
    H, W = E.shape[-2:]
    if periods is None:
        periods = range(2, min(H, W) // 2 + 1)
    periods = np.asarray(list(periods), dtype=int)
    if periods.size == 0:
        raise WinposError(f"a {H}x{W} grid is too small for a period scan (needs at least 4x4 tokens); resize it first")
    ws = np.array([_ws(E, int(p), centred) for p in periods])
    return PeriodScan(periods, ws, scan_peak(periods, ws, tol))


def scan_peak(periods, ws, tol: float = 0.01) -> int:
    """The smallest period whose WS is within ``tol`` of the maximum (see ``period_scan``)."""
    periods, ws = np.asarray(periods), np.asarray(ws)
    return int(periods[np.flatnonzero(ws >= ws.max() - tol)[0]])


# ---- "after" states: naive interpolation (the bug) and abs-win (the fix), on (C, H, W) grids -----------------

def naive_resize(E, hw, antialias: bool = False) -> torch.Tensor:
    """Bicubic (``align_corners=False``) resample of ``E (C, h, w) -> (C, H, W)`` in fp32, as today's code does.

    ``antialias=False`` matches detectron2 / MAE / SAM2; ``True`` matches timm. Identity when sizes match.
    """
    E = torch.as_tensor(E)
    return resize_grid(E[None].float(), as_hw(hw, "target grid"), antialias=antialias)[0]


def abswin_embed(global_E, window_E, hw, antialias: bool = False) -> torch.Tensor:
    """Abs-win grid ``(C, H, W)`` = bicubic(``global_E (C, gh, gw)``) + ``window_E (C, w, w)`` tiled from (0, 0),
    with ceil and crop so any grid size works."""
    g = torch.as_tensor(global_E)[None].float()
    win = torch.as_tensor(window_E)[None].float()
    if g.shape[1] != win.shape[1]:
        raise WinposError(f"global ({g.shape[1]} channels) and window ({win.shape[1]} channels) embeddings differ in "
                          "width; they must come from the same model")
    return abswin_embedding(g, win, as_hw(hw, "target grid"), antialias=antialias)[0]


def abswin_parts_from_grid(E, w) -> tuple[torch.Tensor, torch.Tensor]:
    """Project a learned ``(C, H, W)`` grid onto abs-win form: ``(global (C, H, W), window (C, w, w))``.

    The window part is the mean full tile, the global part the residual; ``abswin_embed`` of the two at
    ``(H, W)`` gives back ``E`` exactly. This is what converting the checkpoint to abs-win does.
    """
    g, win = abs_to_abswin(torch.as_tensor(E)[None].float(), w)
    return g[0], win[0]
