"""One image of the embedded "shapes" dataset: the objects' polygons, their exact COCO masks, and the painted scene.

Each image has a textured background (gradient, stripes or smooth noise, plus pixel noise) and 1-6 objects of
``SHAPE_CLASSES`` in random colours and textures, so only the outline tells the class. Object sizes span COCO's
small (< 32^2 px), medium and large (>= 96^2 px) areas at the default 256 px. Objects overlap: an instance's
mask is what stays visible after everything drawn above it, and instances left almost fully hidden are dropped.

Masks are COCO polygons. An unoccluded object inside the image keeps its analytic polygon; any other is traced
along pixel edges (``mask_to_polygons``), so pycocotools decodes every annotation back to exactly the pixels
painted in the image. ``winpos.data.shapes`` writes these images as a dataset. No detectron2 import here: only
numpy, PIL and pycocotools.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image
from pycocotools import mask as mask_utils
from winpos.errors import WinposError

__all__ = ["SHAPE_CLASSES", "TEXTURES", "compose_scene", "mask_to_polygons", "random_scene", "rasterize_polygons",
           "scene_hw", "Shape", "shape_polygon"]

SHAPE_CLASSES: tuple[str, ...] = ("circle", "square", "triangle", "star")
TEXTURES: tuple[str, ...] = ("solid", "gradient", "stripes")
_STAR_INNER = 0.45  # inner/outer radius of the 5-point star; fixed so "star" is one shape, not a family
_MIN_SIZE = 10.0  # smallest object, as sqrt(area) in px: still a few dozen pixels, like COCO's smallest
_MAX_SIZE_FRAC = 0.65  # largest object's sqrt(area) relative to the short image side


@dataclass(frozen=True)
class Shape:
    """One object to draw. ``size`` is sqrt(area) in px of the untruncated shape; ``angle`` in radians;
    ``color`` RGB in 0..255; ``texture`` one of ``TEXTURES``."""

    kind: str
    cx: float
    cy: float
    size: float
    angle: float = 0.0
    color: tuple = (230, 40, 40)
    texture: str = "solid"


def shape_polygon(shape: Shape) -> np.ndarray:
    """Vertices ``(N, 2)`` as (x, y) px, rounded to 0.01 px so the JSON holds exactly the rasterized polygon."""
    if shape.kind not in SHAPE_CLASSES:
        raise WinposError(f"unknown shape kind {shape.kind!r}; choose one of {SHAPE_CLASSES}")
    if not shape.size > 0:
        raise WinposError(f"shape size must be positive, got {shape.size}")
    s = shape.size
    if shape.kind == "circle":
        r = s / math.sqrt(math.pi)
        n = int(np.clip(round(2 * math.pi * r / 3), 12, 64))  # a vertex every ~3 px: smooth at any size
        radii = np.full(n, r)
    elif shape.kind == "square":
        n, radii = 4, np.full(4, s / math.sqrt(2))
    elif shape.kind == "triangle":  # equilateral: area = 3*sqrt(3)/4 * R^2
        n, radii = 3, np.full(3, s * math.sqrt(4 / (3 * math.sqrt(3))))
    else:  # star: 10 vertices alternating R and kR, area = 5*k*sin(36 deg)*R^2
        outer = s / math.sqrt(5 * _STAR_INNER * math.sin(math.pi / 5))
        n, radii = 10, np.where(np.arange(10) % 2 == 0, outer, _STAR_INNER * outer)
    theta = shape.angle + 2 * math.pi * np.arange(n) / n
    xy = np.stack([shape.cx + radii * np.cos(theta), shape.cy + radii * np.sin(theta)], axis=1)
    return np.round(xy, 2)


def rasterize_polygons(polygons: list, height: int, width: int) -> np.ndarray:
    """Union of COCO polygons (flat [x0, y0, x1, y1, ...] lists) as a bool mask ``(height, width)``, with
    pycocotools' rule (pixel (x, y) covers [x, x+1] x [y, y+1]); parts outside the image are clipped."""
    rle = mask_utils.merge(mask_utils.frPyObjects([list(map(float, p)) for p in polygons], height, width))
    return mask_utils.decode(rle).astype(bool)


def _trace_rings(mask: np.ndarray) -> list[tuple[np.ndarray, float]]:
    """Closed rings along the pixel edges of ``mask`` ``(H, W)``: (vertices ``(N, 2)`` int (x, y), signed area).

    Every edge between a foreground and a background pixel is walked with the foreground on its right, so outer
    boundaries have positive shoelace area and holes negative. Where two foreground pixels touch only at a
    corner, the walk turns right and stays with its pixel: those pixels get separate rings (4-connectivity).
    """
    h, w = mask.shape
    pad = np.pad(mask.astype(bool), 1)
    fg = pad[1:-1, 1:-1]
    starts, dirs = [], []
    # direction codes 0=E, 1=S, 2=W, 3=N in image coordinates (y down); start corner of each edge per pixel
    for d, (bg_nbr, dx, dy) in enumerate([(pad[:-2, 1:-1], 0, 0), (pad[1:-1, 2:], 1, 0),
                                          (pad[2:, 1:-1], 1, 1), (pad[1:-1, :-2], 0, 1)]):
        ys, xs = np.nonzero(fg & ~bg_nbr)
        starts.append(np.stack([xs + dx, ys + dy], axis=1))
        dirs.append(np.full(len(xs), d))
    start, direction = np.concatenate(starts), np.concatenate(dirs)
    if len(start) == 0:
        return []
    step = np.array([[1, 0], [0, 1], [-1, 0], [0, -1]])
    end = start + step[direction]
    key = lambda xy: xy[:, 1] * (w + 1) + xy[:, 0]  # noqa: E731 - corner id
    table = np.full((h + 1) * (w + 1) * 4, -1)
    table[key(start) * 4 + direction] = np.arange(len(start))
    nxt = np.full(len(start), -1)
    for turn in (3, 0, 1):  # left, straight, right: later ones overwrite, so a right turn wins at a saddle
        cand = table[key(end) * 4 + (direction + turn) % 4]
        nxt = np.where(cand >= 0, cand, nxt)
    rings, seen = [], np.zeros(len(start), bool)
    for first in range(len(start)):
        if seen[first]:
            continue
        cycle, e = [], first
        while not seen[e]:
            seen[e] = True
            cycle.append(e)
            e = nxt[e]
        cycle = np.array(cycle)
        corner = direction[cycle] != direction[np.roll(cycle, 1)]  # keep only vertices where the walk turns
        xy = start[cycle][corner]
        x, y = xy[:, 0].astype(np.int64), xy[:, 1].astype(np.int64)
        rings.append((xy, 0.5 * float(np.sum(x * np.roll(y, -1) - np.roll(x, -1) * y))))
    return rings


def mask_to_polygons(mask: np.ndarray) -> list[list[int]]:
    """Exact COCO polygons of a bool mask ``(H, W)``: ``rasterize_polygons(result, H, W) == mask``.

    COCO rings are unioned and cannot hold holes, so a mask with a hole is first cut into two horizontal bands
    along a row through the hole; the hole opens onto the cut in both bands, and cutting makes no new holes.
    """
    rings = _trace_rings(mask)
    holes = [xy for xy, area in rings if area < 0]
    if holes:
        top_row, bottom_row = int(holes[0][:, 1].min()), int(holes[0][:, 1].max()) - 1  # pixel rows of the hole
        cut = (top_row + bottom_row) // 2 + 1
        upper, lower = mask.copy(), mask.copy()
        upper[cut:], lower[:cut] = False, False
        return mask_to_polygons(upper) + mask_to_polygons(lower)
    return [xy.ravel().tolist() for xy, _ in rings]


def _paint(canvas: np.ndarray, mask: np.ndarray, color, texture: str, rng: np.random.Generator) -> None:
    """Fill ``canvas`` ``(H, W, 3)`` float under ``mask`` ``(H, W)`` with a textured colour, in place."""
    ys, xs = np.nonzero(mask)
    c = np.asarray(color, np.float64)
    if texture not in TEXTURES:
        raise WinposError(f"unknown texture {texture!r}; choose one of {TEXTURES}")
    angle = rng.uniform(0, 2 * math.pi)
    proj = xs * math.cos(angle) + ys * math.sin(angle)
    if texture == "gradient":
        t = (proj - proj.min()) / (np.ptp(proj) + 1e-6)
        fill = c + (c * rng.uniform(0.35, 0.7) - c) * t[:, None]
    elif texture == "stripes":
        on = np.floor(proj / rng.uniform(3, 10)) % 2 == 0
        fill = np.where(on[:, None], c, c * rng.uniform(0.3, 0.6))
    else:
        fill = np.broadcast_to(c, (len(xs), 3))
    canvas[ys, xs] = fill + rng.normal(0, rng.uniform(1, 8), (len(xs), 3))


def _background(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A textured background ``(H, W, 3)`` float: linear gradient, stripes or smooth noise, plus pixel noise."""
    scale = np.float32(max(height, width))
    yy, xx = np.arange(height, dtype=np.float32)[:, None] / scale, np.arange(width, dtype=np.float32) / scale
    angle = rng.uniform(0, 2 * math.pi)
    proj = xx * math.cos(angle) + yy * math.sin(angle)
    kind = rng.integers(3)
    if kind == 0:
        t = (proj - proj.min()) / (np.ptp(proj) + 1e-6)
    elif kind == 1:
        t = 0.5 + 0.5 * np.sin(2 * math.pi * rng.uniform(3, 14) * proj + rng.uniform(0, 2 * math.pi))
        if rng.random() < 0.5:
            t = (t > 0.5).astype(np.float64)  # hard-edged stripes: straight edges the detector must not fire on
    else:
        grid = rng.random((int(rng.integers(3, 9)),) * 2).astype(np.float32)
        t = np.asarray(Image.fromarray(grid).resize((width, height), Image.BICUBIC), np.float64)
    c1 = rng.uniform(0, 255, 3)
    c2 = np.clip(c1 + rng.uniform(-120, 120, 3), 0, 255)
    img = c1 + (c2 - c1) * t[..., None]
    sigma = rng.uniform(2, 12)
    return img + sigma * rng.standard_normal((height, width, 3), dtype=np.float32)


def _annotate(polys: list[np.ndarray], masks: list[np.ndarray], min_visible: float, min_area: int) -> list[dict]:
    """COCO annotations (no ids) for objects painted in list order, later ones on top; masks ``(H, W)`` bool."""
    h, w = masks[0].shape if masks else (0, 0)
    anns, above = [], np.zeros((h, w), bool)
    for poly, full in zip(polys[::-1], masks[::-1]):  # top-most first: ``above`` is what hides the next one
        visible = full & ~above
        above |= full
        n_vis = int(visible.sum())
        if n_vis < min_area or n_vis < min_visible * int(full.sum()):
            anns.append(None)  # almost fully hidden: its few pixels stay in the image, unlabelled
            continue
        inside = poly.min() >= 0 and (poly[:, 0] <= w).all() and (poly[:, 1] <= h).all()
        segm = [poly.ravel().tolist()] if inside and n_vis == full.sum() else mask_to_polygons(visible)
        xy = np.concatenate([np.reshape(p, (-1, 2)) for p in segm])
        x0, y0 = xy.min(0)
        x1, y1 = xy.max(0)
        area = float(mask_utils.area(mask_utils.merge(mask_utils.frPyObjects(segm, h, w))))
        bbox = [round(float(x0), 2), round(float(y0), 2), round(float(x1 - x0), 2), round(float(y1 - y0), 2)]
        anns.append({"segmentation": segm, "area": area, "bbox": bbox, "iscrowd": 0})
    return anns[::-1]


def compose_scene(shapes: list[Shape], image_size=256, rng: np.random.Generator | None = None,
                  min_visible: float = 0.2, min_area: int = 8) -> tuple[np.ndarray, list[dict | None]]:
    """Paint ``shapes`` in order (later on top) over a textured background.

    Returns the image ``(H, W, 3)`` uint8 and one entry per shape: a COCO annotation dict (segmentation, area,
    bbox, iscrowd, category_id; no ids) of the visible part, or None for a shape with fewer than ``min_area``
    visible pixels or less than ``min_visible`` of its in-image pixels visible. ``rng`` draws the background
    and textures (default: seed 0).
    """
    h, w = scene_hw(image_size)
    rng = np.random.default_rng(0) if rng is None else rng
    canvas = _background(rng, h, w)
    polys = [shape_polygon(s) for s in shapes]
    masks = [rasterize_polygons([p.ravel()], h, w) for p in polys]
    for shape, mask in zip(shapes, masks):
        _paint(canvas, mask, shape.color, shape.texture, rng)
    anns = _annotate(polys, masks, min_visible, min_area)
    for shape, ann in zip(shapes, anns):
        if ann is not None:
            ann["category_id"] = SHAPE_CLASSES.index(shape.kind) + 1
    return np.clip(np.round(canvas), 0, 255).astype(np.uint8), anns


def _sample_size(rng: np.random.Generator, short_side: int) -> float:
    """sqrt(area) in px: a COCO area range (small/medium/large, weighted like COCO's 41/34/25 %), then
    log-uniform inside it; ranges that do not fit in the image are left out."""
    ranges = [(_MIN_SIZE, 32.0), (32.0, 96.0), (96.0, _MAX_SIZE_FRAC * short_side)]
    weights = np.array([0.41, 0.34, 0.25]) * [hi > lo * 1.05 for lo, hi in ranges]
    lo, hi = ranges[int(rng.choice(3, p=weights / weights.sum()))]
    hi = min(hi, _MAX_SIZE_FRAC * short_side)
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def random_scene(rng: np.random.Generator, h: int, w: int, n_objects: int,
                  object_side: int | None = None) -> tuple[np.ndarray, list[dict]]:
    """Sample and paint ``n_objects`` shapes, sized as for an image of short side ``object_side`` (default: this
    image's). A placement that would hide more than 65% of an earlier object, or that lies mostly outside the
    image, is moved (up to 30 times) and then given up."""
    canvas = _background(rng, h, w)
    polys, masks, visible, kinds = [], [], [], []
    for _ in range(n_objects):
        kind = SHAPE_CLASSES[int(rng.integers(len(SHAPE_CLASSES)))]
        size = _sample_size(rng, object_side or min(h, w))
        for _attempt in range(30):  # only the position and angle change: size statistics stay as sampled
            cx, cy = rng.uniform(-0.1 * size, w + 0.1 * size), rng.uniform(-0.1 * size, h + 0.1 * size)
            poly = shape_polygon(Shape(kind, cx, cy, size, rng.uniform(0, 2 * math.pi)))
            full = rasterize_polygons([poly.ravel()], h, w)
            if full.sum() < max(0.6 * size * size, 8):  # mostly outside the image
                continue
            if all((v & ~full).sum() >= 0.35 * m.sum() for v, m in zip(visible, masks)):
                break
        else:
            continue
        # A colour far from what lies underneath, so an object is never camouflaged by accident.
        under = canvas[full].mean(0)
        for _try in range(20):
            color = rng.uniform(0, 255, 3)
            if np.linalg.norm(color - under) > 90:
                break
        _paint(canvas, full, color, TEXTURES[int(rng.integers(len(TEXTURES)))], rng)
        visible = [v & ~full for v in visible] + [full]
        polys, masks, kinds = polys + [poly], masks + [full], kinds + [kind]
    anns = _annotate(polys, masks, min_visible=0.2, min_area=8)
    for kind, ann in zip(kinds, anns):
        if ann is not None:
            ann["category_id"] = SHAPE_CLASSES.index(kind) + 1
    return np.clip(np.round(canvas), 0, 255).astype(np.uint8), [a for a in anns if a is not None]


def scene_hw(image_size) -> tuple[int, int]:
    """``image_size`` (an int or an ``(H, W)`` pair) as ``(H, W)``, each at least 32 px (the smallest shapes)."""
    hw = (image_size, image_size) if isinstance(image_size, int) else tuple(int(v) for v in image_size)
    if len(hw) != 2 or min(hw) < 32:
        raise WinposError(f"image_size={image_size!r} must be an int or (height, width) pair, each >= 32 px; "
                          "smaller images cannot hold the smallest shapes")
    return hw
