"""The user's own COCO json, validated once at registration (issue 45, cases B01-B04, B10-B16, B29, B34): every entry
pycocotools or detectron2's mapper would crash on, hang on or score wrongly is skipped and counted, a missing
``area`` is filled as detectron2 fills it (and said), normalised boxes are said, images are decoded whole, and a
json nested too deeply is one line. Tiny synthetic files (64 px images); the RLEs are made with pycocotools (the
oracle of the format), the run decoder and areas are checked against it."""
import json
import logging

import numpy as np
import pytest
from PIL import Image

from winpos.data.coco import _rle_counts, cleaned_json_file, validate_coco_json
from winpos.errors import WinposError

SIZE = 64
SQUARE = [[10.0, 10.0, 30.0, 10.0, 30.0, 30.0, 10.0, 30.0]]  # a 20x20 square: area 400


def _mask_rle(compressed=True, h=SIZE, w=SIZE):
    from pycocotools import mask as mask_utils

    m = np.zeros((h, w), np.uint8)
    m[10:30, 20:50] = 1  # 600 pixels
    rle = mask_utils.encode(np.asfortranarray(m))
    if compressed:
        return {"size": [h, w], "counts": rle["counts"].decode("ascii")}
    flat = m.flatten(order="F")  # column-major runs, starting with zeros
    changes = np.flatnonzero(np.diff(flat)) + 1
    bounds = np.concatenate([[0], changes, [flat.size]])
    return {"size": [h, w], "counts": np.diff(bounds).tolist()}


def _coco(tmp_path, anns, name="ann.json", n_images=1):
    root = tmp_path / "images"
    root.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    images = []
    for i in range(1, n_images + 1):
        Image.fromarray(rng.integers(0, 255, (SIZE, SIZE, 3), dtype=np.uint8)).save(root / f"{i}.png")
        images.append({"id": i, "file_name": f"{i}.png", "width": SIZE, "height": SIZE})
    full = []
    for k, a in enumerate(anns, 1):
        entry = {"id": k, "image_id": 1, "category_id": 1, "bbox": [10, 10, 20, 20], "area": 400.0,
                 "segmentation": SQUARE, "iscrowd": 0}
        entry.update(a)
        full.append({key: v for key, v in entry.items() if v is not None})
    path = tmp_path / name
    path.write_text(json.dumps({"images": images, "annotations": full,
                                "categories": [{"id": 1, "name": "thing"}]}))
    return path, root


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("WINPOS_DATA", str(tmp_path / "cache"))


def _validate(path, root):
    return validate_coco_json(path, root, on_error="skip")


@pytest.mark.parametrize("case, bbox, reason", [
    ("B01", [0, 0, 1e308, 1e308], "bbox_beyond_image"),
    ("B02", [0, 0, 10 ** 30, 5], "bbox_beyond_image"),
    ("B03", [1000, 1000, 24, 24], "bbox_outside_image"),
])
def test_b01_b03_boxes_outside_or_far_beyond_the_image_are_skipped_and_counted(tmp_path, case, bbox, reason):
    path, root = _coco(tmp_path, [{}, {"bbox": bbox}, {"bbox": [60, 60, 6, 6]}])
    report = _validate(path, root)
    assert report.skipped == {reason: 1}, (case, report.skipped)
    assert [a["id"] for a in report.dataset["annotations"]] == [1, 3]  # 2 px past the edge: within the tolerance
    assert cleaned_json_file(report, "x", path) != path


def test_b04_boxes_all_in_0_1_coordinates_are_said(tmp_path, caplog):
    path, root = _coco(tmp_path, [{"bbox": [0.1, 0.1, 0.3, 0.3], "segmentation": None, "area": 0.09},
                                  {"bbox": [0.5, 0.5, 0.2, 0.4], "segmentation": None, "area": 0.08}])
    with caplog.at_level(logging.WARNING):
        report = _validate(path, root)
    assert report.ok and any("within 0..1" in n for n in report.notes)
    assert "normalised coordinates?" in caplog.text
    pixels, root = _coco(tmp_path, [{}], name="pixels.json")
    assert not _validate(pixels, root).notes


def test_b10_a_polygon_far_outside_its_image_is_dropped(tmp_path):
    path, root = _coco(tmp_path, [{"segmentation": [[1e300, 1e300, 2e300, 1e300, 2e300, 2e300]]},
                                  {"segmentation": [[0, 0, 1e300, 0, 1e300, 5]] + SQUARE}, {}])
    report = _validate(path, root)
    assert report.skipped == {"polygon_outside_image": 2, "no_valid_polygon": 1}
    kept = {a["id"]: a for a in report.dataset["annotations"]}
    assert sorted(kept) == [2, 3] and kept[2]["segmentation"] == SQUARE  # the bad ring goes, the good one stays


@pytest.mark.parametrize("compressed", [False, True], ids=["uncompressed", "compressed"])
def test_b11_b13_rle_runs_are_decoded_and_checked(tmp_path, compressed):
    """B11: runs past h*w (an uncompressed one hung the evaluation); B12: garbage counts (lowered the mask AP);
    B13: a valid RLE is kept, and its area is the mask's."""
    from pycocotools import mask as mask_utils

    good = _mask_rle(compressed)
    assert sum(_rle_counts(good["counts"])) == SIZE * SIZE
    expected_runs = _rle_counts(_mask_rle(False)["counts"])
    assert _rle_counts(good["counts"]) == expected_runs  # the string decoder against pycocotools' own encoding
    if compressed:
        past = dict(good, counts=mask_utils.encode(np.asfortranarray(np.ones((SIZE, SIZE + 9), np.uint8)))
                    ["counts"].decode())
        garbage = dict(good, counts="PPYo1")  # decodes, to one run of 2073600 pixels (a 1920x1080 image's)
        assert _rle_counts("PPYo1") == [1920 * 1080] and _rle_counts("\x01\x7f") is None
    else:
        past = dict(good, counts=good["counts"][:-1] + [good["counts"][-1] + 10 ** 6])
        garbage = dict(good, counts=[5, -3, "x"])
    path, root = _coco(tmp_path, [{"segmentation": good, "area": None}, {"segmentation": past},
                                  {"segmentation": garbage}, {"segmentation": dict(good, size=[SIZE, SIZE + 1])}])
    report = _validate(path, root)
    assert report.skipped == {"rle_invalid": 2, "segmentation_malformed": 1}
    (kept,) = report.dataset["annotations"]
    rle = dict(good, counts=good["counts"].encode()) if compressed else mask_utils.frPyObjects(good, SIZE, SIZE)
    assert kept["id"] == 1 and kept["area"] == 600.0 == float(mask_utils.area(rle))
    assert report.has_rle and report.has_masks


def test_b15_a_missing_area_is_filled_as_detectron2_does_and_said(tmp_path, caplog):
    """From the polygon (shoelace, detectron2's PolygonMasks.area), the RLE, or the box when there is no mask; the
    cleaned json then evaluates with pycocotools (it stopped with KeyError: 'area')."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    path, root = _coco(tmp_path, [{"area": None}, {"area": None, "segmentation": _mask_rle()},
                                  {"area": None, "segmentation": [[10, 10, 30, 10, 30, 30]]}])
    with caplog.at_level(logging.WARNING):
        report = _validate(path, root)
    assert report.ok and report.filled == {"area": 3} and "filled from their mask" in caplog.text
    assert [a["area"] for a in report.dataset["annotations"]] == [400.0, 600.0, 200.0]
    boxes, root = _coco(tmp_path, [{"area": None, "segmentation": None, "bbox": [1, 2, 5, 7]}], name="boxes.json")
    assert _validate(boxes, root).dataset["annotations"][0]["area"] == 35.0
    cleaned = cleaned_json_file(report, "filled", path, tmp_path / "cache")
    gt = COCO(str(cleaned))
    dt = gt.loadRes([{"image_id": 1, "category_id": 1, "segmentation": a["segmentation"] if isinstance(
        a["segmentation"], dict) else gt.annToRLE(a), "score": 1.0} for a in gt.dataset["annotations"]])
    ev = COCOeval(gt, dt, "segm")
    ev.evaluate()
    ev.accumulate()
    ev.summarize()
    assert ev.stats[0] == pytest.approx(1.0)


@pytest.mark.parametrize("area, reason", [(-5, "area_not_positive"), (0, "area_not_positive"),
                                          ("big", "area_malformed"), (float("inf"), "area_malformed")])
def test_b16_an_area_that_is_not_positive_is_skipped_and_counted(tmp_path, area, reason):
    text_area = area if not isinstance(area, float) else 1e999  # json.dumps writes Infinity; keep it a number
    path, root = _coco(tmp_path, [{}, {"area": text_area}])
    report = _validate(path, root)
    assert report.skipped == {reason: 1} and [a["id"] for a in report.dataset["annotations"]] == [1]


def test_b29_an_image_cut_after_its_header_is_skipped_and_named(tmp_path):
    path, root = _coco(tmp_path, [{}, {"image_id": 2}], n_images=2)
    rng = np.random.default_rng(1)
    Image.fromarray(rng.integers(0, 255, (SIZE, SIZE, 3), dtype=np.uint8)).save(root / "2.jpg", quality=95)
    whole = (root / "2.jpg").read_bytes()
    (root / "2.jpg").write_bytes(whole[:int(len(whole) * 0.9)])
    with Image.open(root / "2.jpg") as im:
        assert im.size == (SIZE, SIZE)  # the header is whole: opening alone does not tell
    data = json.loads(path.read_text())
    data["images"][1]["file_name"] = "2.jpg"
    path.write_text(json.dumps(data))
    report = _validate(path, root)
    assert report.skipped == {"image_file_unreadable": 1, "annotation_of_skipped_image": 1}
    assert any("2.jpg" in e and "truncated" in e for e in report.examples), report.examples
    assert not list((tmp_path / "cache").glob("decoded/*"))  # decoded again next time, until the file is whole
    (root / "2.jpg").write_bytes(whole)
    assert _validate(path, root).ok and len(list((tmp_path / "cache").glob("decoded/*"))) == 1


def test_b34_a_json_nested_too_deeply_is_one_line(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 200000)
    (tmp_path / "images").mkdir()
    with pytest.raises(WinposError) as e:
        validate_coco_json(path, tmp_path / "images")
    assert "\n" not in str(e.value) and "nested too deeply" in str(e.value) and e.value.__cause__ is None
