"""One's own COCO-format data through the tools: a fresh folder of images and a json, registered with --dataset the
same way in train_net, eval_coco and predict; a class count that differs from the dataset's is refused at start in
one line naming the override (before any model is built); predict draws class names read from the registered
metadata (never by generating the shapes dataset) and writes the masks as COCO RLE that decode to the drawn masks.
"""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "shapes" / "mask_rcnn_hieradet_toy_paper.py"  # a 4-class head


def make_coco_folder(root: Path, n_images=3, size=128, classes=("blob", "kite")) -> tuple[Path, Path]:
    """Images with one polygon per class each, and their COCO json: what a researcher's own data looks like."""
    images, anns = [], []
    (root / "images").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(n_images):
        img = Image.new("RGB", (size, size), (40, 40, 40))
        draw = ImageDraw.Draw(img)
        for c in range(len(classes)):
            x, y = rng.integers(10, size - 50, 2)
            poly = [x, y, x + 40, y, x + 20, y + 36] if c else [x, y, x + 36, y, x + 36, y + 30, x, y + 30]
            draw.polygon([(float(poly[k]), float(poly[k + 1])) for k in range(0, len(poly), 2)], fill=(200, 90, 40))
            xs, ys = poly[0::2], poly[1::2]
            anns.append({"id": len(anns) + 1, "image_id": i + 1, "category_id": c + 1, "iscrowd": 0,
                         "segmentation": [[float(v) for v in poly]],
                         "bbox": [float(min(xs)), float(min(ys)), float(max(xs) - min(xs)), float(max(ys) - min(ys))],
                         "area": float((max(xs) - min(xs)) * (max(ys) - min(ys)) / 2)})
        img.save(root / "images" / f"img{i}.png")
        images.append({"id": i + 1, "file_name": f"img{i}.png", "width": size, "height": size})
    ann = root / "instances.json"
    ann.write_text(json.dumps({"images": images, "annotations": anns,
                               "categories": [{"id": k + 1, "name": n} for k, n in enumerate(classes)]}))
    return ann, root / "images"


def run_tool(tool, *args, cwd=None):
    return subprocess.run([sys.executable, str(ROOT / "tools" / tool), *args], capture_output=True, text=True,
                          cwd=cwd)


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    return make_coco_folder(tmp_path_factory.mktemp("mydata"))


def test_wrong_class_count_refused_at_start_in_every_tool(own, tmp_path):
    ann, images = own
    spec = f"mine={ann}:{images}"
    common = ["dataloader.train.dataset.names=mine", "dataloader.test.dataset.names=mine"]
    train = run_tool("train_net.py", "--config-file", str(CONFIG), "--dataset", spec, *common,
                     f"train.output_dir={tmp_path / 'run'}", "train.max_iter=1")
    assert train.returncode == 2, train.stderr[-2000:]
    lines = [ln for ln in train.stderr.splitlines() if ln.startswith("error:")]
    assert lines == [lines[0]] and "model.roi_heads.num_classes=4 but dataset mine has 2 classes (blob, kite)" \
        in lines[0] and "add the override model.roi_heads.num_classes=2" in lines[0]
    assert not (tmp_path / "run" / "model_final.pth").exists() and "Traceback" not in train.stderr
    ev = run_tool("eval_coco.py", "--config-file", str(CONFIG), "--checkpoint", str(ann), "--dataset", spec,
                  "--test-dataset", "mine", "--output", str(tmp_path / "ev"))
    assert ev.returncode == 2 and "num_classes=2" in ev.stderr and not (tmp_path / "ev" / "results.json").exists()


def test_class_count_from_dataset_and_mismatch_between_splits(own):
    from winpos.d2.config import load_config
    from winpos.d2.engine import register_cli_datasets
    from winpos.d2.own_data import check_num_classes
    from winpos.errors import WinposError

    ann, images = own
    register_cli_datasets([f"mine={ann}:{images}"])
    cfg = load_config(str(CONFIG), ["dataloader.train.dataset.names=mine", "dataloader.test.dataset.names=mine"])
    cfg.model.roi_heads.num_classes = None  # a config that leaves the count to the data
    assert check_num_classes(cfg) == 2 and cfg.model.roi_heads.num_classes == 2
    cfg = load_config(str(CONFIG), ["dataloader.train.dataset.names=mine"])  # test stays shapes_val (4 classes)
    with pytest.raises(WinposError, match="mine has 2 classes but dataloader.test.dataset.names=shapes_val has 4"):
        check_num_classes(cfg)
    assert check_num_classes(load_config(str(CONFIG))) == 4  # the shapes config as shipped


def test_predict_names_classes_and_writes_rle_masks_without_generating_shapes(own, tmp_path, monkeypatch):
    from pycocotools import mask as mask_utils

    ann, images = own
    monkeypatch.setenv("WINPOS_DATA", str(tmp_path / "data_cache"))  # a shapes dataset generated here would show
    out = tmp_path / "pred"
    res = run_tool("predict.py", "--config-file", str(CONFIG), "--random-weights", "--dataset",
                   f"mine={ann}:{images}", "--input", str(images / "img0.png"), "--output", str(out),
                   "--score-thresh", "0", "--no-progress", "dataloader.test.dataset.names=mine",
                   "model.roi_heads.num_classes=2", "model.roi_heads.box_predictor.test_score_thresh=0.0",
                   "train.device=cpu")
    assert res.returncode == 0, res.stderr[-3000:]
    cache = tmp_path / "data_cache"  # class names came from metadata, not from generated data (the one thing
    assert not cache.exists() or [p.name for p in cache.iterdir()] == ["decoded"]  # there: images decoded whole)
    (rec,) = json.loads((out / "predictions.json").read_text())
    assert rec["classes"] and set(rec["class_names"]) <= {"blob", "kite"}
    assert len(rec["masks"]) == len(rec["boxes"])
    decoded = mask_utils.decode({"size": rec["masks"][0]["size"], "counts": rec["masks"][0]["counts"].encode()})
    assert decoded.shape == (128, 128) and set(np.unique(decoded)) <= {0, 1}
    assert "no class names" not in res.stderr and "%|" not in res.stderr  # --no-progress: no bar


def test_shapes_class_names_without_generating_the_dataset(tmp_path, monkeypatch):
    from winpos.d2.config import load_config
    from winpos.d2.predict import class_names
    from winpos.data.scenes import SHAPE_CLASSES

    monkeypatch.setenv("WINPOS_DATA", str(tmp_path / "cache"))
    assert class_names(load_config(str(CONFIG))) == list(SHAPE_CLASSES)
    assert not (tmp_path / "cache").exists()
