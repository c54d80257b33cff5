"""Predict on a video file or a camera and write the annotated video (OpenCV reads and writes the frames).

``predict_video(cfg, model, source, output_dir)``: ``source`` is a video file path or a camera index (``int``).
Writes ``output_dir/<stem>.mp4`` (``webcam<N>.mp4`` for a camera; MPEG-4 at the source's frame rate, 30 fps for a
camera that does not say) with every frame's instances drawn, and ``output_dir/predictions.json``: one record per
frame, ``{"frame", "boxes", "scores", "classes", "class_names", "masks"}`` as ``winpos.d2.predict`` writes for an
image. The folder is checked before any work (``winpos.outputs.check_output_dir``); the video is written under a
temporary name and renamed when complete, so an interrupted run leaves no half video under the final name. A camera
runs until ``max_frames`` or Ctrl-C (the frames so far are kept).
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np

from winpos.d2.predict import Predictor, check_drawer, class_names, draw, instances_record
from winpos.errors import MissingInputError, WinposError
from winpos.outputs import atomic_write, check_output_dir

__all__ = ["open_source", "video_name", "predict_video"]

logger = logging.getLogger(__name__)


def video_name(source) -> str:
    """The annotated video's file name: ``<stem>.mp4`` for a file, ``webcam<N>.mp4`` for camera ``N``."""
    return f"webcam{source}.mp4" if isinstance(source, int) else f"{Path(source).stem}.mp4"


def open_source(source):
    """``cv2.VideoCapture`` of a video file or camera index, or a one-line WinposError saying why it cannot be."""
    import cv2

    if isinstance(source, int):
        cap = cv2.VideoCapture(source)
        if not cap.isOpened():
            raise WinposError(f"--webcam {source}: no camera {source} can be opened (none attached, or in use); "
                              "list the cameras (e.g. ls /dev/video*) and pass another index, or use --video-input")
        return cap
    if not Path(source).is_file():
        raise MissingInputError(f"--video-input {source} does not exist; pass a video file (e.g. .mp4, .avi)")
    cap = cv2.VideoCapture(str(source))
    if not cap.isOpened():
        raise WinposError(f"--video-input {source}: OpenCV cannot open it as a video; convert it to an .mp4 "
                          "(e.g. ffmpeg -i IN out.mp4) or pass image files with --input")
    return cap


def predict_video(cfg, model, source, output_dir, score_thresh: float = 0.5, force: bool = False,
                  progress: bool = False, max_frames: int | None = None, drawer: str = "winpos") -> list[dict]:
    """Predict every frame of ``source`` (see the module docstring); returns the per-frame records."""
    import cv2

    check_drawer(drawer)
    name = video_name(source)
    inputs = [] if isinstance(source, int) else [source]
    check_output_dir(output_dir, inputs, [name, "predictions.json"], force=force)
    cap = open_source(source)
    fps = cap.get(cv2.CAP_PROP_FPS) or 30.0
    total = int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) or None
    predictor, names = Predictor(cfg, model), class_names(cfg)
    os.makedirs(output_dir, exist_ok=True)
    final = Path(output_dir) / name
    partial = final.with_name(f".{final.stem}.partial.mp4")  # the container follows the extension
    writer, records = None, []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=min(filter(None, (total, max_frames)), default=None), desc="predict", unit="frame")
    try:
        while max_frames is None or len(records) < max_frames:
            ok, bgr = cap.read()
            if not ok:
                break
            rgb = np.ascontiguousarray(bgr[..., ::-1])
            instances = predictor(rgb if predictor.image_format == "RGB" else bgr)
            instances = instances[instances.scores >= score_thresh]
            frame = np.asarray(draw(rgb, instances, names, drawer))[..., ::-1]
            if writer is None:
                h, w = frame.shape[:2]
                writer = cv2.VideoWriter(str(partial), cv2.VideoWriter_fourcc(*"mp4v"), fps, (w, h))
                if not writer.isOpened():
                    raise OSError(f"OpenCV cannot write an MPEG-4 video to {partial}")
            writer.write(np.ascontiguousarray(frame))
            records.append({"frame": len(records), **instances_record(instances, names)})
            if bar is not None:
                bar.update(1)
    except KeyboardInterrupt:
        if not isinstance(source, int):
            raise
        logger.info(f"stopped by Ctrl-C after {len(records)} frames")  # a camera has no end: keep what was seen
    finally:
        cap.release()
        if bar is not None:
            bar.close()
        if writer is not None:
            writer.release()
        if records and partial.is_file():
            os.replace(partial, final)
        elif partial.exists():
            partial.unlink()
        atomic_write(Path(output_dir) / "predictions.json", lambda f: json.dump(records, f, indent=1), "w")
    if not records:
        raise WinposError(f"{'--webcam' if isinstance(source, int) else '--video-input'} {source}: no frame could "
                          "be read; check that the video plays (or the camera streams)")
    logger.info(f"wrote {final} ({len(records)} frames at {fps:g} fps)")
    return records
