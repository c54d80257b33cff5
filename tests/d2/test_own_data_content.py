"""What the user's own COCO data holds decides the config (issue 45, cases B14, B17, B36): RLE masks are trained
(detectron2's mapper in its ``bitmask`` format: the ``polygon`` one stopped training at iteration 0), a mask model on
data without masks is refused for training in one line (evaluated on boxes only), and ``--resume`` on another json
under the same dataset name is refused in one line (the run folder records each dataset's SHA-256)."""
import json

import numpy as np
import pytest
import torch

from tests.bad_inputs_helpers import CONFIG
from winpos.errors import WinposError

SIZE = 64


def _write(tmp_path, name, segmentation, box=(20.0, 10.0, 30.0, 20.0)):
    """One 64 px image with one object, its json (``segmentation`` None: boxes only)."""
    from PIL import Image

    root = tmp_path / "images"
    root.mkdir(exist_ok=True)
    Image.fromarray(np.full((SIZE, SIZE, 3), 90, np.uint8)).save(root / "0.png")
    ann = {"id": 1, "image_id": 1, "category_id": 1, "bbox": list(box), "area": box[2] * box[3], "iscrowd": 0}
    if segmentation is not None:
        ann["segmentation"] = segmentation
    path = tmp_path / name
    path.write_text(json.dumps({"images": [{"id": 1, "file_name": "0.png", "width": SIZE, "height": SIZE}],
                                "annotations": [ann], "categories": [{"id": 1, "name": "thing"}]}))
    return path, root


def _mask():
    m = np.zeros((SIZE, SIZE), np.uint8)
    m[10:30, 20:50] = 1
    return m


def _cfg(name, *extra):
    from winpos.d2.config import load_config

    return load_config(CONFIG, ["train.device=cpu", f"dataloader.train.dataset.names={name}",
                                f"dataloader.test.dataset.names={name}", "model.roi_heads.num_classes=1", *extra])


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("WINPOS_DATA", str(tmp_path / "cache"))


def test_b14_valid_rle_masks_train_with_the_bitmask_format(tmp_path):
    from detectron2.config import instantiate
    from detectron2.data import DatasetCatalog
    from detectron2.structures import BitMasks
    from pycocotools import mask as mask_utils

    from winpos.d2.data import register_coco
    from winpos.d2.engine import build_model
    from winpos.d2.own_data import check_dataset_content

    rle = mask_utils.encode(np.asfortranarray(_mask()))
    path, root = _write(tmp_path, "rle.json", {"size": [SIZE, SIZE], "counts": rle["counts"].decode()})
    register_coco("own_rle", path, root)
    cfg = _cfg("own_rle", "dataloader.train.mapper.min_scale=1.0", "dataloader.train.mapper.max_scale=1.0",
               f"dataloader.train.mapper.image_size={SIZE}")
    assert cfg.dataloader.train.mapper.get("instance_mask_format", "polygon") == "polygon"
    check_dataset_content(cfg)
    assert cfg.dataloader.train.mapper.instance_mask_format == "bitmask"
    mapper = instantiate(cfg.dataloader.train.mapper)
    record = DatasetCatalog.get("own_rle")[0]
    for _ in range(4):  # a random flip: compare with the mask flipped alike
        mapped = mapper(record)
        masks = mapped["instances"].gt_masks
        assert isinstance(masks, BitMasks)
        got = masks.tensor[0].numpy()
        assert np.array_equal(got, _mask()) or np.array_equal(got, _mask()[:, ::-1])
    from detectron2.utils.events import EventStorage

    model = build_model(cfg).train()
    torch.manual_seed(0)
    with EventStorage(0):
        losses = model([mapped])
    assert torch.isfinite(losses["loss_mask"]) and losses["loss_mask"] > 0  # the masks reach the mask head
    polygons, _ = _write(tmp_path, "poly.json", [[20.0, 10.0, 50.0, 10.0, 50.0, 30.0, 20.0, 30.0]])
    register_coco("own_poly", polygons, root)
    cfg = _cfg("own_poly")
    check_dataset_content(cfg)
    assert cfg.dataloader.train.mapper.get("instance_mask_format", "polygon") == "polygon"  # left as it was


def test_b17_a_mask_model_on_data_without_masks(tmp_path):
    from winpos.d2.data import register_coco
    from winpos.d2.own_data import check_dataset_content

    path, root = _write(tmp_path, "boxes.json", None)
    register_coco("own_boxes", path, root)
    with pytest.raises(WinposError) as e:
        check_dataset_content(_cfg("own_boxes"), ("train", "test"))
    text = str(e.value)
    assert "\n" not in text and "own_boxes has no segmentation" in text and "mask_head=None" in text
    cfg = _cfg("own_boxes")
    check_dataset_content(cfg, ("test",))  # an evaluation: boxes only
    assert list(cfg.dataloader.evaluator.tasks) == ["bbox"]


def test_b36_a_resume_on_another_json_under_the_same_name_is_refused(tmp_path):
    from winpos.d2.data import register_coco
    from winpos.d2.own_data import DATASETS_FILE, record_datasets

    first, root = _write(tmp_path, "first.json", [[20.0, 10.0, 50.0, 10.0, 50.0, 30.0, 20.0, 30.0]])
    other, _ = _write(tmp_path, "other.json", [[21.0, 10.0, 50.0, 10.0, 50.0, 30.0, 21.0, 30.0]])
    run = tmp_path / "run"
    run.mkdir()
    register_coco("mine", first, root)
    recorded = record_datasets(_cfg("mine"), run)
    assert json.loads((run / DATASETS_FILE).read_text()) == recorded and recorded["mine"]["json"] == str(first)
    assert record_datasets(_cfg("mine"), run, resume=True) == recorded  # the same data resumes
    register_coco("mine", other, root)
    with pytest.raises(WinposError) as e:
        record_datasets(_cfg("mine"), run, resume=True)
    text = str(e.value)
    assert "\n" not in text and "--resume: dataset mine is now" in text and str(first) in text
    assert json.loads((run / DATASETS_FILE).read_text()) == recorded  # the record is kept
    assert record_datasets(_cfg("mine"), run)["mine"]["json"] == str(other)  # a new run (--force) records anew
