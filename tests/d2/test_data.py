"""Dataset registration (bad inputs -> clear errors or counted skips) and the resumable training stream."""
import json

import numpy as np
import pytest
import torch
from detectron2.data import DatasetCatalog, MetadataCatalog
from PIL import Image

from winpos.d2.data import (IterationBatchSampler, StreamDataset, build_lsj_mapper, build_resumable_train_loader,
                            ensure_registered, get_dataset_dicts, register_coco)


def _tiny_coco(root, n=3, bad=False):
    (root / "img").mkdir(parents=True, exist_ok=True)
    images, anns = [], []
    for i in range(n):
        Image.fromarray(np.full((40, 48, 3), 30 * i, np.uint8)).save(root / "img" / f"{i}.png")
        images.append({"id": i + 1, "file_name": f"{i}.png", "width": 48, "height": 40})
        anns.append({"id": i + 1, "image_id": i + 1, "category_id": 1, "bbox": [4, 4, 20, 20], "iscrowd": 0,
                     "area": 400, "segmentation": [[4, 4, 24, 4, 24, 24, 4, 24]]})
    if bad:
        anns.append({"id": 99, "image_id": 1, "category_id": 1, "bbox": [4, 4, 0, 10], "iscrowd": 0, "area": 0,
                     "segmentation": [[4, 4, 4, 14, 4, 9]]})
    path = root / "ann.json"
    path.write_text(json.dumps({"images": images, "annotations": anns, "categories": [{"id": 1, "name": "box"}]}))
    return path


def test_register_coco_counts_and_skips_bad_annotations(tmp_path):
    json_file = _tiny_coco(tmp_path, bad=True)
    report = register_coco("winpos_test_bad", json_file, tmp_path / "img", on_error="skip", cache_dir=tmp_path)
    assert report.skipped["bbox_empty_or_negative"] == 1
    dicts = DatasetCatalog.get("winpos_test_bad")
    assert len(dicts) == 3 and sum(len(d["annotations"]) for d in dicts) == 3
    assert MetadataCatalog.get("winpos_test_bad").thing_classes == ["box"]
    with pytest.raises(ValueError, match="bbox"):
        register_coco("winpos_test_bad2", json_file, tmp_path / "img", on_error="raise")


def test_missing_and_malformed_inputs_raise_clear_errors(tmp_path):
    json_file = _tiny_coco(tmp_path)
    with pytest.raises(ValueError, match="image folder"):
        register_coco("winpos_test_noroot", json_file, tmp_path / "nope")
    with pytest.raises(ValueError, match="does not exist"):
        register_coco("winpos_test_nojson", tmp_path / "missing.json", tmp_path / "img")
    broken = tmp_path / "broken.json"
    broken.write_text('{"images": [')
    with pytest.raises(ValueError, match="not valid json"):
        register_coco("winpos_test_broken", broken, tmp_path / "img")
    broken.write_text('{"images": []}')
    with pytest.raises(ValueError, match="annotations"):
        register_coco("winpos_test_broken", broken, tmp_path / "img")
    with pytest.raises(ValueError, match="not registered"):
        ensure_registered(["no_such_dataset_xyz"])
    with pytest.raises(ValueError, match="no dataset names"):
        ensure_registered([])


def _fake_mapper(d):
    """Records which image it got and a draw from numpy's global RNG (what detectron2 augmentations use)."""
    return {"idx": d["idx"], "aug": float(np.random.uniform()), "rnd": np.random.randint(1 << 30)}


def test_stream_is_a_function_of_iteration_only():
    dicts = [{"idx": i} for i in range(7)]
    ds = StreamDataset(dicts, _fake_mapper, seed=3)
    # each epoch of the stream is a permutation of the dataset
    for epoch in range(3):
        assert sorted(ds.index(p) for p in range(7 * epoch, 7 * epoch + 7)) == list(range(7))
    assert [ds.index(p) for p in range(7)] != [ds.index(p) for p in range(7, 14)]
    np.random.seed(0)
    before = np.random.get_state()[1].copy()
    full = list(zip(range(9), build_resumable_train_loader(dicts, _fake_mapper, total_batch_size=3, seed=3)))
    assert (np.random.get_state()[1] == before).all()  # the mapper's seeding does not leak into the caller's RNG
    resumed = build_resumable_train_loader(dicts, _fake_mapper, total_batch_size=3, seed=3, start_iter=5)
    for (_, want), got in zip(full[5:], resumed):
        assert want == got  # same images, same augmentation draws
    workers = build_resumable_train_loader(dicts, _fake_mapper, total_batch_size=3, seed=3, num_workers=2)
    assert [b for _, b in zip(range(9), workers)] == [b for _, b in full]
    other_seed = build_resumable_train_loader(dicts, _fake_mapper, total_batch_size=3, seed=4)
    assert [b for _, b in zip(range(9), other_seed)] != [b for _, b in full]


def test_ranks_partition_the_global_batch():
    per_rank = [list(zip(range(4), IterationBatchSampler(6, start_iter=2, rank=r, world_size=3))) for r in range(3)]
    for it in range(4):
        merged = sorted(p for r in range(3) for p in per_rank[r][it][1])
        assert merged == list(range((2 + it) * 6, (3 + it) * 6))
    with pytest.raises(ValueError, match="multiple of the number of processes"):
        IterationBatchSampler(5, rank=0, world_size=2)


def test_lsj_mapper_on_a_registered_dataset(tmp_path):
    json_file = _tiny_coco(tmp_path)
    register_coco("winpos_test_lsj", json_file, tmp_path / "img", cache_dir=tmp_path)
    dicts = get_dataset_dicts("winpos_test_lsj")
    loader = build_resumable_train_loader(dicts, build_lsj_mapper(image_size=32, min_scale=0.5, max_scale=1.5),
                                          total_batch_size=2, seed=0)
    batch = next(iter(loader))
    assert len(batch) == 2
    for item in batch:
        assert item["image"].shape[0] == 3 and max(item["image"].shape[1:]) <= 32
        inst = item["instances"]
        assert len(inst) == 0 or torch.all(inst.gt_boxes.area() > 0)
    with pytest.raises(ValueError, match="min_scale"):
        build_lsj_mapper(min_scale=2.0, max_scale=1.0)


def test_embedded_names_mean_the_parameters_the_config_states(tmp_path):
    """A loader whose shapes dict differs from the one that registered shapes_* registers them again (the first
    registration used to win: a test loader evaluated the training loader's split, and a later test the split an
    earlier one had registered); no dict means the generator's defaults; a direct register_shapes call counts."""
    from detectron2.data import DatasetCatalog

    from winpos.d2 import data as D

    small = dict(root=str(tmp_path), image_size=64, train_images=3, val_images=2)
    D.ensure_registered(["shapes_train"], small)
    assert len(DatasetCatalog.get("shapes_val")) == 2
    D.ensure_registered(["shapes_val"], dict(small, val_images=4))
    assert len(DatasetCatalog.get("shapes_val")) == 4 and len(DatasetCatalog.get("shapes_train")) == 3
    D.ensure_registered(["shapes1_val"], dict(small, val_images=5))  # the one-class pair keeps its own record
    assert len(DatasetCatalog.get("shapes1_val")) == 5 and len(DatasetCatalog.get("shapes_val")) == 4
    D.register_shapes(tmp_path, image_size=64, train_images=3, val_images=6)  # direct: recorded too
    assert D._SHAPES_REGISTERED[D.SHAPES_NAMES] == dict(small, val_images=6)
    calls = []
    real = D.register_shapes
    D.register_shapes = lambda **kw: calls.append(kw)
    try:
        D.ensure_registered(["shapes_val"], dict(small, val_images=6))  # the same parameters: kept
        assert calls == []
        D.ensure_registered(["shapes_val"], None)  # no dict: the defaults, not what an earlier caller left
        assert calls == [{}]
    finally:
        D.register_shapes = real
        D.ensure_registered(["shapes_val"], None)  # leave the defaults registered for whoever comes next


@pytest.mark.parametrize("config", ["shapes/mask_rcnn_hieradet_toy_abswin.py", "shapes/reproduce_hieradet.py"])
def test_the_evaluator_scores_the_images_the_test_loader_read(config, tmp_path):
    """A config's evaluator and its test loader mean the same images: with a test set of the config's own
    parameters (here 5 images; the reproduction's runs each state theirs), the evaluator's ground truth is that set,
    not the generator's defaults. Before, the evaluator re-registered the names from the defaults (100 images) after
    the loader had read the run's set, and pycocotools refused every result outside those ("Results do not
    correspond to current coco set"): the demo failed at its first evaluation."""
    from detectron2.config import instantiate

    from winpos.model_zoo import get_config

    cfg = get_config(config, ["train.device=cpu"])
    params = dict(root=str(tmp_path), image_size=64, train_images=3, val_images=5)
    cfg.dataloader.test.dataset.shapes = params
    loader = instantiate(cfg.dataloader.test)
    evaluator = instantiate(cfg.dataloader.evaluator)
    read = sorted(int(d["image_id"]) for batch in loader for d in batch)
    assert len(read) == 5 and read == sorted(evaluator._coco_api.getImgIds())
