"""LookHere head layouts and slopes: which field of view and which distance penalty each head gets.

The authors' head-layout tables and their dash-separated shorthand, winpos's spread layout, the per-layer
slope schedule and the units of ``global_slope``. Fields of view are half-plane rows as described in
``winpos.posemb.lookhere``, which builds the biases from them and re-exports the public names here.

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
from itertools import groupby

import torch
from torch import Tensor
from winpos.errors import WinposError

__all__ = ["DEFAULT_GLOBAL_SLOPE", "DEFAULT_LAYER_SLOPES", "LAYOUTS", "OFFICIAL_HEAD_DIRECTIONS", "SHORTHANDS",
           "SLOPE_UNITS", "VARIANTS", "head_fields_of_view", "head_names", "head_slopes", "official_global_slope",
           "resolve_head_directions"]

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


def _check_variant(variant) -> None:
    if variant not in VARIANTS:
        raise WinposError(
            f"variant={variant!r} is not a LookHere variant; choose one of {VARIANTS} "
            "(the field-of-view angle of the directed heads, in degrees, as a string)"
        )


def _check_num_heads(num_heads) -> None:
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise WinposError(f"num_heads={num_heads!r} must be an integer >= 1")


def _check_slope(name: str, value) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise WinposError(f"{name}={value!r} must be a finite number >= 0") from None
    if not 0.0 <= value < math.inf:
        raise WinposError(f"{name}={value!r} must be a finite number >= 0 (the authors use global_slope=2.0, "
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
        raise WinposError(f"slope_units={slope_units!r} is not a unit of LookHere slopes; choose one of {SLOPE_UNITS}")
    if global_slope is None:
        return DEFAULT_GLOBAL_SLOPE
    value = _check_slope("global_slope", global_slope)
    if slope_units == "paper":
        return 2.0 * value
    if slope_units is None and not official_keys:
        raise WinposError(
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
        raise WinposError(f"layer_slopes={layer_slopes!r} must be two numbers (first layer, last layer), "
                          "e.g. the authors' (1.5, 0.5)") from None
    return _check_slope("layer_slopes[0]", first), _check_slope("layer_slopes[1]", last)


def _layer_shorthand(head_directions, layer_index: int, num_layers: int):
    """The shorthand of one layer: ``head_directions`` itself, or its ``layer_index`` entry when it is a per-layer
    list (as the authors' code accepts)."""
    if head_directions is None or isinstance(head_directions, str):
        return head_directions
    if not isinstance(head_directions, (list, tuple)) or not all(isinstance(s, str) for s in head_directions):
        raise WinposError(f"head_directions={head_directions!r} must be a shorthand string such as "
                          "'corners-triangles-none' or a list of them, one per layer")
    if len(head_directions) != num_layers:
        raise WinposError(f"head_directions lists {len(head_directions)} shorthands but the model has {num_layers} "
                          "layers; give one per layer or a single string for all")
    return head_directions[layer_index]


def _official_layout(shorthand: str, num_heads: int):
    """(per-head half-plane names, per-head s_h) of an authors' shorthand, filled as their code fills heads."""
    parts = shorthand.split("-")
    unknown = [p for p in parts if p not in SHORTHANDS]
    if unknown:
        raise WinposError(f"head_directions={shorthand!r} has the part {unknown[0]!r}, which winpos does not "
                          f"implement; use parts from {', '.join(SHORTHANDS)} joined by '-'")
    if num_heads == 6 and len(parts) >= 2:
        fill = [(parts[0], 4), (parts[1], 2)]
    elif len(parts) == 1 and num_heads % 4 == 0:
        fill = [(parts[0], num_heads)]
    elif (len(parts), num_heads) in _OFFICIAL_FILL:
        fill = list(zip(parts, _OFFICIAL_FILL[(len(parts), num_heads)]))
    else:
        raise WinposError(
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
            raise WinposError(
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
        raise WinposError(f"layout={layout!r} is not a LookHere head layout; choose one of {LAYOUTS}")
    if variant is not None:
        _check_variant(variant)
    if head_directions is not None:
        if not isinstance(head_directions, str):
            raise WinposError(f"head_directions={head_directions!r} must be a shorthand string such as "
                              "'corners-triangles-none'")
        if layout != "official":
            raise WinposError(f"head_directions={head_directions!r} is the authors' layout but layout={layout!r}; "
                              "drop one of them")
        if variant is not None and head_directions != _variant_shorthand(num_heads, variant):
            raise WinposError(f"variant={variant!r} means head_directions="
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
        raise WinposError(f"num_layers={num_layers!r} must be an integer >= 1")
    if isinstance(layer_index, bool) or not isinstance(layer_index, int) or not 0 <= layer_index < num_layers:
        raise WinposError(
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
