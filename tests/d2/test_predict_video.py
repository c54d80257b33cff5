"""winpos-predict on a video file (an annotated video back, one predictions.json record per frame), a camera index
that cannot be opened (one line), a video passed as --input (named as such), and detectron2's Visualizer as the
drawer (importable now that OpenCV is a dependency)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "shapes/mask_rcnn_hieradet_toy_abswin.py"  # by name


def _predict(*args, cwd):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, str(ROOT / "tools" / "predict.py"), "--config-file", CONFIG,
                           "--random-weights", "--no-progress", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=600)


def _video(path, frames=4, size=64):
    from winpos.data.shapes import generate_shapes

    ann = generate_shapes(path.parent / "shapes", "val", frames, image_size=size, seed=1)
    images = sorted((Path(ann).parents[1] / "val").glob("*.png"))
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 5.0, (size, size))
    assert writer.isOpened()
    for image in images:
        writer.write(cv2.imread(str(image)))
    writer.release()
    return len(images)


def test_video_file_gives_an_annotated_video_and_per_frame_records(tmp_path):
    n = _video(tmp_path / "clip.mp4")
    out = tmp_path / "preds"
    res = _predict("--video-input", tmp_path / "clip.mp4", "--output", out, "--drawer", "detectron2",
                   "--score-thresh", "0.0", "--max-frames", n - 1, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]  # before: no --video-input (--input clip.mp4 skipped it, rc 1)
    assert f"{n - 1} frames -> {out / 'clip.mp4'}" in res.stdout
    cap = cv2.VideoCapture(str(out / "clip.mp4"))
    frames = []
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        frames.append(frame)
    assert len(frames) == n - 1 and frames[0].shape == (64, 64, 3)
    records = json.loads((out / "predictions.json").read_text())
    assert [r["frame"] for r in records] == list(range(n - 1)) and {"boxes", "scores", "masks"} <= set(records[0])
    assert not list(out.glob(".*partial*"))  # the temporary name is gone
    again = _predict("--video-input", tmp_path / "clip.mp4", "--output", out, cwd=tmp_path)
    assert again.returncode == 2 and "--force" in again.stderr.strip().splitlines()[-1]


def test_a_video_as_input_and_a_missing_camera_are_one_line(tmp_path):
    (tmp_path / "clip.mp4").write_bytes(b"\0" * 16)
    res = _predict("--input", tmp_path / "clip.mp4", "--output", tmp_path / "o", cwd=tmp_path)
    last = res.stderr.strip().splitlines()[-1]
    assert res.returncode == 2 and last.startswith("error:") and "--video-input" in last, res.stderr[-1000:]
    res = _predict("--webcam", "63", "--max-frames", "2", "--output", tmp_path / "cam", cwd=tmp_path)
    last = res.stderr.strip().splitlines()[-1]
    assert res.returncode == 2 and "--webcam 63: no camera 63 can be opened" in last, res.stderr[-1000:]
    res = _predict("--video-input", tmp_path / "clip.mp4", "--output", tmp_path / "o2", cwd=tmp_path)
    last = res.stderr.strip().splitlines()[-1]
    assert res.returncode == 2 and "OpenCV cannot open it as a video" in last, res.stderr[-1000:]
    assert not (tmp_path / "o2" / "clip.mp4").exists()


def test_detectron2_visualizer_draws_winpos_instances():
    from detectron2.structures import Boxes, Instances

    from winpos.d2.predict import draw, draw_with_visualizer

    rgb = np.full((40, 50, 3), 90, np.uint8)
    inst = Instances((40, 50), pred_boxes=Boxes(torch.tensor([[5.0, 5.0, 30.0, 25.0]])), scores=torch.tensor([0.9]),
                     pred_classes=torch.tensor([1]), pred_masks=torch.zeros(1, 40, 50, dtype=torch.bool))
    image = np.asarray(draw_with_visualizer(rgb, inst, ["circle", "square"]))
    assert image.shape == (40, 50, 3) and (image != 90).any()
    again = np.asarray(draw(rgb, inst, ["circle", "square"], "detectron2"))  # its colours are jittered at random
    assert again.shape == image.shape and (again != 90).any()
