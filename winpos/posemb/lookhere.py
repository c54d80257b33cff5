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

Slopes, in the units of the authors' code (the ``lh_config`` stored in their checkpoints):

* ``m(l, h) = global_slope * s_l(l) * s_h(h)``. ``global_slope`` defaults to 2.0. ``s_l`` falls linearly from
  ``layer_slopes[0]`` (1.5) at the first layer to ``layer_slopes[1]`` (0.5) at the last, and is
  ``layer_slopes[0]`` for a single layer. ``s_h`` is given per group of heads (consecutive heads of the same
  shorthand part, below): a directed group of ``4n`` heads gets 1/2 for its first four heads, 1/4 for the next
  four, and so on; an undirected group gets 1/4, 1/16, 1/64, 1/256 (each repeated ``n`` times for ``4n`` heads;
  1/4, 1/16 for a group of two).
* The paper's text states the same penalties in "paper units", which are half of ``global_slope``: ``s_g = 1``,
  directed heads 1, undirected heads 1/2, 1/8, 1/32, 1/128. winpos read ``global_slope`` in paper units until it
  adopted the authors' units, so a bare number is ambiguous: ``global_slope`` given without ``slope_units`` is
  read in the authors' units only next to their other config keys (``layer_slopes`` / ``head_directions``);
  otherwise it is refused until ``slope_units`` says ``"official"`` or ``"paper"`` (which is converted, x2).
* A head whose slope is 0 (``global_slope=0``, or a layer slope of 0) has no penalty and no mask: its bias is all
  zeros, as in the authors' code (which multiplies the infinite mask by zero and turns the NaN into 0).

Head layouts:

* ``head_directions`` is the authors' dash-separated shorthand, one part per group of heads. Parts:
  ``halves`` (half-planes U, D, L, R), ``diagonals`` (half-planes facing UR, UL, DR, DL), ``corners`` (quadrants
  UL, UR, DL, DR), ``triangles`` (90-degree cones up, down, left, right), ``eighths1`` (45-degree wedges N->NW,
  S->SW, W->NW, E->NE), ``eighths2`` (N->NE, S->SE, W->SW, E->SE), ``none`` (four undirected heads). Parts fill
  the heads as the authors' code does: 12 heads take three parts of 4, or two parts of 8 and 4; 16 heads take
  8 + 4 + 4 (the first part twice; its second four heads get half the slope), two parts of 8, or four parts of
  4; 6 heads take four heads of the first part and two of the second, which must be ``none``; a single part
  fills any multiple of 4 heads. Other combinations have no layout there and are refused.
* ``variant`` names the authors' three configurations: ``"180"`` = ``halves-diagonals-none``, ``"90"`` =
  ``corners-triangles-none``, ``"45"`` = ``eighths1-eighths2-none`` (with 6 heads: the first part, then
  ``none``).
* ``layout="official"`` (the default) uses the variant's shorthand for 6, 12 and 16 heads. Other head counts have
  no layout in the authors' code and get the spread layout.
* ``layout="spread"`` is winpos's own layout for any head count, kept for the head counts the authors' code does
  not lay out (e.g. Hiera's 1, 2, 4, 8 and 32 heads) and for models trained with winpos before it adopted the
  authors' 6- and 16-head layouts (the backbone recipes still use it, so their results stay the same); at 12 heads
  it equals the official layout. ``num_undirected = max(1, num_heads // 3)`` heads are undirected and come last.
  The directed heads take whole rounds of the variant's 8 directions in the official order; the remaining
  ``r < 8`` heads take the first ``r`` directions of a spread order in which every prefix is spread around the
  circle (2 heads look opposite ways, 4 heads are 90 degrees apart). Directed heads get ``s_h = 1/2`` and the
  k-th undirected head ``2**-(2k+2)`` (1/4, 1/16, 1/64, 1/256, continued geometrically).
"""

import math
from collections import OrderedDict
from itertools import groupby

import torch
from torch import Tensor, nn

VARIANTS = ("180", "90", "45")
LAYOUTS = ("official", "spread")
SLOPE_UNITS = ("official", "paper")
DEFAULT_GLOBAL_SLOPE = 2.0  # the authors' value (paper units: 1.0)
DEFAULT_LAYER_SLOPES = (1.5, 0.5)

# Half-planes P(a, b) = {a*dx + b*dy >= 0}, named by the direction they face (y down, so "U" is dy <= 0).
_HALF_PLANES = {
    "R": (1, 0), "L": (-1, 0), "D": (0, 1), "U": (0, -1),
    "UR": (1, -1), "UL": (-1, -1), "DR": (1, 1), "DL": (-1, 1),
}

# The authors' shorthand parts: four heads each, as intersections of the half-planes above; () is undirected.
SHORTHANDS = {
    "halves": (("U",), ("D",), ("L",), ("R",)),
    "diagonals": (("UR",), ("UL",), ("DR",), ("DL",)),
    "corners": (("U", "L"), ("U", "R"), ("D", "L"), ("D", "R")),
    "triangles": (("UR", "UL"), ("DR", "DL"), ("UL", "DL"), ("UR", "DR")),
    "eighths1": (("UR", "L"), ("DR", "L"), ("DL", "U"), ("DR", "U")),
    "eighths2": (("UL", "R"), ("DL", "R"), ("UL", "D"), ("UR", "D")),
    "none": ((), (), (), ()),
}
OFFICIAL_HEAD_DIRECTIONS = {"180": "halves-diagonals-none", "90": "corners-triangles-none",
                            "45": "eighths1-eighths2-none"}
_UNDIRECTED_SLOPES = (1 / 4, 1 / 16, 1 / 64, 1 / 256)
# Heads per part in the authors' code, by (number of parts, heads); 6 heads and single parts are handled apart.
_OFFICIAL_FILL = {(2, 12): (8, 4), (2, 16): (8, 8), (3, 12): (4, 4, 4), (3, 16): (8, 4, 4), (4, 16): (4, 4, 4, 4)}

# Spread layout: a partial round (< 8 directed heads) picks directions in this order, each prefix spread out
# (indices into the variant's 8 official directions, the first two parts of its shorthand).
_SPREAD_ORDER = {
    "180": (0, 1, 2, 3, 4, 7, 5, 6),  # U, D, L, R, then opposite diagonals UR, DL, UL, DR
    "90": (0, 3, 1, 2, 4, 5, 6, 7),   # quadrants UL, DR, UR, DL, then cones
    "45": (0, 5, 3, 6, 4, 1, 2, 7),   # wedges centred at 112.5, 292.5, 22.5, 202.5, 67.5, 247.5, 157.5, 337.5
}

_TILE_CACHE_SIZE = 8


def _check_variant(variant) -> None:
    if variant not in VARIANTS:
        raise ValueError(
            f"variant={variant!r} is not a LookHere variant; choose one of {VARIANTS} "
            "(the field-of-view angle of the directed heads, in degrees, as a string)"
        )


def _check_num_heads(num_heads) -> None:
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


def _check_slope(name: str, value) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r} must be a finite number >= 0") from None
    if not 0.0 <= value < math.inf:
        raise ValueError(f"{name}={value!r} must be a finite number >= 0 (the authors use global_slope=2.0, "
                         "layer_slopes=(1.5, 0.5))")
    return value


def official_global_slope(global_slope=None, slope_units=None, official_keys: bool = False) -> float:
    """``global_slope`` in the authors' units (see the module docstring).

    Args:
        global_slope: a number, or None for the default 2.0 (the paper's ``s_g = 1``).
        slope_units: ``"official"`` (the authors' code), ``"paper"`` (the paper's text and the former winpos
            meaning: half the official number, converted here exactly), or None.
        official_keys: the number came with the authors' other config keys, which settles its units.
    """
    if slope_units is not None and slope_units not in SLOPE_UNITS:
        raise ValueError(f"slope_units={slope_units!r} is not a unit of LookHere slopes; choose one of {SLOPE_UNITS}")
    if global_slope is None:
        return DEFAULT_GLOBAL_SLOPE
    value = _check_slope("global_slope", global_slope)
    if slope_units == "paper":
        return 2.0 * value
    if slope_units is None and not official_keys:
        raise ValueError(
            f"global_slope={global_slope!r} has no units: winpos used to read it in paper units, half the authors' "
            f"code (whose 2.0 was winpos's 1.0); pass slope_units='official' to mean the code's number or "
            f"slope_units='paper' to convert a value written for the former winpos"
        )
    return value


def _check_layer_slopes(layer_slopes) -> tuple[float, float]:
    if layer_slopes is None:
        return DEFAULT_LAYER_SLOPES
    if isinstance(layer_slopes, Tensor):
        layer_slopes = layer_slopes.tolist()
    try:
        first, last = layer_slopes
    except (TypeError, ValueError):
        raise ValueError(f"layer_slopes={layer_slopes!r} must be two numbers (first layer, last layer), "
                         "e.g. the authors' (1.5, 0.5)") from None
    return _check_slope("layer_slopes[0]", first), _check_slope("layer_slopes[1]", last)


def _layer_shorthand(head_directions, layer_index: int, num_layers: int):
    """The shorthand of one layer: ``head_directions`` itself, or its ``layer_index`` entry when it is a per-layer
    list (as the authors' code accepts)."""
    if head_directions is None or isinstance(head_directions, str):
        return head_directions
    if not isinstance(head_directions, (list, tuple)) or not all(isinstance(s, str) for s in head_directions):
        raise ValueError(f"head_directions={head_directions!r} must be a shorthand string such as "
                         "'corners-triangles-none' or a list of them, one per layer")
    if len(head_directions) != num_layers:
        raise ValueError(f"head_directions lists {len(head_directions)} shorthands but the model has {num_layers} "
                         "layers; give one per layer or a single string for all")
    return head_directions[layer_index]


def _official_layout(shorthand: str, num_heads: int):
    """(per-head half-plane names, per-head s_h) of an authors' shorthand, filled as their code fills heads."""
    parts = shorthand.split("-")
    unknown = [p for p in parts if p not in SHORTHANDS]
    if unknown:
        raise ValueError(f"head_directions={shorthand!r} has the part {unknown[0]!r}, which winpos does not "
                         f"implement; use parts from {', '.join(SHORTHANDS)} joined by '-'")
    if num_heads == 6 and len(parts) >= 2:
        fill = [(parts[0], 4), (parts[1], 2)]
    elif len(parts) == 1 and num_heads % 4 == 0:
        fill = [(parts[0], num_heads)]
    elif (len(parts), num_heads) in _OFFICIAL_FILL:
        fill = list(zip(parts, _OFFICIAL_FILL[(len(parts), num_heads)]))
    else:
        raise ValueError(
            f"head_directions={shorthand!r} has no layout for {num_heads} heads in the authors' code (it fills 6, "
            f"12 or 16 heads, or a multiple of 4 with one part); give a shorthand for {num_heads} heads or use "
            "layout='spread'"
        )
    planes, names = [], []
    for part, count in fill:
        planes += [SHORTHANDS[part][i % 4] for i in range(count)]
        names += [part] * count
    slopes = []
    for part, group in groupby(names):
        n = len(list(group))
        if part == "none" and (n == 2 or n % 4 == 0):
            slopes += list(_UNDIRECTED_SLOPES[:2]) if n == 2 else [_UNDIRECTED_SLOPES[j // (n // 4)] for j in range(n)]
        elif part != "none" and n % 4 == 0:
            slopes += [0.5 ** (j // 4 + 1) for j in range(n)]
        else:
            hint = f"'{parts[0]}-none'" if num_heads == 6 else "groups of 4 heads"
            raise ValueError(
                f"head_directions={shorthand!r} makes a group of {n} {part!r} heads, which the authors' code cannot "
                f"give slopes to (directed groups take multiples of 4 heads, undirected ones 2 or multiples of 4); "
                f"use {hint}"
            )
    return planes, slopes


def _spread_layout(num_heads: int, variant: str):
    num_undirected = max(1, num_heads // 3)
    num_directed = num_heads - num_undirected
    first, second = OFFICIAL_HEAD_DIRECTIONS[variant].split("-")[:2]
    directions = SHORTHANDS[first] + SHORTHANDS[second]
    full_rounds, rest = divmod(num_directed, 8)
    picks = list(range(8)) * full_rounds + list(_SPREAD_ORDER[variant][:rest])
    slopes = [0.5] * num_directed + [2.0 ** -(2 * k + 2) for k in range(num_undirected)]
    return [directions[i] for i in picks] + [()] * num_undirected, slopes


def resolve_head_directions(num_heads: int, variant=None, head_directions=None, layout: str = "official"):
    """The shorthand a layer uses, or None for the spread layout.

    ``head_directions`` (a shorthand string) wins and must agree with ``variant`` when both are given; otherwise
    ``layout="official"`` gives the variant's shorthand for 6, 12 and 16 heads (``variant`` defaults to
    ``"45"``) and None (spread) for other head counts.
    """
    _check_num_heads(num_heads)
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is not a LookHere head layout; choose one of {LAYOUTS}")
    if variant is not None:
        _check_variant(variant)
    if head_directions is not None:
        if not isinstance(head_directions, str):
            raise ValueError(f"head_directions={head_directions!r} must be a shorthand string such as "
                             "'corners-triangles-none'")
        if layout != "official":
            raise ValueError(f"head_directions={head_directions!r} is the authors' layout but layout={layout!r}; "
                             "drop one of them")
        if variant is not None and head_directions != _variant_shorthand(num_heads, variant):
            raise ValueError(f"variant={variant!r} means head_directions="
                             f"{_variant_shorthand(num_heads, variant)!r} for {num_heads} heads, not "
                             f"{head_directions!r}; pass only one of them")
        return head_directions
    variant = "45" if variant is None else variant
    if layout == "official" and num_heads in (6, 12, 16):
        return _variant_shorthand(num_heads, variant)
    return None


def _variant_shorthand(num_heads: int, variant: str) -> str:
    name = OFFICIAL_HEAD_DIRECTIONS[variant]
    return name.split("-")[0] + "-none" if num_heads == 6 else name


def _variant_of(num_heads: int, shorthand) -> str | None:
    return next((v for v in VARIANTS if _variant_shorthand(num_heads, v) == shorthand), None)


def _layout(num_heads: int, variant=None, head_directions=None, layout: str = "official"):
    """(per-head tuple of half-plane names, () for undirected; per-head s_h in the authors' units)."""
    shorthand = resolve_head_directions(num_heads, variant, head_directions, layout)
    if shorthand is None:
        return _spread_layout(num_heads, "45" if variant is None else variant)
    return _official_layout(shorthand, num_heads)


def head_names(num_heads: int, variant=None, head_directions=None, layout: str = "official") -> tuple[str, ...]:
    """Human-readable FOV of each head, e.g. ``('UR&L', ..., 'none')`` (for logs and plots)."""
    planes, _ = _layout(num_heads, variant, head_directions, layout)
    return tuple("&".join(p) if p else "none" for p in planes)


def head_fields_of_view(num_heads: int, variant=None, head_directions=None, layout: str = "official") -> Tensor:
    """Each head's field of view as two half-plane rows.

    Returns int8 ``(num_heads, 2, 2)``: row ``r`` of head ``h`` is ``(a, b)`` meaning
    ``a*dx + b*dy >= 0`` with ``dx = x_key - x_query``, ``dy = y_key - y_query`` (y down); ``(0, 0)`` means
    no constraint, so undirected heads are all zeros. See the module docstring for the layouts. (``LookHere``
    also clears the rows of heads whose slope is 0.)
    """
    fov = torch.zeros(num_heads, 2, 2, dtype=torch.int8)
    for h, planes in enumerate(_layout(num_heads, variant, head_directions, layout)[0]):
        for r, name in enumerate(planes):
            fov[h, r] = torch.tensor(_HALF_PLANES[name], dtype=torch.int8)
    return fov


def _check_layer(layer_index, num_layers) -> None:
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise ValueError(f"num_layers={num_layers!r} must be an integer >= 1")
    if isinstance(layer_index, bool) or not isinstance(layer_index, int) or not 0 <= layer_index < num_layers:
        raise ValueError(
            f"layer_index={layer_index!r} is out of range for num_layers={num_layers}; "
            f"use a 0-based index in [0, {num_layers - 1}]"
        )


def _slopes64(s_h, layer_index: int, num_layers: int, global_slope: float, layer_slopes) -> list[float]:
    first, last = layer_slopes
    # a + (b - a) * i / (n - 1): for (1.5, 0.5) exactly the 1.5 - i / (n - 1) of earlier winpos versions.
    s_l = first if num_layers == 1 else first + (last - first) * layer_index / (num_layers - 1)
    return [global_slope * s_l * s for s in s_h]


def head_slopes(num_heads: int, variant=None, layer_index: int = 0, num_layers: int = 1, global_slope=None,
                layer_slopes=None, head_directions=None, layout: str = "official", slope_units=None) -> Tensor:
    """Distance penalty per head, ``m(l, h) = global_slope * s_l(l) * s_h(h)`` (see the module docstring).

    Args:
        num_heads: heads of this layer (>= 1).
        variant, head_directions, layout: the head layout (see ``resolve_head_directions``); ``head_directions``
            may be a per-layer list.
        layer_index: 0-based index of this layer among ``num_layers``.
        num_layers: layers sharing the linear schedule ``s_l``.
        global_slope, slope_units: see ``official_global_slope`` (default 2.0, the authors' value).
        layer_slopes: ``(first, last)`` of the schedule, default ``(1.5, 0.5)``.

    Returns fp32 ``(num_heads,)``. A zero entry means that head has neither penalty nor mask.
    """
    _check_layer(layer_index, num_layers)
    official_keys = layer_slopes is not None or head_directions is not None
    g = official_global_slope(global_slope, slope_units, official_keys)
    shorthand = _layer_shorthand(head_directions, layer_index, num_layers)
    _, s_h = _layout(num_heads, variant, shorthand, layout)
    return torch.tensor(_slopes64(s_h, layer_index, num_layers, g, _check_layer_slopes(layer_slopes)),
                        dtype=torch.float64).float()


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
        variant: ``"180"``, ``"90"`` or ``"45"`` (default): the FOV angle of the directed heads.
        layer_index: 0-based index of the layer in the slope schedule.
        num_layers: length of the slope schedule (usually the backbone depth).
        global_slope: in the authors' units, default 2.0; see ``official_global_slope`` for when ``slope_units``
            is needed. Change it later with ``set_global_slope`` (e.g. for resolution sweeps).
        layer_slopes: ``(first, last)`` of the linear layer schedule, default ``(1.5, 0.5)``.
        head_directions: the authors' shorthand (e.g. ``"corners-triangles-none"``) or a per-layer list of them;
            replaces ``variant``.
        layout: ``"official"`` (default) or ``"spread"``; see the module docstring.
        slope_units: ``"official"`` or ``"paper"``: the units of ``global_slope``.
        distance, fill_with: accepted so that an authors' ``lh_config`` can be passed as keywords; only their
            defaults (``"linear"``, ``"inf"``) are implemented.

    Buffers (not saved in checkpoints: they follow from the arguments): ``fov`` int8 ``(H, 2, 2)`` (rows of
    zero-slope heads cleared), ``slopes`` fp32 ``(H,)``. Do not edit them in place; caches would go stale.
    """

    def __init__(self, num_heads: int, variant=None, layer_index: int = 0, num_layers: int = 12,
                 global_slope=None, layer_slopes=None, head_directions=None, layout: str = "official",
                 slope_units=None, distance: str = "linear", fill_with: str = "inf"):
        super().__init__()
        if distance != "linear" or fill_with != "inf":
            raise ValueError(f"distance={distance!r}, fill_with={fill_with!r} are ablations of the authors' code that "
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
        self._bias_cache: tuple[tuple, Tensor] | None = None  # one entry: a dense bias can be large
        self._tile_cache: OrderedDict[tuple, Tensor] = OrderedDict()
        self._shift_cache: tuple[tuple, Tensor] | None = None

    def _slopes(self, global_slope: float) -> Tensor:
        return torch.tensor(_slopes64(self._head_slopes, self.layer_index, self.num_layers, global_slope,
                                      self.layer_slopes), dtype=torch.float64)

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
            self.fov.copy_(fov)
            self._tile_cache.clear()
        self.slopes.copy_(slopes.float())
        self.global_slope = value
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
        layout = (f"head_directions={self.shorthand!r}" if self.shorthand
                  else f"layout='spread', variant={self.variant!r}")
        return (f"num_heads={self.num_heads}, {layout}, layer_index={self.layer_index}, num_layers={self.num_layers}, "
                f"global_slope={self.global_slope} (authors' units), layer_slopes={self.layer_slopes}, "
                f"heads={','.join('&'.join(p) if p else 'none' for p in self._planes)}")
