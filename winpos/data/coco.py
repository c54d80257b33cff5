"""Check a COCO instances json before training on it, and register it with detectron2 from its cleaned form.

A bad annotation (an empty polygon, a zero-size box, an unknown category) does not fail when a dataset is
registered: it crashes a dataloader worker hours later, or pycocotools during evaluation. ``validate_coco_json``
finds every such entry up front; ``winpos.d2.data.register_coco`` then registers only the clean records, so the
training loader and the COCO evaluator see the same, valid ground truth (``cleaned_json_file``). No detectron2
here: ``winpos.d2.data.register_coco`` does the registration.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

from .images import READABLE_MODES
from .shapes import cache_root
from winpos.errors import WinposError

__all__ = ["cleaned_json_file", "DatasetFileNotFoundError", "validate_coco_json", "ValidationReport"]

logger = logging.getLogger(__name__)

_EXIF_ORIENTATION = 0x0112
_TRANSPOSING_ORIENTATIONS = (5, 6, 7, 8)  # detectron2's read_image applies these, swapping height and width


class DatasetFileNotFoundError(FileNotFoundError, ValueError):
    """A json file or image folder that does not exist: both a FileNotFoundError and a bad-input ValueError."""


@dataclass
class ValidationReport:
    """Outcome of ``validate_coco_json``.

    ``dataset``: the COCO dict with every bad entry removed (unchanged when nothing was wrong);
    ``skipped``: reason -> number of items removed (images, annotations, or polygon rings, per reason);
    ``examples``: the first problems, as sentences naming the entry.
    """

    json_path: Path
    image_root: Path
    dataset: dict
    skipped: Counter = field(default_factory=Counter)
    examples: list = field(default_factory=list)
    filled: Counter = field(default_factory=Counter)  # what was filled in (``area`` from the mask or box)
    notes: list = field(default_factory=list)  # sentences said to the user (filled areas, normalised boxes)
    sha256: str = ""  # of the json file's bytes: a run records it, a resume compares it
    has_masks: bool = False  # some kept annotation (not a crowd) has a segmentation
    has_rle: bool = False  # ... as an RLE: detectron2's mapper then needs mask_format="bitmask"

    @property
    def ok(self) -> bool:
        return not self.skipped

    @property
    def changed(self) -> bool:
        """Whether ``dataset`` differs from the file (entries dropped or fields filled in)."""
        return bool(self.skipped or self.filled)

    def summary(self) -> str:
        counts = ", ".join(f"{reason} x{n}" for reason, n in sorted(self.skipped.items()))
        return f"{sum(self.skipped.values())} problems in {self.json_path} ({counts}); e.g. " + "; ".join(
            self.examples)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _all_numbers(values: list) -> bool:
    """``all(_is_number(v) for v in values)`` at C speed: a polygon ring is checked once per registration, and a
    dataset has millions of coordinates (the embedded set: 1M, 0.6 s per registration before)."""
    kinds = set(map(type, values))
    if not kinds <= {int, float}:  # bool, str, None, lists, numpy scalars...: the exact check decides
        return all(_is_number(v) for v in values)
    return float not in kinds or all(map(math.isfinite, values))


def _image_problem(img: dict, image_root: Path, check_images: bool, decode: bool = False) -> tuple[str, str] | None:
    """(reason, sentence) for a bad ``images`` entry, or None. ``decode``: decode the whole file (a JPEG cut after
    its header opens, and fails only when its pixels are read)."""
    if not (isinstance(img.get("id"), int) and isinstance(img.get("file_name"), str)
            and isinstance(img.get("width"), int) and isinstance(img.get("height"), int)
            and img["width"] > 0 and img["height"] > 0):
        return "image_missing_fields", f"image {img.get('id')!r} needs int id, str file_name, positive int width/height"
    if not check_images:
        return None
    path = image_root / img["file_name"]
    if not path.is_file():
        return "image_file_missing", f"image {img['id']}: file {path} does not exist"
    try:
        with Image.open(path) as im:
            if decode:
                im.load()
            w, h, mode = *im.size, im.mode
            if im.getexif().get(_EXIF_ORIENTATION) in _TRANSPOSING_ORIENTATIONS:
                w, h = h, w
    except Exception as e:  # PIL raises several types for truncated or foreign files
        return "image_file_unreadable", f"image {img['id']}: cannot read {path} ({type(e).__name__}: {e})"
    if mode not in READABLE_MODES:
        return "image_mode_unreadable", (f"image {img['id']}: {path} has PIL mode {mode!r}, which has no range winpos "
                                         "can know; save it as 8-bit or 16-bit RGB / greyscale")
    if (w, h) != (img["width"], img["height"]):
        return "image_size_mismatch", (f"image {img['id']}: {path} is {w}x{h} but the json says "
                                       f"{img['width']}x{img['height']}")
    return None


_TOLERANCE = 0.1  # how far (a fraction of the image's longer side, plus 1 px) a box or polygon may pass its edges


def _bounds(img: dict) -> tuple[float, float, float]:
    """``(tol, width + tol, height + tol)``: coordinates in ``[-tol, width + tol]`` x ``[-tol, height + tol]``
    are within the image."""
    tol = _TOLERANCE * max(img["width"], img["height"]) + 1.0
    return tol, img["width"] + tol, img["height"] + tol


def _rle_counts(counts) -> list[int] | None:
    """The run lengths of an RLE's ``counts``: a list of ints as given (uncompressed), or decoded from COCO's
    compressed string (6-bit characters from '0', 5 bits of value each, 0x20 continues, 0x10 the sign of the last,
    from the third run on a difference to the run two before); None when malformed."""
    if isinstance(counts, list):
        return counts if all(type(v) is int for v in counts) else None
    if not isinstance(counts, str):
        return None
    runs, i, n = [], 0, len(counts)
    while i < n:
        value, k, more = 0, 0, True
        while more:
            if i >= n:
                return None
            c = ord(counts[i]) - 48
            if not 0 <= c < 64:
                return None
            value |= (c & 0x1F) << (5 * k)
            more = bool(c & 0x20)
            i, k = i + 1, k + 1
            if not more and c & 0x10:
                value |= -1 << (5 * k)
        if len(runs) > 2:
            value += runs[-2]
        runs.append(value)
    return runs


def _polygon_area(rings) -> float:
    """Area of polygon rings (summed, each by the shoelace formula), as detectron2 computes a missing ``area``."""
    total = 0.0
    for ring in rings:
        xs, ys = ring[0::2], ring[1::2]
        total += 0.5 * abs(sum(xs[i] * ys[i - 1] - ys[i] * xs[i - 1] for i in range(len(xs))))
    return total


def _clean_segmentation(ann: dict, img: dict, skipped: Counter, note) -> tuple[object, str | None, float]:
    """Return (segmentation with bad polygon rings removed, reason to drop the annotation or None, mask area)."""
    segm, aid = ann["segmentation"], ann["id"]
    h, w = img["height"], img["width"]
    if isinstance(segm, dict):
        size = segm.get("size")
        if "counts" not in segm or not isinstance(size, list) or size != [h, w]:
            note("segmentation_malformed", f"annotation {aid}: RLE needs 'counts' and size "
                                           f"[{h}, {w}], got size {size!r}")
            return segm, "segmentation_malformed", 0.0
        runs = _rle_counts(segm["counts"])
        if runs is None or any(r < 0 for r in runs) or sum(runs) != h * w:
            got = "malformed counts" if runs is None else \
                ("a negative run" if any(r < 0 for r in runs) else f"runs summing to {sum(runs)}")
            note("rle_invalid", f"annotation {aid}: its RLE has {got}, not runs covering the {h}x{w} = {h * w} "
                                "pixels of its image")
            return segm, "rle_invalid", 0.0
        return segm, None, float(sum(runs[1::2]))
    if not isinstance(segm, list):
        note("segmentation_malformed", f"annotation {aid}: segmentation must be a list of polygons or an RLE dict")
        return segm, "segmentation_malformed", 0.0
    if len(segm) == 0:
        note("empty_segmentation", f"annotation {aid}: segmentation is an empty list")
        return segm, "empty_segmentation", 0.0
    rings = []
    tol, right, bottom = _bounds(img)
    for ring in segm:
        if not isinstance(ring, list) or not _all_numbers(ring):
            skipped["polygon_malformed"] += 1
            note(None, f"annotation {aid}: a polygon is not a flat list of finite numbers")
        elif len(ring) < 6 or len(ring) % 2:
            skipped["polygon_too_few_points"] += 1
            note(None, f"annotation {aid}: a polygon has {len(ring)} coordinates; it needs x,y pairs of >= 3 points")
        elif min(ring[0::2]) < -tol or max(ring[0::2]) > right or min(ring[1::2]) < -tol or max(ring[1::2]) > bottom:
            skipped["polygon_outside_image"] += 1
            note(None, f"annotation {aid}: a polygon reaches ({max(ring[0::2], key=abs):.4g}, "
                       f"{max(ring[1::2], key=abs):.4g}), outside its {w}x{h} image")
        else:
            rings.append(ring)
    if not rings:
        note("no_valid_polygon", f"annotation {aid}: no polygon with >= 3 points within its image is left")
        return segm, "no_valid_polygon", 0.0
    return rings, None, _polygon_area(rings)


def _box_problem(aid, box: list, img: dict) -> tuple[str, str] | None:
    """(reason, sentence) for a box that lies outside its image or passes its edges by more than the tolerance."""
    x0, y0, x1, y1 = box[0], box[1], box[0] + box[2], box[1] + box[3]
    w, h = img["width"], img["height"]
    if x1 <= 0 or y1 <= 0 or x0 >= w or y0 >= h:
        return "bbox_outside_image", f"annotation {aid}: bbox {box} lies outside its {w}x{h} image"
    tol, right, bottom = _bounds(img)
    if x0 < -tol or y0 < -tol or x1 > right or y1 > bottom:
        return "bbox_beyond_image", f"annotation {aid}: bbox {box} reaches far beyond its {w}x{h} image"
    return None


def _decode_stamp(images: list, image_root: Path) -> Path | None:
    """A file whose existence says that every image ``images`` lists (names, sizes, modification times as they
    are now) was decoded whole before: decoding a large dataset takes minutes, once."""
    import os

    h = hashlib.sha256(str(image_root.resolve()).encode())
    for img in images:
        name = img.get("file_name") if isinstance(img, dict) else None
        if not isinstance(name, str):
            continue
        try:
            st = os.stat(image_root / name)
            h.update(f"{name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        except (OSError, ValueError):
            h.update(f"{name}\0missing\n".encode())
    return Path(cache_root()) / "decoded" / h.hexdigest()


def validate_coco_json(json_path, image_root, on_error: str = "raise", check_images: bool = True,
                       max_examples: int = 5) -> ValidationReport:
    """Check a COCO instances json and the images it names.

    Problems found (what pycocotools and detectron2's mapper would otherwise meet: a crash, a hang, or a silently
    wrong AP): missing image files, files that do not decode whole (a JPEG cut after its header; decoded once, then
    remembered by name, size and time in the cache), images in a PIL mode ``winpos.data.images`` refuses, images
    whose size differs from the json, duplicate ids, annotations on unknown image ids or category ids, missing,
    malformed, zero-size or negative boxes, boxes outside their image or reaching beyond it by more than a
    tolerance (10% of its longer side + 1 px), empty segmentations, polygons with fewer than 3 points or outside
    their image (the same tolerance), RLEs whose size is not the image's or whose runs (uncompressed, or decoded
    from the compressed string) do not cover its pixels exactly, an ``area`` that is not a positive number, and
    annotations without a segmentation in a dataset that has them (detectron2's mapper fails on such a mix).
    A missing ``area`` is filled from the mask (or the box) as detectron2 does, and said; boxes all within 0..1
    (normalised coordinates) are said. ``report.sha256`` is the file's, ``has_masks`` / ``has_rle`` what the kept
    objects carry. A json nested too deeply to read is one line.

    ``on_error="raise"``: ValueError listing counts per reason and the first ``max_examples`` problems.
    ``on_error="skip"``: drop the bad entries (the annotations of a dropped image with it), log a warning to
    the "winpos" logger, and return them counted in the report. A missing file or folder, or a json without
    ``images``/``annotations``/``categories`` lists, always raises.
    """
    if on_error not in ("raise", "skip"):
        raise WinposError(f"on_error={on_error!r}; choose 'raise' (stop on bad annotations) or 'skip' (drop them)")
    json_path, image_root = Path(json_path), Path(image_root)
    if not json_path.is_file():
        raise DatasetFileNotFoundError(
            f"COCO json {json_path} does not exist; check the path, or generate the embedded dataset with "
            "winpos.data.ensure_shapes_dataset()")
    if not image_root.is_dir():
        raise DatasetFileNotFoundError(
            f"image folder {image_root} (for {json_path}) does not exist; pass the folder that holds the images "
            "whose file_name the json lists")
    raw = json_path.read_bytes()
    try:
        data = json.loads(raw.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise WinposError(f"{json_path} is not valid json ({e}); re-export or re-download it") from None
    except RecursionError:
        raise WinposError(f"{json_path} is not a COCO json (its lists or objects are nested too deeply to read); "
                          "re-export or re-download it") from None
    missing = [k for k in ("images", "annotations", "categories") if not isinstance(
        data.get(k) if isinstance(data, dict) else None, list)]
    if missing:
        raise WinposError(f"{json_path} has no {missing} list(s); a COCO instances file needs 'images', "
                          "'annotations' and 'categories'")
    cats = data["categories"]
    cat_ids = [c.get("id") if isinstance(c, dict) else None for c in cats]
    if not cats or not all(isinstance(i, int) and isinstance(c.get("name"), str) for i, c in zip(cat_ids, cats)) \
            or len(set(cat_ids)) != len(cat_ids):
        raise WinposError(f"{json_path}: 'categories' must be a non-empty list of {{'id': int, 'name': str}} with "
                          f"unique ids, got ids {cat_ids[:10]}")

    skipped, examples, filled = Counter(), [], Counter()

    def note(reason: str | None, sentence: str) -> None:
        if reason is not None:
            skipped[reason] += 1
        if len(examples) < max_examples:
            examples.append(sentence)

    stamp = _decode_stamp(data["images"], image_root) if check_images else None
    decode = stamp is not None and not stamp.is_file()
    images = {}
    for img in data["images"]:
        img = img if isinstance(img, dict) else {}
        problem = _image_problem(img, image_root, check_images, decode)
        if problem is None and img["id"] in images:
            problem = "duplicate_image_id", f"image id {img['id']} appears more than once"
        if problem is not None:
            note(*problem)
        else:
            images[img["id"]] = img
    listed_image_ids = {i.get("id") for i in data["images"] if isinstance(i, dict)}
    known_cats, ann_ids, annotations = set(cat_ids), set(), []
    anns = [a if isinstance(a, dict) else {} for a in data["annotations"]]
    has_segm = any("segmentation" in a for a in anns)
    for ann in anns:
        aid, iid, box = ann.get("id"), ann.get("image_id"), ann.get("bbox")
        if not all(k in ann for k in ("id", "image_id", "category_id", "bbox")):
            note("annotation_missing_fields", f"annotation {aid!r} lacks one of id, image_id, category_id, bbox")
            continue
        if aid in ann_ids:
            note("duplicate_annotation_id", f"annotation id {aid} appears more than once")
            continue
        ann_ids.add(aid)
        if iid not in images:
            if iid in listed_image_ids:
                note("annotation_of_skipped_image", f"annotation {aid}: its image {iid} was dropped")
            else:
                note("unknown_image_id", f"annotation {aid}: image_id {iid!r} is not in 'images'")
            continue
        if ann["category_id"] not in known_cats:
            note("unknown_category_id", f"annotation {aid}: category_id {ann['category_id']!r} is not in "
                                        f"categories {sorted(known_cats)[:10]}")
            continue
        if not (isinstance(box, list) and len(box) == 4 and all(_is_number(v) for v in box)):
            note("bbox_malformed", f"annotation {aid}: bbox {box!r} is not 4 finite numbers [x, y, w, h]")
            continue
        if box[2] <= 0 or box[3] <= 0:
            note("bbox_empty_or_negative", f"annotation {aid}: bbox {box} has width or height <= 0")
            continue
        problem = _box_problem(aid, box, images[iid])
        if problem is not None:
            note(*problem)
            continue
        segm, area = None, float(box[2]) * float(box[3])  # detectron2 fills a missing area from the mask or box
        if "segmentation" not in ann:
            if has_segm:
                note("missing_segmentation", f"annotation {aid} has no segmentation while others have one")
                continue
        else:
            segm, reason, mask_area = _clean_segmentation(ann, images[iid], skipped, note)
            if reason is not None:
                continue
            area = mask_area
        if "area" in ann and not _is_number(ann["area"]):
            note("area_malformed", f"annotation {aid}: area {ann['area']!r} is not a finite number")
            continue
        if "area" in ann and ann["area"] <= 0:
            note("area_not_positive", f"annotation {aid}: area {ann['area']} is not positive (the evaluation "
                                      "would ignore the object)")
            continue
        kept = ann if segm is None or segm is ann["segmentation"] else {**ann, "segmentation": segm}
        if "area" not in ann:
            filled["area"] += 1
            kept = {**kept, "area": area}
        annotations.append(kept)

    report = ValidationReport(json_path, image_root, data, skipped, examples, filled,
                              sha256=hashlib.sha256(raw).hexdigest())
    if skipped and on_error == "raise":
        raise WinposError(report.summary() + ". Fix these entries, or pass on_error='skip' to drop them.")
    if decode and not any(r.startswith("image_file") for r in skipped):
        _write_stamp(stamp)
    crowd = [a for a in annotations if a.get("iscrowd", 0)]
    objects = [a for a in annotations if not a.get("iscrowd", 0)]
    report.has_masks = any("segmentation" in a for a in objects)
    report.has_rle = any(isinstance(a.get("segmentation"), dict) for a in objects)
    if filled:
        report.notes.append(f"{json_path}: {filled['area']} annotations have no 'area'; filled from their mask (or "
                            "box where they have none), as detectron2 does")
    boxes = [a["bbox"] for a in objects + crowd]
    if boxes and all(b[0] + b[2] <= 1.0 and b[1] + b[3] <= 1.0 for b in boxes) \
            and max(max(i["width"], i["height"]) for i in images.values()) > 2:
        report.notes.append(f"{json_path}: every box lies within 0..1: normalised coordinates? COCO boxes are "
                            "[x, y, width, height] in pixels; multiply by the image's width and height")
    for sentence in report.notes:
        logger.warning(sentence)
    if skipped:
        logger.warning("skipped bad entries: %s", report.summary())
    if report.changed:
        report.dataset = {**data, "images": list(images.values()), "annotations": annotations}
    return report


def _write_stamp(stamp: Path) -> None:
    """Leave ``stamp`` (``_decode_stamp``); a cache that cannot be written means decoding again next time."""
    from winpos.utils.outputs import atomic_write_text

    try:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(stamp, "decoded whole\n")
    except OSError:
        pass


def cleaned_json_file(report: ValidationReport, name: str, json_path, cache_dir=None) -> Path:
    """The json a loader and the COCO evaluator should read for ``report`` (``validate_coco_json``'s outcome).

    ``json_path`` itself when nothing was skipped; otherwise the cleaned json, written once (atomically) to
    ``<cache_dir>/cleaned/<name>-<hash>.json``, ``cache_dir`` defaulting to $WINPOS_DATA or ~/.cache/winpos.
    ``winpos.d2.data.register_coco`` registers a dataset from it.
    """
    from winpos.utils.outputs import atomic_write

    if not report.changed:
        return Path(json_path)
    text = json.dumps(report.dataset, separators=(",", ":"))
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    json_file = Path(cache_dir or cache_root()) / "cleaned" / f"{name}-{digest}.json"
    if not json_file.is_file():
        json_file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(str(json_file), lambda f: f.write(text), "w")
    return json_file
