"""LookHere vs a transcription of the authors' bias builder (``create_lh_bias_tensor`` in GreenCUBIC/lookhere),
written here, not imported from winpos: their direction primitives (half-planes, 90-degree cones, unions of two
cones), their head filling and per-group slopes, float64 products, NaN -> 0 and +inf -> bf16 max, negated bf16.
winpos must match it with the authors' configurations passed unchanged. Also: the authors' units of
``global_slope`` and the errors of layouts their code does not have.

``OFFICIAL`` and ``official_bias`` are shared with ``tests/checkpoints/test_lookhere_import.py``.
"""

from itertools import groupby

import numpy as np
import pytest
import torch

from winpos.posemb.lookhere import VARIANTS, LookHere, head_names, head_slopes

# Transcribed from the description of GreenCUBIC/lookhere's create_lh_bias_tensor: direction primitives per head,
# heads filled from a dash-separated shorthand, slopes per group of equal parts, then
# bias = -bf16(nan_to_num(global_slope * layer_slope * (head_slope * masked_distance))), masked = +inf before that.

BF16_MAX = torch.finfo(torch.bfloat16).max
# The authors' configurations of their three released models (LH-180, LH-90, LH-45).
OFFICIAL = {
    "180": dict(global_slope=2, layer_slopes=[1.5, 0.5], head_directions="halves-diagonals-none"),
    "90": dict(global_slope=2, layer_slopes=[1.5, 0.5], head_directions="corners-triangles-none"),
    "45": dict(global_slope=2, layer_slopes=[1.5, 0.5], head_directions="eighths1-eighths2-none"),
}
PRIMITIVES = {  # each part names four heads; a head sees what all of its primitives see
    "halves": [["up"], ["down"], ["left"], ["right"]],
    "corners": [["up", "left"], ["up", "right"], ["down", "left"], ["down", "right"]],
    "triangles": [["tri_up"], ["tri_down"], ["tri_left"], ["tri_right"]],
    "diagonals": [["diag_up_right"], ["diag_up_left"], ["diag_down_right"], ["diag_down_left"]],
    "eighths1": [["tri_up", "left"], ["tri_down", "left"], ["tri_left", "up"], ["tri_right", "up"]],
    "eighths2": [["tri_up", "right"], ["tri_down", "right"], ["tri_left", "down"], ["tri_right", "down"]],
    "none": [[], [], [], []],
}


def official_config(num_heads, variant):
    """The authors' shorthand for this head count: 6 heads have no 3-part layout in their code, only 'first-none'."""
    cfg = dict(OFFICIAL[variant])
    if num_heads == 6:
        cfg["head_directions"] = cfg["head_directions"].split("-")[0] + "-none"
    return cfg


def primitive_sees(name, dx, dy):
    """The authors' primitives on offset arrays (y down): 'up' masks keys below the query, 'tri_up' keeps the
    90-degree cone above it (both diagonals included), 'diag_up_right' is the union of the up and right cones."""
    cone = {"up": dy <= -np.abs(dx), "down": dy >= np.abs(dx), "left": dx <= -np.abs(dy), "right": dx >= np.abs(dy)}
    half = {"up": dy <= 0, "down": dy >= 0, "left": dx <= 0, "right": dx >= 0}
    kind, *dirs = name.split("_")
    if kind == "tri":
        return cone[dirs[0]]
    if kind == "diag":
        return cone[dirs[0]] | cone[dirs[1]]
    return half[kind]


def official_fill(parts, num_heads):
    """(part name per head, primitives per head) as the authors' code fills heads from the parts."""
    if num_heads == 6:
        return [parts[0]] * 4 + [parts[1]] * 2, PRIMITIVES[parts[0]] + PRIMITIVES[parts[1]][:2]
    if len(parts) == 1:
        return [parts[0]] * num_heads, PRIMITIVES[parts[0]] * (num_heads // 4)
    counts = {(2, 12): [8, 4], (2, 16): [8, 8], (3, 12): [4, 4, 4], (3, 16): [8, 4, 4], (4, 16): [4, 4, 4, 4]}
    counts = counts[(len(parts), num_heads)]
    names = [p for p, c in zip(parts, counts) for _ in range(c)]
    return names, [h for p, c in zip(parts, counts) for h in PRIMITIVES[p] * (c // 4)]


def official_head_slopes(names):
    out = []
    for name, group in groupby(names):
        n = len(list(group))
        if name == "none":
            base = [0.25, 0.0625, 0.015625, 0.00390625]
            out += base[:2] if n == 2 else list(np.repeat(base, n // 4))
        else:
            out += list(np.repeat(np.exp2(-np.arange(1, n / 4 + 1)), 4))
    return np.array(out)


def official_bias(cfg, grid, depth, num_heads, rounded=True):
    """(depth, heads, N, N) bf16, the authors' value layout: masked entries are -bf16 max, not -inf. ``rounded=False``
    returns the float64 values before their bf16 cast."""
    gy, gx = grid
    y, x = np.meshgrid(np.arange(gy), np.arange(gx), indexing="ij")
    y, x = y.reshape(-1).astype(float), x.reshape(-1).astype(float)
    dx, dy = x[None, :] - x[:, None], y[None, :] - y[:, None]  # [query, key]
    dist = np.sqrt(dx ** 2 + dy ** 2)
    names, heads = official_fill(cfg["head_directions"].split("-"), num_heads)
    lh = np.stack([np.where(np.logical_and.reduce([primitive_sees(p, dx, dy) for p in prims] + [dist >= 0]),
                            dist, np.inf) for prims in heads])
    lh = official_head_slopes(names)[:, None, None] * lh
    layer = np.linspace(cfg["layer_slopes"][0], cfg["layer_slopes"][1], depth)[:, None, None, None]
    with np.errstate(invalid="ignore"):
        lh = cfg["global_slope"] * layer * lh[None]  # 0 * inf = nan where a slope is 0
    lh = np.nan_to_num(lh, nan=0.0, posinf=BF16_MAX)
    return torch.tensor(lh, dtype=torch.bfloat16 if rounded else torch.float64) * -1.0


def parity(cfg, grid, num_heads, depth, layers):
    """Compare winpos with the transcription on the given layers: (mask entries differing, max |difference| of
    the unmasked values after rounding winpos's fp32 bias to bf16, max |value|)."""
    ref = official_bias(cfg, grid, depth, num_heads)
    mask_diff, value_diff, largest = 0, 0.0, 0.0
    for layer in layers:
        ours = LookHere(num_heads, layer_index=layer, num_layers=depth, **cfg).bias(grid, grid)
        theirs = ref[layer]
        masked = theirs == -BF16_MAX
        mask_diff += int((torch.isneginf(ours) != masked).sum())
        keep = ~masked & ~torch.isneginf(ours)
        value_diff = max(value_diff, float((ours.to(torch.bfloat16)[keep].float() - theirs[keep].float()).abs().max()))
        largest = max(largest, float(theirs[keep].float().abs().max()))
    return mask_diff, value_diff, largest


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("num_heads,depth", [(6, 12), (12, 12), (16, 24)])
@pytest.mark.parametrize("grid", [(14, 14), (7, 11), (11, 7)])
def test_parity_with_the_authors_bias(variant, num_heads, depth, grid):
    """The authors' configuration passed unchanged gives their masks exactly and their values to bf16 rounding,
    on square and non-square grids, first and last layer."""
    mask_diff, value_diff, largest = parity(official_config(num_heads, variant), grid, num_heads, depth,
                                            layers=(0, depth - 1))
    assert mask_diff == 0
    assert value_diff == 0.0, (value_diff, largest)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("num_heads", [6, 12, 16])
def test_default_layout_and_slopes_are_the_authors(variant, num_heads):
    """LookHere(num_heads, variant) with nothing else is the authors' configuration of that variant."""
    for layer in (0, 7, 11):
        default = LookHere(num_heads, variant, layer_index=layer, num_layers=12)
        official = LookHere(num_heads, layer_index=layer, num_layers=12, **official_config(num_heads, variant))
        assert torch.equal(default.fov, official.fov) and torch.equal(default.slopes, official.slopes)
        assert default.global_slope == 2.0 and official.variant == variant


def test_16_heads_official_layout():
    """Four directed heads, the same four at half slope, four more directed heads, four undirected."""
    lh = LookHere(16, "180", layer_index=0, num_layers=2)
    assert head_names(16, "180") == ("U", "D", "L", "R") * 2 + ("UR", "UL", "DR", "DL") + ("none",) * 4
    expected = 1.5 * 2 * torch.tensor([0.5] * 4 + [0.25] * 4 + [0.5] * 4 + [1 / 4, 1 / 16, 1 / 64, 1 / 256])
    assert torch.equal(lh.slopes, expected)
    assert head_names(16, "180", layout="spread")[8:11] == ("U", "D", "L")  # winpos's earlier 11 + 5 layout


@pytest.mark.parametrize("variant", VARIANTS)
def test_global_slope_zero_is_the_authors_all_zero_bias(variant):
    cfg = dict(official_config(12, variant), global_slope=0)
    bias = LookHere(12, layer_index=3, num_layers=12, **cfg).bias((7, 11), (7, 11))
    assert torch.equal(bias, torch.zeros_like(bias))  # no penalty and no mask, in every head
    assert parity(cfg, (7, 11), 12, 12, layers=(0, 11))[:2] == (0, 0.0)
    # A zero layer slope does the same to that layer only.
    last_zero = dict(official_config(12, variant), layer_slopes=[1.5, 0.0])
    assert parity(last_zero, (7, 11), 12, 12, layers=(0, 11))[:2] == (0, 0.0)
    assert not torch.isinf(LookHere(12, layer_index=11, num_layers=12, **last_zero).bias((5, 5), (5, 5))).any()


def test_set_global_slope_to_zero_and_back_updates_masks_and_tile_classes():
    lh = LookHere(12, "45", slope_units="official")
    masked = torch.isinf(lh.bias((6, 6), (6, 6)))
    classes = lh.tile_classes((6, 6), (6, 6), 16, 16)
    assert (classes == 0).any()
    lh.set_global_slope(0)
    assert not torch.isinf(lh.bias((6, 6), (6, 6))).any() and (lh.fov == 0).all()
    assert (lh.tile_classes((6, 6), (6, 6), 16, 16) == 1).all()  # nothing masked: every tile is full
    lh.set_global_slope(2.0)
    assert torch.equal(torch.isinf(lh.bias((6, 6), (6, 6))), masked)
    assert torch.equal(lh.tile_classes((6, 6), (6, 6), 16, 16), classes)


def test_slope_units_are_explicit():
    """A bare global_slope with winpos's own keys is refused: it used to mean half of what it means now."""
    with pytest.raises(ValueError, match="global_slope=0.75 has no units.*slope_units='official'.*'paper'"):
        LookHere(12, "90", global_slope=0.75)
    with pytest.raises(ValueError, match="has no units"):
        head_slopes(12, "90", 0, 12, global_slope=1.0)
    with pytest.raises(ValueError, match="has no units"):
        LookHere(12, "90").set_global_slope(1.0)  # built from winpos's keys only
    with pytest.raises(ValueError, match="slope_units='meters' is not a unit"):
        LookHere(12, "90", global_slope=1.0, slope_units="meters")
    paper = LookHere(12, "90", layer_index=4, global_slope=0.75, slope_units="paper")
    official = LookHere(12, "90", layer_index=4, global_slope=1.5, slope_units="official")
    assert torch.equal(paper.slopes, official.slopes) and paper.global_slope == 1.5
    # Next to the authors' other keys the number is theirs, as in their lh_config.
    cfg = LookHere(12, layer_index=4, **dict(OFFICIAL["90"], global_slope=1.5))
    assert torch.equal(cfg.slopes, official.slopes)
    cfg.set_global_slope(3.0)
    assert torch.equal(cfg.slopes, 2 * official.slopes)


def test_layout_errors_name_the_fix():
    with pytest.raises(ValueError, match="no layout for 8 heads in the authors' code.*layout='spread'"):
        LookHere(8, head_directions="corners-triangles-none")
    with pytest.raises(ValueError, match="group of 2 'triangles' heads.*'corners-none'"):
        LookHere(6, head_directions="corners-triangles-none")  # the authors' code cannot build this either
    with pytest.raises(ValueError, match="part 'zero'.*does not implement"):
        LookHere(12, head_directions="halves-zero-none")
    with pytest.raises(ValueError, match="variant='90' means head_directions='corners-triangles-none'"):
        LookHere(12, "90", head_directions="halves-diagonals-none")
    with pytest.raises(ValueError, match="layout='diagonal' is not a LookHere head layout"):
        LookHere(12, layout="diagonal")
    with pytest.raises(ValueError, match="distance='sqrt'.*not implement"):
        LookHere(12, **OFFICIAL["45"], distance="sqrt")
    with pytest.raises(ValueError, match="lists 2 shorthands but the model has 12 layers"):
        LookHere(12, head_directions=["halves-diagonals-none"] * 2)
    per_layer = ["halves-diagonals-none"] * 6 + ["eighths1-eighths2-none"] * 6
    assert LookHere(12, layer_index=7, head_directions=per_layer).variant == "45"
