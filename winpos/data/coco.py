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

    @property
    def ok(self) -> bool:
        return not self.skipped

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


def _image_problem(img: dict, image_root: Path, check_images: bool) -> tuple[str, str] | None:
    """(reason, sentence) for a bad ``images`` entry, or None."""
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


def _clean_segmentation(ann: dict, img: dict, skipped: Counter, note) -> tuple[object, str | None]:
    """Return (segmentation with bad polygon rings removed, reason to drop the annotation or None)."""
    segm, aid = ann["segmentation"], ann["id"]
    if isinstance(segm, dict):
        size = segm.get("size")
        if "counts" not in segm or list(size or []) != [img["height"], img["width"]]:
            note("segmentation_malformed", f"annotation {aid}: RLE needs 'counts' and size "
                                           f"[{img['height']}, {img['width']}], got size {size!r}")
            return segm, "segmentation_malformed"
        return segm, None
    if not isinstance(segm, list):
        note("segmentation_malformed", f"annotation {aid}: segmentation must be a list of polygons or an RLE dict")
        return segm, "segmentation_malformed"
    if len(segm) == 0:
        note("empty_segmentation", f"annotation {aid}: segmentation is an empty list")
        return segm, "empty_segmentation"
    rings = []
    for ring in segm:
        if not isinstance(ring, list) or not _all_numbers(ring):
            skipped["polygon_malformed"] += 1
            note(None, f"annotation {aid}: a polygon is not a flat list of finite numbers")
        elif len(ring) < 6 or len(ring) % 2:
            skipped["polygon_too_few_points"] += 1
            note(None, f"annotation {aid}: a polygon has {len(ring)} coordinates; it needs x,y pairs of >= 3 points")
        else:
            rings.append(ring)
    if not rings:
        note("no_valid_polygon", f"annotation {aid}: no polygon with >= 3 points is left")
        return segm, "no_valid_polygon"
    return rings, None


def validate_coco_json(json_path, image_root, on_error: str = "raise", check_images: bool = True,
                       max_examples: int = 5) -> ValidationReport:
    """Check a COCO instances json and the images it names.

    Problems found: missing or unreadable image files, images in a PIL mode ``winpos.data.images`` refuses, images
    whose size differs from the json, duplicate ids,
    annotations on unknown image ids or category ids, missing, malformed, zero-size or negative boxes, empty
    segmentations, polygons with fewer than 3 points, and annotations without a segmentation in a dataset that
    has them (detectron2's mapper fails on such a mix).

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
    try:
        data = json.loads(json_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise WinposError(f"{json_path} is not valid json ({e}); re-export or re-download it") from e
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

    skipped, examples = Counter(), []

    def note(reason: str | None, sentence: str) -> None:
        if reason is not None:
            skipped[reason] += 1
        if len(examples) < max_examples:
            examples.append(sentence)

    images = {}
    for img in data["images"]:
        img = img if isinstance(img, dict) else {}
        problem = _image_problem(img, image_root, check_images)
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
        if "segmentation" not in ann:
            if has_segm:
                note("missing_segmentation", f"annotation {aid} has no segmentation while others have one")
                continue
            annotations.append(ann)
            continue
        segm, reason = _clean_segmentation(ann, images[iid], skipped, note)
        if reason is None:
            annotations.append(ann if segm is ann["segmentation"] else {**ann, "segmentation": segm})

    report = ValidationReport(json_path, image_root, data, skipped, examples)
    if skipped and on_error == "raise":
        raise WinposError(report.summary() + ". Fix these entries, or pass on_error='skip' to drop them.")
    if skipped:
        logger.warning("skipped bad entries: %s", report.summary())
        report.dataset = {**data, "images": list(images.values()), "annotations": annotations}
    return report


def cleaned_json_file(report: ValidationReport, name: str, json_path, cache_dir=None) -> Path:
    """The json a loader and the COCO evaluator should read for ``report`` (``validate_coco_json``'s outcome).

    ``json_path`` itself when nothing was skipped; otherwise the cleaned json, written once (atomically) to
    ``<cache_dir>/cleaned/<name>-<hash>.json``, ``cache_dir`` defaulting to $WINPOS_DATA or ~/.cache/winpos.
    ``winpos.d2.data.register_coco`` registers a dataset from it.
    """
    from winpos.outputs import atomic_write

    if report.ok:
        return Path(json_path)
    text = json.dumps(report.dataset, separators=(",", ":"))
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    json_file = Path(cache_dir or cache_root()) / "cleaned" / f"{name}-{digest}.json"
    if not json_file.is_file():
        json_file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(str(json_file), lambda f: f.write(text), "w")
    return json_file
