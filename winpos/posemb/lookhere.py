"""LookHere (Fuller et al., NeurIPS 2024): per-head 2D fields of view plus linear distance penalties.

Each head adds a fixed bias to its attention logits: ``-m(l, h) * |k - q|`` (Euclidean distance in token
units of the current grid) when key ``k`` lies in the head's field of view (FOV) around query ``q``, and
``-inf`` otherwise. Nothing is learned and nothing is interpolated: a new grid just gets a new bias.

Conventions (reference /work/shared/reference/lookhere.md, sections 2.3-2.5):

* Coordinates are ``(y, x)`` with ``y`` growing downwards, tokens flattened row-major.
* A FOV is at most two half-planes ``a*dx + b*dy >= 0`` with ``(a, b)`` in ``{-1, 0, 1}``, where
  ``dx = x_key - x_query`` and ``dy = y_key - y_query``; a ``(0, 0)`` row is no constraint (``0 >= 0``).
  Inequalities are non-strict, so boundary rays belong to both neighbouring FOVs and a query always sees
  itself.
* Masked logits are ``-inf``; the official code uses the finite bf16 maximum (-3.39e38) instead. Both give
  masked keys exactly zero weight here, because no row is all masked: every query sees itself, and a q-pooled
  query sees at least one of its source keys. ``-inf`` also stays a mask under any cast or rescaling (e.g.
  folding ``log2(e)`` into logits for exp2-based kernels), and a row masked entirely by mistake yields
  ``nan`` instead of silently uniform attention.

Head layout (generalises the paper's 12-head layout, section 2.4):

* ``num_undirected = max(1, num_heads // 3)`` heads are undirected and come last (12 heads -> 8 directed +
  4 undirected, exactly the paper; 6 heads -> 4 + 2, the official code's split; 1 head -> undirected only,
  since a lone directed head would never see half of the image).
* The ``num_directed`` directed heads take whole rounds of the variant's 8 directions in the paper's order;
  the remaining ``r < 8`` heads take the first ``r`` directions of a *spread order* chosen so that every
  prefix is spread around the circle (2 heads look opposite ways, 4 heads are 90 degrees apart).
* Slopes in paper units: ``m(l, h) = s_g * s_l(l) * s_h(h)``; ``s_l`` falls linearly from 1.5 (first layer)
  to 0.5 (last layer), and is 1.5 for a single-layer model (``linspace(1.5, 0.5, 1)``, as the official code
  computes it); ``s_h = 1`` for directed heads and ``2**-(2k+1)`` for the k-th undirected head, i.e. the
  paper's (1/2, 1/8, 1/32, 1/128), continued geometrically beyond four undirected heads.
"""

from collections import OrderedDict

import torch
from torch import Tensor, nn

VARIANTS = ("180", "90", "45")

# Half-planes P(a, b) = {a*dx + b*dy >= 0}, named by the direction they face (y down, so "U" is dy <= 0).
_HALF_PLANES = {
    "R": (1, 0), "L": (-1, 0), "D": (0, 1), "U": (0, -1),
    "UR": (1, -1), "UL": (-1, -1), "DR": (1, 1), "DL": (-1, 1),
}

# The 8 directed FOVs of each variant in the paper's head order (reference table 2.4 / pseudocode 2.9).
_DIRECTED = {
    # 4 cardinal half-planes, then 4 diagonal half-planes.
    "180": (("U",), ("D",), ("L",), ("R",), ("UR",), ("UL",), ("DR",), ("DL",)),
    # 4 quadrants, then 4 cones centred on up, down, left, right.
    "90": (("U", "L"), ("U", "R"), ("D", "L"), ("D", "R"),
           ("UR", "UL"), ("DR", "DL"), ("UL", "DL"), ("UR", "DR")),
    # 8 wedges: N->NW, S->SW, W->NW, E->NE, N->NE, S->SE, W->SW, E->SE.
    "45": (("UR", "L"), ("DR", "L"), ("DL", "U"), ("DR", "U"),
           ("UL", "R"), ("DL", "R"), ("UL", "D"), ("UR", "D")),
}

# Order in which a partial round (< 8 directed heads) picks directions: each prefix is spread out
# (indices into _DIRECTED[variant]).
_SPREAD_ORDER = {
    "180": (0, 1, 2, 3, 4, 7, 5, 6),  # U, D, L, R, then opposite diagonals UR, DL, UL, DR
    "90": (0, 3, 1, 2, 4, 5, 6, 7),   # quadrants UL, DR, UR, DL, then cones
    "45": (0, 5, 3, 6, 4, 1, 2, 7),   # wedges centred at 112.5, 292.5, 22.5, 202.5, 67.5, 247.5, 157.5, 337.5
}

_TILE_CACHE_SIZE = 8


def _check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(
            f"variant={variant!r} is not a LookHere variant; choose one of {VARIANTS} "
            "(the field-of-view angle of the directed heads, in degrees, as a string)"
        )


def _check_num_heads(num_heads: int) -> None:
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"num_heads={num_heads!r} must be an integer >= 1")


def _check_hw(name: str, hw) -> tuple[int, int]:
    try:
        h, w = (int(v) for v in hw)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={hw!r} must be a pair of positive integers (height, width) in tokens") from None
    if h < 1 or w < 1 or (h, w) != tuple(hw):
        raise ValueError(f"{name}={tuple(hw)!r} must be a pair of positive integers (height, width) in tokens")
    return h, w


def _layout(num_heads: int, variant: str) -> list[tuple[str, ...]]:
    """Per-head tuple of half-plane names; () marks an undirected head."""
    _check_num_heads(num_heads)
    _check_variant(variant)
    num_undirected = max(1, num_heads // 3)
    num_directed = num_heads - num_undirected
    directions = _DIRECTED[variant]
    full_rounds, rest = divmod(num_directed, 8)
    picks = list(range(8)) * full_rounds + list(_SPREAD_ORDER[variant][:rest])
    return [directions[i] for i in picks] + [()] * num_undirected


def head_names(num_heads: int, variant: str) -> tuple[str, ...]:
    """Human-readable FOV of each head, e.g. ``('UR&L', ..., 'none')`` (for logs and plots)."""
    return tuple("&".join(planes) if planes else "none" for planes in _layout(num_heads, variant))


def head_fields_of_view(num_heads: int, variant: str) -> Tensor:
    """Each head's field of view as two half-plane rows.

    Returns int8 ``(num_heads, 2, 2)``: row ``r`` of head ``h`` is ``(a, b)`` meaning
    ``a*dx + b*dy >= 0`` with ``dx = x_key - x_query``, ``dy = y_key - y_query`` (y down); ``(0, 0)`` means
    no constraint, so undirected heads are all zeros. See the module docstring for the head layout.
    """
    fov = torch.zeros(num_heads, 2, 2, dtype=torch.int8)
    for h, planes in enumerate(_layout(num_heads, variant)):
        for r, name in enumerate(planes):
            fov[h, r] = torch.tensor(_HALF_PLANES[name], dtype=torch.int8)
    return fov


def head_slopes(num_heads: int, variant: str, layer_index: int, num_layers: int,
                global_slope: float = 1.0) -> Tensor:
    """Distance penalty per head, ``m(l, h) = s_g * s_l(l) * s_h(h)`` in paper units.

    Args:
        num_heads: heads of this layer (>= 1).
        variant: one of ``VARIANTS``.
        layer_index: 0-based index of this layer among ``num_layers``.
        num_layers: layers sharing the linear schedule ``s_l`` (1.5 at the first, 0.5 at the last; 1.5 if
            there is only one).
        global_slope: ``s_g`` (1.0 in the paper; lower it when extrapolating to larger grids, 0 gives
            masks only).

    Returns fp32 ``(num_heads,)``.
    """
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise ValueError(f"num_layers={num_layers!r} must be an integer >= 1")
    if isinstance(layer_index, bool) or not isinstance(layer_index, int) or not 0 <= layer_index < num_layers:
        raise ValueError(
            f"layer_index={layer_index!r} is out of range for num_layers={num_layers}; "
            f"use a 0-based index in [0, {num_layers - 1}]"
        )
    global_slope = float(global_slope)
    if not global_slope >= 0.0 or global_slope == float("inf"):
        raise ValueError(f"global_slope={global_slope!r} must be a finite number >= 0 (the paper uses 1.0)")
    layout = _layout(num_heads, variant)
    s_l = 1.5 if num_layers == 1 else 1.5 - layer_index / (num_layers - 1)
    s_h, k = [], 0
    for planes in layout:
        if planes:
            s_h.append(1.0)
        else:
            s_h.append(2.0 ** -(2 * k + 1))
            k += 1
    return torch.tensor([global_slope * s_l * s for s in s_h], dtype=torch.float64).float()


def grid_coords(q_hw, k_hw, device=None) -> tuple[Tensor, Tensor]:
    """Token coordinates of a query grid and a key grid, in key-grid token units.

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
        raise ValueError(
            f"query grid {qh}x{qw} is not the key grid {kh}x{kw} pooled by one integer stride on both axes; "
            "pad the key grid to a multiple of the pooling stride before attention"
        )

    def coords(h: int, w: int, s: int) -> Tensor:
        offset = (s - 1) / 2
        y = torch.arange(h, device=device, dtype=torch.float32) * s + offset
        x = torch.arange(w, device=device, dtype=torch.float32) * s + offset
        return torch.stack(torch.meshgrid(y, x, indexing="ij"), dim=-1).reshape(h * w, 2)

    return coords(qh, qw, stride), coords(kh, kw, 1)


def _check_fov_coords(fov: Tensor, q_coords: Tensor, k_coords: Tensor) -> None:
    if fov.dim() != 3 or fov.shape[1:] != (2, 2):
        raise ValueError(f"fov has shape {tuple(fov.shape)}; expected (heads, 2, 2) from head_fields_of_view")
    for name, c in (("q_coords", q_coords), ("k_coords", k_coords)):
        if c.dim() != 2 or c.shape[1] != 2:
            raise ValueError(f"{name} has shape {tuple(c.shape)}; expected (N, 2) rows of (y, x)")


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
        raise ValueError(f"slopes has shape {tuple(slopes.shape)}; expected ({fov.shape[0]},), one per head")
    q = q_coords.float()
    k = k_coords.to(device=q.device, dtype=torch.float32)
    dy = k[None, :, 0] - q[:, None, 0]  # (Nq, Nk)
    dx = k[None, :, 1] - q[:, None, 1]
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
            raise ValueError(f"{name}={block!r} must be an integer >= 1 (tokens per kernel tile)")
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
        variant: ``"180"``, ``"90"`` or ``"45"``: the FOV angle of the directed heads.
        layer_index: 0-based index of the layer in the slope schedule.
        num_layers: length of the slope schedule (usually the backbone depth).
        global_slope: ``s_g``; change it later with ``set_global_slope`` (e.g. for resolution sweeps).

    Buffers (not saved in checkpoints: they follow from the arguments): ``fov`` int8 ``(H, 2, 2)``,
    ``slopes`` fp32 ``(H,)``. Do not edit them in place; caches would go stale.
    """

    def __init__(self, num_heads: int, variant: str = "45", layer_index: int = 0, num_layers: int = 12,
                 global_slope: float = 1.0):
        super().__init__()
        self.num_heads, self.variant = num_heads, variant
        self.layer_index, self.num_layers = layer_index, num_layers
        self.global_slope = float(global_slope)
        self.register_buffer("fov", head_fields_of_view(num_heads, variant), persistent=False)
        self.register_buffer(
            "slopes", head_slopes(num_heads, variant, layer_index, num_layers, global_slope), persistent=False
        )
        self._bias_cache: tuple[tuple, Tensor] | None = None  # one entry: a dense bias can be large
        self._tile_cache: OrderedDict[tuple, Tensor] = OrderedDict()
        self._shift_cache: tuple[tuple, Tensor] | None = None

    def set_global_slope(self, global_slope: float) -> None:
        """Rescale every head's slope to ``global_slope`` (paper units) and drop cached biases."""
        slopes = head_slopes(self.num_heads, self.variant, self.layer_index, self.num_layers, global_slope)
        self.slopes.copy_(slopes)
        self.global_slope = float(global_slope)
        self._bias_cache = self._shift_cache = None

    def dense_bytes(self, q_hw, k_hw) -> int:
        """Bytes of the dense fp32 bias for these grids (what ``bias`` would build and cache)."""
        (qh, qw), (kh, kw) = _check_hw("q_hw", q_hw), _check_hw("k_hw", k_hw)
        return self.num_heads * qh * qw * kh * kw * 4

    def bias_rows(self, q_hw, k_hw, start: int, stop: int, out: Tensor | None = None) -> Tensor:
        """Rows ``start:stop`` (queries, row-major) of the dense bias, ``(H, stop - start, Hk*Wk)``, written into
        ``out`` when given. For grids whose dense bias is too large to keep (see
        ``winpos.attention.LOOKHERE_CACHE_BYTES``). Unpooled grids copy the rows out of a cached displacement
        table (the bias depends only on key - query): one pass over the rows instead of a dozen."""
        q_hw, k_hw = _check_hw("q_hw", q_hw), _check_hw("k_hw", k_hw)
        rows, n_q = stop - start, q_hw[0] * q_hw[1]
        if not 0 <= start < stop <= n_q:
            raise ValueError(f"query rows {start}:{stop} are not a nonempty range inside the {n_q} queries of {q_hw}")
        if out is not None and out.shape != (self.num_heads, rows, k_hw[0] * k_hw[1]):
            raise ValueError(f"out has shape {tuple(out.shape)}; expected {(self.num_heads, rows, k_hw[0] * k_hw[1])}")
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
        key = (tuple(k_hw), self.slopes.device)  # set_global_slope drops it, like the dense cache
        if self._shift_cache is None or self._shift_cache[0] != key:
            self._shift_cache = None
            dev = self.slopes.device
            dy = torch.arange(-(H - 1), H, device=dev, dtype=torch.float32)
            dx = torch.arange(-(W - 1), W, device=dev, dtype=torch.float32)
            shifts = torch.stack(torch.meshgrid(dy, dx, indexing="ij"), dim=-1).reshape(-1, 2)
            origin = torch.zeros(1, 2, device=dev)
            flat = lookhere_bias(self.fov, self.slopes.float(), origin, shifts).view(self.num_heads, 2 * H - 1, 2 * W - 1)
            cols = torch.arange(W, device=dev)
            self._shift_cache = (key, flat[:, :, cols[None, :] - cols[:, None] + W - 1].contiguous())
        return self._shift_cache[1]

    def bias(self, q_hw, k_hw) -> Tensor:
        """Dense fp32 bias ``(H, Hq*Wq, Hk*Wk)`` for row-major grids (see ``grid_coords`` for pooling).

        Cached for the last ``(q_hw, k_hw, device)``; a different grid rebuilds it.
        """
        key = (_check_hw("q_hw", q_hw), _check_hw("k_hw", k_hw), self.slopes.device)
        if self._bias_cache is None or self._bias_cache[0] != key:
            self._bias_cache = None  # free the old grid's bias before building the new one
            q, k = grid_coords(key[0], key[1], device=self.slopes.device)
            self._bias_cache = (key, lookhere_bias(self.fov, self.slopes.float(), q, k))
        return self._bias_cache[1]

    def tile_classes(self, q_hw, k_hw, block_q: int, block_k: int) -> Tensor:
        """int8 ``(H, nQblocks, nKblocks)`` from ``fov_tile_classes`` on row-major grids; cached (LRU)."""
        key = (_check_hw("q_hw", q_hw), _check_hw("k_hw", k_hw), block_q, block_k, self.fov.device)
        if key in self._tile_cache:
            self._tile_cache.move_to_end(key)
            return self._tile_cache[key]
        q, k = grid_coords(key[0], key[1], device=self.fov.device)
        classes = fov_tile_classes(self.fov, q, k, block_q, block_k)
        self._tile_cache[key] = classes
        if len(self._tile_cache) > _TILE_CACHE_SIZE:
            self._tile_cache.popitem(last=False)
        return classes

    def extra_repr(self) -> str:
        return (f"num_heads={self.num_heads}, variant={self.variant!r}, layer_index={self.layer_index}, "
                f"num_layers={self.num_layers}, global_slope={self.global_slope}, "
                f"heads={','.join(head_names(self.num_heads, self.variant))}")
