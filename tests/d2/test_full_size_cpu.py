"""The full-size COCO recipes, tried on the CPU: ViTDet-B and HieraDet-T Mask R-CNN exactly as configured (1024 px
LSJ, every head, random init) train one iteration on a generated COCO-layout folder found through
DETECTRON2_DATASETS, save, resume for the second iteration and run the COCO evaluator (pycocotools) on it.

One subprocess runs all four starts, since detectron2 registers the builtin COCO paths from DETECTRON2_DATASETS
once, at import. The only overrides are what a one-image CPU run needs: batch 1, no loader workers, a checkpoint
at the end (model_final.pth, which the resume reads), bf16 autocast (CPUs with AVX-512 BF16 run it fastest), and
every detection kept (test_score_thresh=0: an untrained model scores below the recipe's 0.05, and pycocotools only
runs on detections). A COCO folder that is not there is refused in one line naming the variable."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from detectron2.data.datasets.builtin_meta import COCO_CATEGORIES
from PIL import Image

from tests.bad_inputs_helpers import assert_one_line_error

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = {"vitdet_b": "configs/COCO/mask_rcnn_vitdet_b_100ep.py",
           "hieradet_t": "configs/COCO/mask_rcnn_hieradet_t_100ep.py"}
SMALL_RUN = ["dataloader.train.total_batch_size=1", "dataloader.train.num_workers=0", "dataloader.test.num_workers=0",
             "train.amp.precision=bf16", "train.amp.eval=True", "train.init_checkpoint=", "train.device=cpu",
             "train.checkpointer.period=1000", "model.roi_heads.box_predictor.test_score_thresh=0.0",
             "train.eval_period=0", "train.log_period=1"]

RUNS = textwrap.dedent("""
    import json, sys, time
    from winpos.d2.engine import build_parser, main
    for name, config, out in json.loads(sys.argv[1]):
        for resume, max_iter, evaluate in ((False, 1, False), (True, 2, True)):
            opts = json.loads(sys.argv[2]) + [f"train.output_dir={out}", f"train.max_iter={max_iter}",
                                              f"train.eval_after_train={evaluate}"]
            args = build_parser().parse_args(["--config-file", config] + (["--resume"] if resume else []) + opts)
            start = time.perf_counter()
            results = main(args)
            print("RESULT", json.dumps({"name": name, "resume": resume, "seconds": time.perf_counter() - start,
                                        "results": {k: dict(v) for k, v in (results or {}).items()}}), flush=True)
""")


def make_coco(root: Path) -> None:
    """``root/coco`` in COCO's layout: one 640x480 image with two objects (polygons), as train2017 and val2017."""
    things = [c for c in COCO_CATEGORIES if c["isthing"]]
    rng = np.random.default_rng(0)
    for split in ("train2017", "val2017"):
        (root / "coco" / split).mkdir(parents=True)
        Image.fromarray(rng.integers(0, 255, (480, 640, 3), dtype=np.uint8)).save(root / "coco" / split / "1.jpg")
    boxes = [(100, 80, 200, 150), (380, 220, 160, 200)]  # x, y, w, h
    annotations = [{"id": i + 1, "image_id": 1, "category_id": things[i]["id"], "bbox": list(b), "area": b[2] * b[3],
                    "iscrowd": 0, "segmentation": [[b[0], b[1], b[0] + b[2], b[1], b[0] + b[2], b[1] + b[3], b[0],
                                                    b[1] + b[3]]]} for i, b in enumerate(boxes)]
    data = {"images": [{"id": 1, "file_name": "1.jpg", "height": 480, "width": 640}], "annotations": annotations,
            "categories": [{"id": c["id"], "name": c["name"], "supercategory": "thing"} for c in things]}
    (root / "coco" / "annotations").mkdir()
    for split in ("train2017", "val2017"):
        (root / "coco" / "annotations" / f"instances_{split}.json").write_text(json.dumps(data))


@pytest.mark.slow  # 285 s
def test_full_size_recipes_train_save_resume_and_evaluate_on_cpu(tmp_path):
    make_coco(tmp_path / "datasets")
    runs = [(name, str(ROOT / cfg), str(tmp_path / name)) for name, cfg in CONFIGS.items()]
    env = {**os.environ, "DETECTRON2_DATASETS": str(tmp_path / "datasets")}
    res = subprocess.run([sys.executable, "-c", RUNS, json.dumps(runs), json.dumps(SMALL_RUN)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stderr[-3000:]
    results = [json.loads(line[7:]) for line in res.stdout.splitlines() if line.startswith("RESULT ")]
    assert [(r["name"], r["resume"]) for r in results] == [(n, r) for n in CONFIGS for r in (False, True)]
    for name, _, out in runs:
        out = Path(out)
        assert (out / "model_final.pth").is_file() and (out / "last_checkpoint").read_text() == "model_final.pth"
        lines = [json.loads(line) for line in (out / "metrics.json").read_text().splitlines()]
        assert [m["iteration"] for m in lines if "total_loss" in m] == [0, 1]  # the second start resumed at 1
        assert any("bbox/AP" in m for m in lines)  # the evaluation was logged too
        assert (out / "inference" / "coco_instances_results.json").is_file()  # the evaluator's detections
        log = (out / "log.txt").read_text()
        assert "Starting training from iteration 1" in log and "training plan:" in log
    for r in results:
        if r["resume"]:
            for task in ("bbox", "segm"):  # pycocotools' summary of the val image, each AP in [0, 100] (or nan)
                metrics = r["results"][task]
                assert {"AP", "AP50", "AP75", "APs", "APm", "APl"} <= set(metrics), r
                assert all(0.0 <= v <= 100.0 for v in metrics.values() if not np.isnan(v)), r
    print("\n".join(f"{r['name']} {'resume+eval' if r['resume'] else 'first'}: {r['seconds']:.1f} s" for r in results))


def test_missing_coco_folder_is_one_line_naming_the_variable(tmp_path):
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "train_net.py"), "--config-file",
                          str(ROOT / CONFIGS["hieradet_t"]), "train.device=cpu"], capture_output=True, text=True,
                         env={**os.environ, "DETECTRON2_DATASETS": str(tmp_path / "nowhere")}, timeout=300)
    assert_one_line_error(res, "DETECTRON2_DATASETS=", "nowhere", "coco/annotations")
