"""LookHere (Fuller et al., NeurIPS 2024): per-head 2D fields of view plus linear distance penalties.

Each head adds a fixed bias to its attention logits: ``-m(l, h) * |k - q|`` (Euclidean distance in token
units of the current grid) when key ``k`` lies in the head's field of view (FOV) around query ``q``, and
``-inf`` otherwise. Nothing is learned and nothing is interpolated: a new grid just gets a new bias.

Geometry:

* Coordinates are ``(y, x)`` with ``y`` growing downwards, tokens flattened row-major.
* A FOV is at most two half-planes ``a*dx + b*dy >= 0`` with ``(a, b)`` in ``{-1, 0, 1}``, where
  ``dx = x_key - x_query`` and ``dy = y_key - y_query``; a ``(0, 0)`` row is no constraint (``0 >= 0``).
  Inequalities are non-strict, so boundary rays belong to both neighbouring FOVs and a query always sees
  itself.
* Masked logits are ``-inf``; the authors' code uses the finite bf16 maximum (-3.39e38) instead. Both give
  masked keys exactly zero weight here, because no row is all masked: every query sees itself, and a q-pooled
  query sees at least one of its source keys. ``-inf`` also stays a mask under any cast or rescaling (e.g.
  folding ``log2(e)`` into logits for exp2-based kernels), and a row masked entirely by mistake yields
  ``nan`` instead of silently uniform attention.

Slopes and head layouts (the authors' shorthand, winpos's spread layout, the units of ``global_slope``) are
defined in ``winpos.posemb.lookhere_layouts``; their public names are re-exported here.
"""

import torch
from torch import Tensor, nn

from winpos.cache import GridCache
from winpos.errors import WinposError
from winpos.posemb.coords import query_key_coords
from winpos.posemb.lookhere_layouts import (
    DEFAULT_GLOBAL_SLOPE,
    DEFAULT_LAYER_SLOPES,
    LAYOUTS,
    OFFICIAL_HEAD_DIRECTIONS,
    SHORTHANDS,
    SLOPE_UNITS,
    VARIANTS,
    _check_layer,
    _check_layer_slopes,
    _layer_shorthand,
    _official_layout,
    _slopes64,
    _spread_layout,
    _variant_of,
    head_fields_of_view,
    head_names,
    head_slopes,
    official_global_slope,
    resolve_head_directions,
)

__all__ = [
    "DEFAULT_GLOBAL_SLOPE", "DEFAULT_LAYER_SLOPES", "LAYOUTS", "LookHere", "OFFICIAL_HEAD_DIRECTIONS",
    "SHIFT_TABLE_BYTES", "SHORTHANDS", "SLOPE_UNITS", "VARIANTS", "fov_tile_classes", "grid_coords",
    "head_fields_of_view", "head_names", "head_slopes", "lookhere_bias", "official_global_slope",
    "resolve_head_directions",
]


def _check_hw(name: str, hw) -> tuple[int, int]:
    try:
        h, w = (int(v) for v in hw)
    except (TypeError, ValueError):
        raise WinposError(f"{name}={hw!r} must be a pair of positive integers (height, width) in tokens") from None
    if h < 1 or w < 1 or (h, w) != tuple(hw):
        raise WinposError(f"{name}={tuple(hw)!r} must be a pair of positive integers (height, width) in tokens")
    return h, w


def grid_coords(q_hw, k_hw, device=None) -> tuple[Tensor, Tensor]:
    """Token coordinates of a query grid and a key grid, in key-grid token units (``winpos.posemb.coords``).

    Args:
        q_hw: ``(Hq, Wq)`` query grid; either equal to ``k_hw`` or smaller by one integer stride ``s`` on
            both axes (Hiera q-pooling: ``Hk = s*Hq``, ``Wk = s*Wq``).
        k_hw: ``(Hk, Wk)`` key grid.

    Returns ``(q_coords, k_coords)``: fp32 ``(Hq*Wq, 2)`` and ``(Hk*Wk, 2)`` rows of ``(y, x)`` in row-major
    order. A pooled query sits at the centre of its ``s x s`` key cell: ``y = s*i + (s-1)/2``.
    """
    qh, qw = _check_hw("q_hw", q_hw)
    kh, kw = _check_hw("k_hw", k_hw)
    stride = kh // qh
    if stride < 1 or kh != stride * qh or kw != stride * qw:
        raise WinposError(
            f"query grid {qh}x{qw} is not the key grid {kh}x{kw} pooled by one integer stride on both axes; "
            "pad the key grid to a multiple of the pooling stride before attention"
        )
    return query_key_coords((qh, qw), (kh, kw), device=device)


def _check_fov_coords(fov: Tensor, q_coords: Tensor, k_coords: Tensor) -> None:
    if fov.dim() != 3 or fov.shape[1:] != (2, 2):
        raise WinposError(f"fov has shape {tuple(fov.shape)}; expected (heads, 2, 2) from head_fields_of_view")
    for name, c in (("q_coords", q_coords), ("k_coords", k_coords)):
        if c.dim() != 2 or c.shape[1] != 2:
            raise WinposError(f"{name} has shape {tuple(c.shape)}; expected (N, 2) rows of (y, x)")


def lookhere_bias(fov: Tensor, slopes: Tensor, q_coords: Tensor, k_coords: Tensor) -> Tensor:
    """Dense LookHere logit bias (the reference path; never call it on large global grids in a kernel).

    Args:
        fov: int ``(H, 2, 2)`` half-plane rows from ``head_fields_of_view``.
        slopes: ``(H,)`` distance penalties from ``head_slopes``.
        q_coords: fp32 ``(Nq, 2)`` query ``(y, x)``.
        k_coords: fp32 ``(Nk, 2)`` key ``(y, x)``.

    Returns fp32 ``(H, Nq, Nk)``: ``-slope * euclidean_distance`` inside the FOV, ``-inf`` outside.
    """
    _check_fov_coords(fov, q_coords, k_coords)
    if slopes.shape != (fov.shape[0],):
        raise WinposError(f"slopes has shape {tuple(slopes.shape)}; expected ({fov.shape[0]},), one per head")
    q = q_coords.float()
    k = k_coords.to(device=q.device, dtype=torch.float32)
    dy = k[None, :, 0] - q[:, None, 0]  # (Nq, Nk)
    dx = k[None, :, 1] - q[:, None, 1]
    if torch.compiler.is_compiling():
        # The same half-plane tests per head (exact in fp32 as well): the distinct-row search below reads the fov
        # buffer's values into Python, which a compiled graph cannot; the compiler fuses these into one pass.
        ab = fov.to(device=q.device, dtype=torch.float32)[:, :, :, None, None]  # (H, 2, 2, 1, 1)
        visible = ((ab[:, 0, 0] * dx + ab[:, 0, 1] * dy >= 0) & (ab[:, 1, 0] * dx + ab[:, 1, 1] * dy >= 0))
        bias = -slopes.to(device=q.device, dtype=torch.float32)[:, None, None] * torch.hypot(dx, dy)
        return bias.masked_fill(~visible, float("-inf"))
    # Heads share at most 9 distinct half-planes (incl. "no constraint"): test each once on (Nq, Nk).
    # With a, b in {-1, 0, 1}, a*dx + b*dy is +-dx, +-dy, +-(dx+dy) or +-(dx-dy): exact in fp32.
    rows, which = torch.unique(fov.reshape(-1, 2).cpu(), dim=0, return_inverse=True)
    forms = {(1, 0): dx, (0, 1): dy, (1, 1): dx + dy, (1, -1): dx - dy}
    halves = []
    for a, b in rows.tolist():
        if a == b == 0:
            halves.append(torch.ones_like(dx, dtype=torch.bool))
        elif (a, b) in forms:
            halves.append(forms[(a, b)] >= 0)
        else:
            halves.append(forms[(-a, -b)] <= 0)
    halves = torch.stack(halves)  # (distinct half-planes, Nq, Nk)
    which = which.view(-1, 2).to(q.device)
    visible = halves[which[:, 0]] & halves[which[:, 1]]  # (H, Nq, Nk)
    dist = torch.hypot(dx, dy)
    bias = -slopes.to(device=q.device, dtype=torch.float32)[:, None, None] * dist
    return bias.masked_fill_(~visible, float("-inf"))


def _tiles(values: Tensor, block: int, fill: float) -> Tensor:
    """Split the last dim (N) into ``ceil(N / block)`` tiles of ``block``, padding with ``fill``."""
    n = values.shape[-1]
    pad = -n % block
    if pad:
        values = torch.cat([values, values.new_full((*values.shape[:-1], pad), fill)], dim=-1)
    return values.unflatten(-1, (-1, block))


def _dominated(q1: Tensor, q2: Tensor, k1: Tensor, k2: Tensor) -> Tensor:
    """For batched tiles: is there a (query, key) pair with ``k1 >= q1`` and ``k2 >= q2``?

    ``q1, q2``: ``(T, bq)`` (absent queries: ``+inf``); ``k1, k2``: ``(T, bk)`` (absent keys: ``-inf``).
    Sorting keys by ``k1`` and taking suffix maxima of ``k2`` answers each query by one binary search,
    ``O((bq + bk) log bk)`` per tile instead of ``bq * bk``. Returns bool ``(T,)``.
    """
    k1_sorted, order = k1.sort(dim=-1)
    suffix_max = k2.gather(-1, order).flip(-1).cummax(dim=-1).values.flip(-1)
    suffix_max = torch.cat([suffix_max, suffix_max.new_full((suffix_max.shape[0], 1), float("-inf"))], dim=-1)
    first = torch.searchsorted(k1_sorted, q1.contiguous(), side="left")  # first key with k1 >= q1
    best = suffix_max.gather(-1, first)
    return (best >= q2).any(dim=-1)  # an absent query (+inf) finds no key: best is -inf


def fov_tile_classes(fov: Tensor, q_coords: Tensor, k_coords: Tensor, block_q: int, block_k: int) -> Tensor:
    """Exact visibility class of every (query tile, key tile) for block-sparse attention kernels.

    Tokens are taken in the order of ``q_coords`` / ``k_coords`` and cut into consecutive tiles of
    ``block_q`` / ``block_k``; the last tile may be short, and its missing rows/cols are not counted.

    Returns int8 ``(H, ceil(Nq/block_q), ceil(Nk/block_k))``: 0 = every pair masked (skip the tile),
    1 = every pair visible (no mask needed inside; the kernel still masks keys beyond ``Nk``), 2 = partial.

    With ``L(p) = a*x_p + b*y_p`` a constraint holds for all pairs iff ``min_k L - max_q L >= 0``, and for
    none iff ``max_k L - min_q L < 0``: both exact. Two constraints can each hold for some pair with no pair
    satisfying both, so undecided two-constraint tiles are settled exactly by a dominance search.
    """
    _check_fov_coords(fov, q_coords, k_coords)
    for name, block in (("block_q", block_q), ("block_k", block_k)):
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise WinposError(f"{name}={block!r} must be an integer >= 1 (tokens per kernel tile)")
    q = q_coords.to(torch.float32)
    k = k_coords.to(device=q.device, dtype=torch.float32)
    ab = fov.to(device=q.device, dtype=torch.float32)  # (H, 2, 2)
    # L for every head, constraint and token: (H, 2, N); coords are (y, x) and rows are (a, b).
    lq = ab[..., 0, None] * q[:, 1] + ab[..., 1, None] * q[:, 0]
    lk = ab[..., 0, None] * k[:, 1] + ab[..., 1, None] * k[:, 0]
    inf = float("inf")
    lq_lo, lq_hi = _tiles(lq, block_q, inf), _tiles(lq, block_q, -inf)  # (H, 2, nQ, bq), padded neutrally
    lk_lo, lk_hi = _tiles(lk, block_k, inf), _tiles(lk, block_k, -inf)
    q_min, q_max = lq_lo.amin(-1)[..., :, None], lq_hi.amax(-1)[..., :, None]  # (H, 2, nQ, 1)
    k_min, k_max = lk_lo.amin(-1)[..., None, :], lk_hi.amax(-1)[..., None, :]  # (H, 2, 1, nK)
    full = (k_min - q_max >= 0).all(dim=1)  # (H, nQ, nK)
    none = (k_max - q_min < 0).any(dim=1)
    classes = torch.full(full.shape, 2, dtype=torch.int8, device=q.device)
    classes[full] = 1
    classes[none] = 0
    two_constraints = (ab != 0).any(dim=-1).all(dim=-1)  # (H,)
    undecided = (classes == 2) & two_constraints[:, None, None]
    h, i, j = undecided.nonzero(as_tuple=True)
    chunk = 1 << 14  # tiles per batch: bounds memory at chunk * (bq + bk) values
    for start in range(0, h.numel(), chunk):
        hh, ii, jj = h[start:start + chunk], i[start:start + chunk], j[start:start + chunk]
        any_visible = _dominated(
            lq_lo[hh, 0, ii], lq_lo[hh, 1, ii], lk_hi[hh, 0, jj], lk_hi[hh, 1, jj]
        )
        classes[hh[~any_visible], ii[~any_visible], jj[~any_visible]] = 0
    return classes


# Largest cached displacement table of ``LookHere.bias_rows`` (84 MB for ViTDet-B's 96x96 grid at 1536^2).
SHIFT_TABLE_BYTES = 256 * 2 ** 20


class LookHere(nn.Module):
    """Fixed LookHere bias of one attention layer; caches what depends on the grid.

    Args:
        num_heads: attention heads of the layer (>= 1).
        variant: ``"180"``, ``"90"`` or ``"45"`` (default): the FOV angle of the directed heads.
        layer_index: 0-based index of the layer in the slope schedule.
        num_layers: length of the slope schedule (usually the backbone depth).
        global_slope: in the authors' units, default 2.0; see ``official_global_slope`` for when ``slope_units``
            is needed. Change it later with ``set_global_slope`` (e.g. for resolution sweeps).
        layer_slopes: ``(first, last)`` of the linear layer schedule, default ``(1.5, 0.5)``.
        head_directions: the authors' shorthand (e.g. ``"corners-triangles-none"``) or a per-layer list of them;
            replaces ``variant``.
        layout: ``"official"`` (default) or ``"spread"``; see ``winpos.posemb.lookhere_layouts``.
        slope_units: ``"official"`` or ``"paper"``: the units of ``global_slope``.
        distance, fill_with: accepted so that an authors' ``lh_config`` can be passed as keywords; only their
            defaults (``"linear"``, ``"inf"``) are implemented.

    Buffers (not saved in checkpoints: they follow from the arguments): ``fov`` int8 ``(H, 2, 2)`` (rows of
    zero-slope heads cleared), ``slopes`` fp32 ``(H,)``. What depends on the grid is cached (``winpos.cache``) under
    their fingerprints, so ``set_global_slope`` (which edits them in place) invalidates exactly what it changes.
    """

    def __init__(self, num_heads: int, variant=None, layer_index: int = 0, num_layers: int = 12,
                 global_slope=None, layer_slopes=None, head_directions=None, layout: str = "official",
                 slope_units=None, distance: str = "linear", fill_with: str = "inf"):
        super().__init__()
        if distance != "linear" or fill_with != "inf":
            raise WinposError(f"distance={distance!r}, fill_with={fill_with!r} are ablations of the authors' code that "
                              "winpos does not implement; use distance='linear', fill_with='inf'")
        _check_layer(layer_index, num_layers)
        self._official_units = layer_slopes is not None or head_directions is not None or slope_units == "official"
        self.global_slope = official_global_slope(global_slope, slope_units, self._official_units)
        self.layer_slopes = _check_layer_slopes(layer_slopes)
        self.shorthand = resolve_head_directions(num_heads, variant,
                                                 _layer_shorthand(head_directions, layer_index, num_layers), layout)
        self.num_heads, self.layout = num_heads, layout
        self.variant = (variant or "45") if head_directions is None else _variant_of(num_heads, self.shorthand)
        self.layer_index, self.num_layers = layer_index, num_layers
        if self.shorthand is None:
            self._planes, self._head_slopes = _spread_layout(num_heads, self.variant)
        else:
            self._planes, self._head_slopes = _official_layout(self.shorthand, num_heads)
        self._fov_all = head_fields_of_view(num_heads, head_directions=self.shorthand) if self.shorthand else \
            head_fields_of_view(num_heads, self.variant, layout="spread")
        slopes = self._slopes(self.global_slope)
        self.register_buffer("fov", self._visible_fov(slopes), persistent=False)
        self.register_buffer("slopes", slopes.float(), persistent=False)
        # Per grid (winpos.cache), keyed on the fov and slopes buffers: set_global_slope's in-place edits of them
        # invalidate what they change. One dense bias and one displacement table (both can be large), 8 tile maps.
        self._bias_cache, self._shift_cache, self._tile_cache = GridCache(1), GridCache(1), GridCache(8)

    def _slopes(self, global_slope: float) -> Tensor:
        """The heads' slopes in float64, checked in float32, the dtype the bias is built in: a slope that overflows
        there is inf, and inf * distance 0 makes the whole output NaN."""
        values = _slopes64(self._head_slopes, self.layer_index, self.num_layers, global_slope, self.layer_slopes)
        slopes = torch.tensor(values, dtype=torch.float64)
        # Checked on the CPU: a model built under torch.device("meta") (parameter counts) has no values to read.
        if not torch.isfinite(torch.tensor(values, dtype=torch.float64, device="cpu").float()).all():
            top = float(torch.tensor(values, dtype=torch.float64, device="cpu").max())
            limit = global_slope * torch.finfo(torch.float32).max / top
            raise WinposError(f"global_slope={global_slope:g} gives head slopes up to {top:.3g}, beyond float32 (max "
                              f"{torch.finfo(torch.float32).max:.3g}), where the attention bias is computed; use "
                              f"global_slope below {limit:.3g} (the authors use 2.0)")
        return slopes

    def slope_values(self) -> list[float]:
        """The heads' distance penalties per token of distance, as numbers (also for a module built on the meta
        device, whose ``slopes`` buffer holds none)."""
        return _slopes64(self._head_slopes, self.layer_index, self.num_layers, self.global_slope, self.layer_slopes)

    def _visible_fov(self, slopes64: Tensor) -> Tensor:
        """The layout's FOVs with the rows of zero-slope heads cleared (no penalty means no mask, as in the authors'
        code)."""
        return self._fov_all * (slopes64 != 0).to(torch.int8)[:, None, None]

    def set_global_slope(self, global_slope: float, slope_units=None) -> None:
        """Rescale every head's slope to ``global_slope`` and drop cached biases (and tile classes when a slope
        turns 0 or stops being 0). Units as in ``official_global_slope``; a module built in the authors' units
        (``layer_slopes``, ``head_directions`` or ``slope_units="official"``) reads a bare number in them."""
        value = official_global_slope(global_slope, slope_units, self._official_units)
        slopes = self._slopes(value)
        fov = self._visible_fov(slopes).to(self.fov.device)
        if not torch.equal(fov, self.fov):
            self.fov.copy_(fov)  # tile classes depend on fov only: kept while it stays the same
        self.slopes.copy_(slopes.float())
        self.global_slope = value

    def dense_bytes(self, q_hw, k_hw) -> int:
        """Bytes of the dense fp32 bias for these grids (what ``bias`` would build and cache)."""
        (qh, qw), (kh, kw) = _check_hw("q_hw", q_hw), _check_hw("k_hw", k_hw)
        return self.num_heads * qh * qw * kh * kw * 4

    def bias_rows(self, q_hw, k_hw, start: int, stop: int, out: Tensor | None = None) -> Tensor:
        """Rows ``start:stop`` (queries, row-major) of the dense bias, ``(H, stop - start, Hk*Wk)``, written into
        ``out`` when given. For grids whose dense bias is too large to keep (see
        ``winpos.attention.bias.LOOKHERE_CACHE_BYTES``). Unpooled grids copy the rows out of a cached displacement
        table (the bias depends only on key - query): one pass over the rows instead of a dozen."""
        q_hw, k_hw = _check_hw("q_hw", q_hw), _check_hw("k_hw", k_hw)
        rows, n_q = stop - start, q_hw[0] * q_hw[1]
        if not 0 <= start < stop <= n_q:
            raise WinposError(f"query rows {start}:{stop} are not a nonempty range inside the {n_q} queries of {q_hw}")
        if out is not None and out.shape != (self.num_heads, rows, k_hw[0] * k_hw[1]):
            raise WinposError(f"out has shape {tuple(out.shape)}; expected {(self.num_heads, rows, k_hw[0] * k_hw[1])}")
        table = self._shift_table(k_hw) if q_hw == k_hw else None
        if table is None:
            q, k = grid_coords(q_hw, k_hw, device=self.slopes.device)
            bias = lookhere_bias(self.fov, self.slopes.float(), q[start:stop], k)
            return bias if out is None else out.copy_(bias)
        H, W = k_hw
        if out is None:
            out = torch.empty(self.num_heads, rows, H * W, dtype=torch.float32, device=self.slopes.device)
        n = start
        while n < stop:  # one query row i (or the part of it inside [start, stop)) at a time
            i, j0 = divmod(n, W)
            j1 = min(W, j0 + stop - n)
            # table[h, a, j, x] = bias of key (a - (H-1) + i, x) for query (i, j): rows a = H-1-i ... 2H-2-i.
            piece = table[:, H - 1 - i: 2 * H - 1 - i, j0:j1].transpose(1, 2)  # (heads, j, y, x)
            out[:, n - start: n - start + j1 - j0].view(self.num_heads, j1 - j0, H, W).copy_(piece)
            n += j1 - j0
        return out

    def _shift_table(self, k_hw) -> Tensor | None:
        """``(heads, 2H-1, W, W)``: entry ``[h, a, j, x]`` is head h's bias from a query in column j to a key in
        column x, ``a - (H-1)`` rows below it, computed by ``lookhere_bias`` itself (so rows copied from it equal
        the dense bias exactly). Cached for the last grid; None when larger than SHIFT_TABLE_BYTES."""
        H, W = k_hw
        if self.num_heads * (2 * H - 1) * W * W * 4 > SHIFT_TABLE_BYTES:
            return None

        def build():
            dev = self.slopes.device
            dy = torch.arange(-(H - 1), H, device=dev, dtype=torch.float32)
            dx = torch.arange(-(W - 1), W, device=dev, dtype=torch.float32)
            shifts = torch.stack(torch.meshgrid(dy, dx, indexing="ij"), dim=-1).reshape(-1, 2)
            origin = torch.zeros(1, 2, device=dev)
            flat = lookhere_bias(self.fov, self.slopes.float(), origin, shifts).view(self.num_heads, 2 * H - 1, 2 * W - 1)
            cols = torch.arange(W, device=dev)
            return flat[:, :, cols[None, :] - cols[:, None] + W - 1].contiguous()

        return self._shift_cache.get(tuple(k_hw), build, self.fov, self.slopes)

    def bias(self, q_hw, k_hw) -> Tensor:
        """Dense fp32 bias ``(H, Hq*Wq, Hk*Wk)`` for row-major grids (see ``grid_coords`` for pooling).

        Cached for the last grid; a different grid rebuilds it.
        """
        q_hw, k_hw = _check_hw("q_hw", q_hw), _check_hw("k_hw", k_hw)

        def build():
            q, k = grid_coords(q_hw, k_hw, device=self.slopes.device)
            return lookhere_bias(self.fov, self.slopes.float(), q, k)

        return self._bias_cache.get((q_hw, k_hw), build, self.fov, self.slopes)

    def tile_classes(self, q_hw, k_hw, block_q: int, block_k: int) -> Tensor:
        """int8 ``(H, nQblocks, nKblocks)`` from ``fov_tile_classes`` on row-major grids; cached (LRU)."""
        q_hw, k_hw = _check_hw("q_hw", q_hw), _check_hw("k_hw", k_hw)

        def build():
            q, k = grid_coords(q_hw, k_hw, device=self.fov.device)
            return fov_tile_classes(self.fov, q, k, block_q, block_k)

        return self._tile_cache.get((q_hw, k_hw, block_q, block_k), build, self.fov)

    def extra_repr(self) -> str:
        layout = (f"head_directions={self.shorthand!r}" if self.shorthand
                  else f"layout='spread', variant={self.variant!r}")
        return (f"num_heads={self.num_heads}, {layout}, layer_index={self.layer_index}, num_layers={self.num_layers}, "
                f"global_slope={self.global_slope} (authors' units), layer_slopes={self.layer_slopes}, "
                f"heads={','.join('&'.join(p) if p else 'none' for p in self._planes)}")
