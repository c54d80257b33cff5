"""The embedded shapes dataset and checked COCO registration.

Oracles: pycocotools (``COCO``, ``COCOeval``, ``mask.frPyObjects``/``decode``) decodes every annotation
independently of the generator; detectron2's ``DatasetCatalog``, ``load_coco_json`` and ``DatasetMapper``
consume the registered records.
"""
import contextlib
import io
import json
import logging
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, strategies as st
from PIL import Image
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from tests.conftest import require
from winpos.data import (
    SHAPE_CLASSES, DatasetFileNotFoundError, Shape, compose_scene, ensure_shapes_dataset, generate_shapes,
    mask_to_polygons, validate_coco_json,
)
from winpos.data import scenes
from winpos.data import shapes as shapes_module


def _decode(segm, h, w):
    return mask_utils.decode(mask_utils.merge(mask_utils.frPyObjects(segm, h, w))).astype(bool)


def _quiet_coco(path):
    with contextlib.redirect_stdout(io.StringIO()):
        return COCO(str(path))


@pytest.fixture(scope="module")
def small_set(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    return root, generate_shapes(root, "train", 20, image_size=128, seed=3)


def test_same_seed_gives_byte_identical_files(tmp_path, small_set):
    root, json_path = small_set
    again = generate_shapes(tmp_path / "a", "train", 20, image_size=128, seed=3)
    assert again.read_bytes() == json_path.read_bytes()
    assert (tmp_path / "a/train/000007.png").read_bytes() == (root / "train/000007.png").read_bytes()
    other = generate_shapes(tmp_path / "b", "train", 20, image_size=128, seed=4)
    assert other.read_bytes() != json_path.read_bytes()
    val = generate_shapes(tmp_path / "b", "val", 20, image_size=128, seed=3)
    assert val.read_bytes() != json_path.read_bytes()  # splits draw different images from one seed


def test_pycocotools_loads_it_with_every_category(small_set):
    root, json_path = small_set
    coco = _quiet_coco(json_path)
    data = json.loads(json_path.read_text())
    assert set(data) >= {"info", "licenses", "images", "annotations", "categories"}
    assert [c["id"] for c in data["categories"]] == list(range(1, len(SHAPE_CLASSES) + 1))
    assert [c["name"] for c in data["categories"]] == list(SHAPE_CLASSES)
    assert len(coco.getImgIds()) == 20
    for cat_id in coco.getCatIds():
        assert len(coco.getAnnIds(catIds=[cat_id])) > 0, f"category {cat_id} has no instance"
    for img in coco.loadImgs(coco.getImgIds()):
        with Image.open(root / "train" / img["file_name"]) as im:
            assert im.size == (img["width"], img["height"]) == (128, 128) and im.mode == "RGB"


def test_masks_are_exact_disjoint_and_inside_their_boxes(small_set):
    _, json_path = small_set
    coco = _quiet_coco(json_path)
    for img_id in coco.getImgIds():
        union = np.zeros((128, 128), int)
        for ann in coco.loadAnns(coco.getAnnIds(imgIds=[img_id])):
            assert all(len(p) >= 6 and len(p) % 2 == 0 for p in ann["segmentation"])
            mask = coco.annToMask(ann).astype(bool)
            assert mask.sum() == ann["area"] >= 8
            x, y, w, h = ann["bbox"]
            assert w > 0 and h > 0 and x >= 0 and y >= 0 and x + w <= 128 and y + h <= 128
            ys, xs = np.nonzero(mask)
            # A pixel (x, y) covers [x, x+1]; pycocotools includes it when the polygon covers its middle.
            assert xs.min() >= math.floor(x) and xs.max() + 1 <= math.ceil(x + w)
            assert ys.min() >= math.floor(y) and ys.max() + 1 <= math.ceil(y + h)
            union += mask
        assert union.max() <= 1, f"image {img_id}: two instances claim the same pixel"


def test_small_medium_and_large_all_present_and_gt_scores_ap_1(tmp_path):
    json_path = generate_shapes(tmp_path, "val", 16, image_size=256, seed=0)  # default size: COCO's areas are absolute
    coco = _quiet_coco(json_path)
    areas = np.array([a["area"] for a in coco.dataset["annotations"]])
    assert (areas < 32**2).any() and ((areas >= 32**2) & (areas < 96**2)).any() and (areas >= 96**2).any()
    for iou_type in ("segm", "bbox"):
        coco = _quiet_coco(json_path)  # COCOeval turns ground-truth polygons into RLEs in place: reload
        dets = [{**a, "score": 1.0} for a in json.loads(json_path.read_text())["annotations"]]
        with contextlib.redirect_stdout(io.StringIO()):
            ev = COCOeval(coco, coco.loadRes(dets), iou_type)
            ev.evaluate(), ev.accumulate(), ev.summarize()
        # stats[0] AP, [3:6] AP small/medium/large; -1 would mean no ground truth in that range.
        np.testing.assert_allclose(ev.stats[[0, 3, 4, 5]], 1.0)


def test_occluded_instance_excludes_its_occluder_and_hidden_ones_drop():
    square = Shape("square", 50, 50, 50, angle=0.0, color=(220, 30, 30))
    hidden = Shape("triangle", 50, 52, 8, color=(30, 30, 220))
    star = Shape("star", 60, 45, 14, angle=0.3, color=(30, 220, 30))  # inside the square: leaves a hole in it
    circle = Shape("circle", 78, 78, 36, color=(240, 240, 20))  # covers the square's bottom-right corner
    cover = Shape("square", 50, 54, 12, color=(20, 200, 200))  # hides ``hidden`` completely
    edge = Shape("circle", 118, 10, 30, color=(250, 120, 0))  # cut by the image border
    shapes = [square, hidden, cover, star, circle, edge]
    image, anns = compose_scene(shapes, (100, 120), np.random.default_rng(0))
    h, w = 100, 120

    def full(s):
        return _decode([scenes.shape_polygon(s).ravel().tolist()], h, w)

    # Pixels of a dropped instance still hide what lies below: they belong to no mask.
    expected_square = full(square) & ~full(hidden) & ~full(cover) & ~full(star) & ~full(circle)
    assert anns[1] is None, "a fully hidden instance must be dropped"
    np.testing.assert_array_equal(_decode(anns[0]["segmentation"], h, w), expected_square)
    assert anns[0]["area"] == expected_square.sum() and anns[0]["category_id"] == 2
    np.testing.assert_array_equal(_decode(anns[4]["segmentation"], h, w), full(circle) & ~full(edge))
    assert anns[3]["segmentation"] == [scenes.shape_polygon(star).ravel().tolist()]  # whole: analytic
    assert anns[5]["bbox"][0] + anns[5]["bbox"][2] <= w and anns[5]["bbox"][1] == 0  # traced, clipped at border
    # The pixels follow the masks: each instance's visible pixels carry its own colour (noise is <= ~30).
    for shape, ann in zip(shapes, anns):
        if ann is not None:
            pixels = image[_decode(ann["segmentation"], h, w)].astype(float)
            assert np.abs(np.median(pixels, 0) - shape.color).max() < 30, shape


def _random_mask(seed, h, w, density):
    rng = np.random.default_rng(seed)
    return rng.random((h, w)) < density


@given(st.integers(0, 2**31), st.integers(1, 24), st.integers(1, 24), st.floats(0.05, 0.95))
def test_mask_to_polygons_decodes_back_exactly(seed, h, w, density):
    mask = _random_mask(seed, h, w, density)
    polys = mask_to_polygons(mask)
    assert all(len(p) >= 8 for p in polys)  # pixel-edge rings have >= 4 corners
    if mask.any():
        np.testing.assert_array_equal(_decode(polys, h, w), mask)
    else:
        assert polys == []


def test_mask_to_polygons_opens_nested_holes():
    mask = np.zeros((15, 15), bool)
    mask[1:14, 1:14] = True
    mask[3:12, 3:12] = False  # hole
    mask[5:10, 5:10] = True  # island in the hole
    mask[7, 7] = False  # hole in the island
    np.testing.assert_array_equal(_decode(mask_to_polygons(mask), 15, 15), mask)


_CRASH = """
import os, sys
from winpos.data import shapes
real = shapes.generate_shapes
def crash(root, split, *a, **k):
    real(root, split, *a, **k)
    os._exit(3)  # killed after writing half the dataset: no cleanup runs
shapes.generate_shapes = crash
shapes.ensure_shapes_dataset(sys.argv[1], train_images=4, val_images=2, image_size=64)
"""


def test_cache_is_atomic_and_second_call_is_a_noop(tmp_path, monkeypatch):
    params = dict(train_images=4, val_images=2, image_size=64)
    crashed = subprocess.run([sys.executable, "-c", _CRASH, str(tmp_path)], cwd=Path(__file__).parents[2])
    assert crashed.returncode == 3
    parent = tmp_path / "shapes_v1"
    leftovers = list(parent.glob(".tmp-*"))
    assert len(leftovers) == 1 and (leftovers[0] / "train").is_dir()
    assert not [p for p in parent.iterdir() if not p.name.startswith(".")], "a crashed run must not look finished"
    live = parent / f"{leftovers[0].name.rsplit('-', 2)[0]}-{os.getpid()}-live"
    live.mkdir()  # another process (alive) generating the same dataset: must be left alone

    paths = ensure_shapes_dataset(tmp_path, **params)
    assert not leftovers[0].exists() and live.is_dir()
    assert set(paths) == {"shapes_train", "shapes_val"}
    for json_path, image_root in paths.values():
        coco = _quiet_coco(json_path)
        assert all((image_root / i["file_name"]).is_file() for i in coco.dataset["images"])
    assert len(_quiet_coco(paths["shapes_train"][0]).dataset["images"]) == 4
    stamp = {p: p.stat().st_mtime_ns for p in paths["shapes_train"][1].parent.rglob("*")}

    def must_not_run(*a, **k):
        raise AssertionError("second call regenerated the dataset")

    monkeypatch.setattr(shapes_module, "generate_shapes", must_not_run)
    assert ensure_shapes_dataset(tmp_path, **params) == paths
    assert stamp == {p: p.stat().st_mtime_ns for p in paths["shapes_train"][1].parent.rglob("*")}
    monkeypatch.setenv("WINPOS_DATA", str(tmp_path))
    assert ensure_shapes_dataset(**params) == paths  # $WINPOS_DATA is the default root


# ---- validate_coco_json / register_coco -------------------------------------------------------------------

def _write_good(root: Path) -> tuple[Path, Path]:
    (root / "img").mkdir(parents=True)
    for name in ("a.png", "b.png"):
        Image.new("RGB", (40, 30), (10, 20, 30)).save(root / "img" / name)
    sq = [2, 2, 12, 2, 12, 12, 2, 12]
    data = {
        "info": {}, "licenses": [],
        "images": [{"id": 1, "file_name": "a.png", "width": 40, "height": 30},
                   {"id": 2, "file_name": "b.png", "width": 40, "height": 30}],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 1, "bbox": [2, 2, 10, 10], "area": 100, "iscrowd": 0,
             "segmentation": [sq]},
            {"id": 2, "image_id": 1, "category_id": 2, "bbox": [20, 5, 10, 10], "area": 100, "iscrowd": 0,
             "segmentation": [[20, 5, 30, 5, 30, 15, 20, 15]]},
            {"id": 3, "image_id": 2, "category_id": 1, "bbox": [2, 2, 10, 10], "area": 100, "iscrowd": 0,
             "segmentation": [sq]},
        ],
        "categories": [{"id": 1, "name": "x"}, {"id": 2, "name": "y"}],
    }
    (root / "ann.json").write_text(json.dumps(data))
    return root / "ann.json", root / "img"


def _ann(data, i):
    return data["annotations"][i]


BAD_CASES = {  # name: (mutation of the good dataset, reason, expected surviving annotation ids)
    "empty_polygon": (lambda d, r: _ann(d, 1).update(segmentation=[]), "empty_segmentation", [1, 3]),
    "polygon_2_points": (lambda d, r: _ann(d, 1).update(segmentation=[[20, 5, 30, 5]]), "polygon_too_few_points",
                         [1, 3]),
    "one_bad_ring_of_two": (lambda d, r: _ann(d, 1)["segmentation"].append([1, 1, 2, 2]),
                            "polygon_too_few_points", [1, 2, 3]),
    "zero_area_box": (lambda d, r: _ann(d, 0).update(bbox=[2, 2, 0, 10]), "bbox_empty_or_negative", [2, 3]),
    "negative_box": (lambda d, r: _ann(d, 0).update(bbox=[2, 2, 10, -4]), "bbox_empty_or_negative", [2, 3]),
    "malformed_box": (lambda d, r: _ann(d, 0).update(bbox=[2, 2, 10]), "bbox_malformed", [2, 3]),
    "unknown_category": (lambda d, r: _ann(d, 2).update(category_id=7), "unknown_category_id", [1, 2]),
    "unknown_image": (lambda d, r: _ann(d, 2).update(image_id=9), "unknown_image_id", [1, 2]),
    "duplicate_ann_id": (lambda d, r: _ann(d, 2).update(id=1), "duplicate_annotation_id", [1, 2]),
    "rle_of_wrong_size": (lambda d, r: _ann(d, 0).update(segmentation={"counts": "PP0", "size": [10, 10]}),
                          "segmentation_malformed", [2, 3]),
    "missing_segmentation": (lambda d, r: _ann(d, 2).pop("segmentation"), "missing_segmentation", [1, 2]),
    "missing_image_file": (lambda d, r: (r / "b.png").unlink(), "image_file_missing", [1, 2]),
    "unreadable_image": (lambda d, r: (r / "b.png").write_bytes(b"not a png"), "image_file_unreadable", [1, 2]),
    "image_size_mismatch": (lambda d, r: d["images"][1].update(width=41), "image_size_mismatch", [1, 2]),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_validate_catches_each_problem_in_both_modes(tmp_path, case, caplog):
    json_path, image_root = _write_good(tmp_path)
    data = json.loads(json_path.read_text())
    mutate, reason, survivors = BAD_CASES[case]
    mutate(data, image_root)
    json_path.write_text(json.dumps(data))

    with pytest.raises(ValueError, match=reason) as info:
        validate_coco_json(json_path, image_root, on_error="raise")
    assert str(json_path) in str(info.value) and "on_error='skip'" in str(info.value)

    with caplog.at_level(logging.WARNING, logger="winpos"):
        report = validate_coco_json(json_path, image_root, on_error="skip")
    assert report.skipped[reason] >= 1 and reason in caplog.text
    assert [a["id"] for a in report.dataset["annotations"]] == survivors
    clean = json.loads(json.dumps(report.dataset))
    assert all(len(p) >= 6 for a in clean["annotations"] for p in a["segmentation"])
    coco = COCO.__new__(COCO)  # the cleaned dict indexes and rasterizes in pycocotools
    coco.dataset, coco.anns, coco.imgs = clean, {}, {}
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    for ann in clean["annotations"]:
        assert coco.annToMask(ann).sum() > 0


def test_validate_passes_good_data_and_names_missing_paths(tmp_path):
    json_path, image_root = _write_good(tmp_path)
    report = validate_coco_json(json_path, image_root)
    assert report.ok and report.dataset == json.loads(json_path.read_text())
    with pytest.raises(DatasetFileNotFoundError, match="nope.json") as info:
        validate_coco_json(tmp_path / "nope.json", image_root)
    assert isinstance(info.value, ValueError) and isinstance(info.value, FileNotFoundError)
    with pytest.raises(ValueError, match="image folder .*missing_dir"):
        validate_coco_json(json_path, tmp_path / "missing_dir")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ValueError, match="not valid json"):
        validate_coco_json(tmp_path / "broken.json", image_root)
    (tmp_path / "nocats.json").write_text(json.dumps({"images": [], "annotations": []}))
    with pytest.raises(ValueError, match="categories"):
        validate_coco_json(tmp_path / "nocats.json", image_root)
    with pytest.raises(ValueError, match="on_error"):
        validate_coco_json(json_path, image_root, on_error="ignore")


def test_register_coco_serves_cleaned_records(tmp_path):
    d2data = require("detectron2.data")
    from winpos.d2.data import register_coco
    DatasetCatalog, MetadataCatalog = d2data.DatasetCatalog, d2data.MetadataCatalog
    json_path, image_root = _write_good(tmp_path)
    data = json.loads(json_path.read_text())
    data["annotations"][1]["segmentation"] = [[20, 5, 30, 5]]  # < 3 points: would be dropped
    data["annotations"][2]["category_id"] = 7  # unknown: would crash load_coco_json's id map
    json_path.write_text(json.dumps(data))
    name = "winpos_test_register"
    try:
        for _ in range(2):  # registering the same name twice replaces it
            report = register_coco(name, json_path, image_root, cache_dir=tmp_path / "cache")
        assert report.skipped["polygon_too_few_points"] == 1 and report.skipped["unknown_category_id"] == 1
        records = DatasetCatalog.get(name)
        assert [r["image_id"] for r in records] == [1, 2]
        assert records[0]["file_name"] == str(image_root / "a.png")
        assert [len(r["annotations"]) for r in records] == [1, 0]
        assert records[0]["annotations"][0]["category_id"] == 0  # contiguous id of category 1
        meta = MetadataCatalog.get(name)
        assert meta.thing_classes == ["x", "y"] and meta.evaluator_type == "coco"
        assert meta.image_root == str(image_root) and meta.source_json_file == str(json_path)
        assert Path(meta.json_file).parent == tmp_path / "cache" / "cleaned"
        assert len(_quiet_coco(meta.json_file).dataset["annotations"]) == 1  # what the evaluator will read
        with pytest.raises(ValueError, match="unknown_category_id"):
            register_coco(name, json_path, image_root, on_error="raise")
    finally:
        DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)


def test_register_shapes_feeds_detectron2_mapper(tmp_path):
    d2data = require("detectron2.data")
    structures = require("detectron2.structures")
    from winpos.d2.data import register_shapes
    try:
        paths = register_shapes(tmp_path, train_images=3, val_images=2, image_size=96)
        assert set(paths) == {"shapes_train", "shapes_val"}
        records = d2data.DatasetCatalog.get("shapes_train")
        assert len(records) == 3 and len(d2data.DatasetCatalog.get("shapes_val")) == 2
        assert d2data.MetadataCatalog.get("shapes_val").thing_classes == list(SHAPE_CLASSES)
        mapper = d2data.DatasetMapper(is_train=True, augmentations=[], image_format="RGB", use_instance_mask=True)
        record = max(records, key=lambda r: len(r["annotations"]))
        inst = mapper(record)["instances"]
        assert len(inst) == len(record["annotations"]) > 0
        bitmasks = structures.BitMasks.from_polygon_masks(inst.gt_masks, 96, 96).tensor
        coco = _quiet_coco(paths["shapes_train"][0])
        areas = [a["area"] for a in coco.loadAnns(coco.getAnnIds(imgIds=[record["image_id"]]))]
        assert bitmasks.sum((1, 2)).tolist() == areas
    finally:
        for name in ("shapes_train", "shapes_val"):
            if name in d2data.DatasetCatalog.list():
                d2data.DatasetCatalog.remove(name)
                d2data.MetadataCatalog.remove(name)


def test_the_fast_polygon_check_decides_as_the_exact_one():
    """``_all_numbers`` (set of types + C-level isfinite) against ``all(_is_number(v))`` on every kind of entry a
    json or a caller can hand it: ints, floats, bools, strings, None, NaN / inf, nested lists, numpy scalars."""
    import math
    import random

    import numpy as np

    from winpos.data.coco import _all_numbers, _is_number

    pool = [0, 1, -3, 2**70, 0.5, -1e300, math.nan, math.inf, -math.inf, True, False, "1", None, [1, 2],
            np.float64(1.5), np.float64(math.nan), np.int64(3)]
    rng = random.Random(0)
    cases = [[], *([v] for v in pool)] + [[rng.choice(pool) for _ in range(rng.randint(1, 8))] for _ in range(500)]
    for values in cases:
        assert _all_numbers(values) == all(_is_number(v) for v in values), values
    assert _all_numbers([1, 2.5, 3]) and not _all_numbers([1, math.nan]) and not _all_numbers([1, True])


def test_an_evaluation_set_of_its_own_shares_the_training_images_and_none_of_them(tmp_path):
    """``val_seed``: the val split drawn from its own seed, the train split byte for byte the ordinary one; no
    evaluation image is a training image, and two val seeds give two different sets (issue 48's fresh evaluation
    set per pipeline)."""
    import hashlib

    from winpos.data.shapes import shapes_val_dir

    params = dict(train_images=6, val_images=3, image_size=64, min_objects=1, max_objects=3)
    plain = ensure_shapes_dataset(tmp_path, **params)
    own = ensure_shapes_dataset(tmp_path, val_seed=112, **dict(params, val_images=5))
    other = ensure_shapes_dataset(tmp_path, val_seed=113, **dict(params, val_images=5))

    def digests(folder):
        return sorted(hashlib.sha256(p.read_bytes()).hexdigest() for p in Path(folder).glob("*.png"))

    assert digests(own["shapes_train"][1]) == digests(plain["shapes_train"][1]) == digests(other["shapes_train"][1])
    assert own["shapes_train"][1] == other["shapes_train"][1]  # one folder of training images for every val seed
    val, val2 = digests(own["shapes_val"][1]), digests(other["shapes_val"][1])
    assert len(val) == len(set(val)) == 5 and not set(val) & set(digests(plain["shapes_train"][1]))
    assert not set(val) & set(val2) and not set(val) & set(digests(plain["shapes_val"][1]))
    data = json.loads(Path(own["shapes_val"][0]).read_text())
    assert len(data["images"]) == 5 and "seed 112" in data["info"]["description"]
    assert shapes_val_dir(tmp_path, val_seed=112, **dict(params, val_images=5)) == Path(own["shapes_val"][1]).parent
    assert ensure_shapes_dataset(tmp_path, **params) == plain  # the ordinary set keeps its folder
