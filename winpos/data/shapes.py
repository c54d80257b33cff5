"""The embedded "shapes" dataset: a deterministic, COCO-format instance-segmentation set that trains on a CPU.

Each image has a textured background (gradient, stripes or smooth noise, plus pixel noise) and 1-6 objects of
``SHAPE_CLASSES`` in random colours and textures, so only the outline tells the class. Object sizes span COCO's
small (< 32^2 px), medium and large (>= 96^2 px) areas at the default 256 px. Objects overlap: an instance's
mask is what stays visible after everything drawn above it, and instances left almost fully hidden are dropped.

Masks are COCO polygons. An unoccluded object inside the image keeps its analytic polygon; any other is traced
along pixel edges (``mask_to_polygons``), so pycocotools decodes every annotation back to exactly the pixels
painted in the image. No detectron2 import here: only numpy, PIL and pycocotools.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image
from pycocotools import mask as mask_utils
from winpos.errors import WinposError

__all__ = ["SHAPE_CLASSES", "TEXTURES", "cache_root", "compose_scene", "ensure_shapes_dataset", "generate_shapes",
           "mask_to_polygons", "one_class_json", "rasterize_polygons", "Shape", "shape_polygon", "shapes_val_dir"]

SHAPE_CLASSES: tuple[str, ...] = ("circle", "square", "triangle", "star")
TEXTURES: tuple[str, ...] = ("solid", "gradient", "stripes")
_VERSION = 1  # bump when the generator's output changes: it is part of the cache key
_MANIFEST = "winpos_shapes.json"
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
    h, w = _as_hw(image_size)
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


def _random_scene(rng: np.random.Generator, h: int, w: int, n_objects: int,
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


def _as_hw(image_size) -> tuple[int, int]:
    hw = (image_size, image_size) if isinstance(image_size, int) else tuple(int(v) for v in image_size)
    if len(hw) != 2 or min(hw) < 32:
        raise WinposError(f"image_size={image_size!r} must be an int or (height, width) pair, each >= 32 px; "
                          "smaller images cannot hold the smallest shapes")
    return hw


def generate_shapes(root: str | Path, split: str, num_images: int, image_size=256, seed: int = 0,
                    min_objects: int = 1, max_objects: int = 6, object_side: int | None = None,
                    force: bool = False) -> Path:
    """Write ``root/split/NNNNNN.png`` and ``root/annotations/instances_{split}.json``; return the json path.
    A split already in ``root`` (its json or a non-empty image folder) is refused unless ``force``.

    ``image_size``: int or (height, width). ``object_side``: draw object sizes as for an image of this short side
    (default: the image's own), e.g. a 256 px canvas holding the objects of a 64 px image (``object_side=64``;
    scale ``min_objects`` / ``max_objects`` with the area to keep the density). Image ``i`` depends only on
    (seed, split, i), so a larger ``num_images`` extends a smaller set, and the same arguments give
    byte-identical files.
    """
    h, w = _as_hw(image_size)
    if not split or any(c in split for c in "/\\") or split.startswith("."):
        raise WinposError(f"split={split!r} must be a plain folder name such as 'train' or 'val'")
    if num_images < 1:
        raise WinposError(f"num_images={num_images} must be >= 1")
    if object_side is not None and not (isinstance(object_side, int) and object_side >= 32):
        raise WinposError(f"object_side={object_side!r} must be an int >= 32 px (the short side object sizes are "
                          "drawn for), or None for the image's own")
    if not 0 <= min_objects <= max_objects or max_objects < 1:
        raise WinposError(f"need 0 <= min_objects <= max_objects and max_objects >= 1, got {min_objects}, {max_objects}")
    from winpos.utils.outputs import atomic_write_text, check_output_file

    root = Path(root)
    json_path = root / "annotations" / f"instances_{split}.json"
    check_output_file(json_path, force=force, flag="the shapes dataset's")
    if not force and (root / split).is_dir() and any((root / split).iterdir()):
        raise WinposError(f"the shapes split folder {root / split} already holds files; pass force=True to replace "
                          "them, or choose another root")
    (root / split).mkdir(parents=True, exist_ok=True)
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    for i in range(num_images):
        rng = np.random.default_rng([seed, zlib.crc32(split.encode()), i])
        image, anns = _random_scene(rng, h, w, int(rng.integers(min_objects, max_objects + 1)), object_side)
        file_name = f"{i:06d}.png"
        # noisy pixels barely compress; ensure_shapes_dataset stages a whole dataset and renames it into place
        Image.fromarray(image).save(root / split / file_name, compress_level=1)  # output-policy: split checked above
        images.append({"id": i + 1, "file_name": file_name, "height": h, "width": w, "license": 1})
        for ann in anns:
            annotations.append({"id": len(annotations) + 1, "image_id": i + 1, **ann})
    dataset = {
        "info": {"description": f"winpos shapes v{_VERSION}, split {split}, seed {seed}", "version": str(_VERSION),
                 "year": 2024, "contributor": "winpos", "date_created": "2024-01-01"},
        "licenses": [{"id": 1, "name": "CC0-1.0", "url": "https://creativecommons.org/publicdomain/zero/1.0/"}],
        "images": images,
        "annotations": annotations,
        "categories": [{"id": k + 1, "name": n, "supercategory": "shape"} for k, n in enumerate(SHAPE_CLASSES)],
    }
    atomic_write_text(json_path, json.dumps(dataset, separators=(",", ":")))
    return json_path


def cache_root() -> Path:
    """Where generated datasets and cleaned COCO jsons go: ``$WINPOS_DATA``, else ``~/.cache/winpos``."""
    return Path(os.environ.get("WINPOS_DATA") or Path.home() / ".cache" / "winpos")


def one_class_json(json_path: str | Path) -> Path:
    """The one-class view of a shapes json (every object in class 1, "shape"), written once next to it
    (``<stem>_one_class.json``, atomically); returns its path. Detection without shape classification."""
    from winpos.utils.outputs import atomic_write

    json_path = Path(json_path)
    one = json_path.with_name(json_path.stem + "_one_class.json")
    if not one.is_file():
        data = json.loads(json_path.read_text())
        data["categories"] = [{"id": 1, "name": "shape", "supercategory": "shape"}]
        for ann in data["annotations"]:
            ann["category_id"] = 1
        atomic_write(str(one), lambda f: f.write(json.dumps(data, separators=(",", ":"))), "w")
    return one


def _remove_stale_temps(parent: Path, digest: str) -> None:
    """Delete temp dirs of earlier generations of this dataset whose process is gone (crashed or killed)."""
    for tmp in parent.glob(f".tmp-{digest}-*"):
        try:
            pid = int(tmp.name.split("-")[2])  # .tmp-<digest>-<pid>-<random>
            os.kill(pid, 0)
            continue  # still generating in another process: leave it alone
        except (IndexError, ValueError, ProcessLookupError):
            shutil.rmtree(tmp, ignore_errors=True)
        except PermissionError:
            continue  # alive, owned by another user


def ensure_shapes_dataset(root: str | Path | None = None, train_images: int = 600, val_images: int = 100,
                          image_size=256, seed: int = 0, min_objects: int = 1,
                          max_objects: int = 6, object_side: int | None = None,
                          val_seed: int | None = None) -> dict[str, tuple[Path, Path]]:
    """Generate the shapes dataset once into ``<root>/shapes_v1/<params-hash>/`` and return its paths.

    ``root`` defaults to ``$WINPOS_DATA``, else ``~/.cache/winpos``. Generation goes to a temp dir that is
    renamed into place when complete, so a crashed run is never picked up (its leftover is deleted later);
    a second call finds the finished dir and writes nothing.
    ``val_seed``: draw the ``val`` split from this seed instead of ``seed`` (an evaluation set of its own, e.g. one
    per independent experiment): the ``train`` split is then the one ``seed`` gives, byte for byte, and each split
    is kept in a folder of its own (``<params-hash>`` of that split), so sets that differ only in ``val_seed`` share
    their training images. Images of the two splits come from different random streams (seed, split name, index),
    so an evaluation image is never a training image.
    Returns ``{"shapes_train": (json_path, image_root), "shapes_val": (json_path, image_root)}``.
    """
    plan = _split_plan(root, train_images, val_images, image_size, seed, min_objects, max_objects, object_side,
                       val_seed)
    out = {}
    for split, (final, params, splits) in plan.items():
        _ensure_generated(final, params, splits)
        out[f"shapes_{split}"] = (final / "annotations" / f"instances_{split}.json", final / split)
    return out


def shapes_val_dir(root: str | Path | None = None, *, val_seed: int, **params) -> Path:
    """The folder in which ``ensure_shapes_dataset(root, val_seed=val_seed, **params)`` keeps its ``val`` split (an
    evaluation set of its own), whether or not it has been generated: to remove it once nothing reads it (it is
    made again, byte for byte, when asked for)."""
    return _split_plan(root, val_seed=val_seed, **params)["val"][0]


def _split_plan(root=None, train_images: int = 600, val_images: int = 100, image_size=256, seed: int = 0,
                min_objects: int = 1, max_objects: int = 6, object_side: int | None = None,
                val_seed: int | None = None) -> dict:
    """``{split: (folder, params, {split: (images, seed)})}`` of ``ensure_shapes_dataset``'s arguments: one folder
    for both splits without ``val_seed``, one per split with it."""
    params = {"version": _VERSION, "train_images": train_images, "val_images": val_images,
              "image_size": list(_as_hw(image_size)), "seed": seed, "min_objects": min_objects,
              "max_objects": max_objects}
    if object_side is not None:  # only when set, so the default datasets keep their cache key
        params["object_side"] = object_side
    parent = (Path(root) if root is not None else cache_root()) / "shapes_v1"
    if val_seed is None:
        both = {"train": (train_images, seed), "val": (val_images, seed)}
        return {split: (parent / _digest(params), params, both) for split in ("train", "val")}
    plan = {}
    for split, n, split_seed in (("train", train_images, seed), ("val", val_images, val_seed)):
        one = {k: v for k, v in params.items() if k not in ("train_images", "val_images")}
        one.update(split=split, images=n, seed=split_seed)
        plan[split] = (parent / _digest(one), one, {split: (n, split_seed)})
    return plan


def _digest(params: dict) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:12]


def _ensure_generated(final: Path, params: dict, splits: dict) -> None:
    """``final`` (``<parent>/<digest of params>``) holding ``splits`` (``{split: (images, seed)}``), generated once
    (see ``ensure_shapes_dataset``)."""
    parent, digest = final.parent, final.name
    if not (final / _MANIFEST).is_file():
        parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temps(parent, digest)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{digest}-{os.getpid()}-", dir=parent))
        size = params["image_size"]
        try:
            for split, (n, split_seed) in splits.items():
                generate_shapes(tmp, split, n, size, split_seed, params["min_objects"], params["max_objects"],
                                params.get("object_side"))
            (tmp / _MANIFEST).write_text(json.dumps(params, sort_keys=True))  # output-policy: staging folder
            if final.exists() and not (final / _MANIFEST).is_file():
                shutil.rmtree(final)  # an incomplete dir not made by this function: replace it
            try:
                os.rename(tmp, final)
            except OSError:
                if not (final / _MANIFEST).is_file():
                    raise
                shutil.rmtree(tmp, ignore_errors=True)  # another process finished the same dataset first
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
