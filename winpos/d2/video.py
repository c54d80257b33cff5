"""Predict on a video file or a camera and write the annotated video (OpenCV reads and writes the frames).

``predict_video(cfg, model, source, output_dir)``: ``source`` is a video file path or a camera index (``int``).
Writes ``output_dir/<stem>.mp4`` (``webcam<N>.mp4`` for a camera; MPEG-4 at the source's frame rate, 30 fps for a
camera that does not say) with every frame's instances drawn, and ``output_dir/predictions.json``: one record per
frame, ``{"frame", "boxes", "scores", "classes", "class_names", "masks"}`` as ``winpos.d2.predict`` writes for an
image. The folder is checked before any work (``winpos.utils.outputs.check_output_dir``) and claimed while the video is
made. Both files are complete or absent: written into a staging folder inside ``output_dir``, the video read back
with OpenCV (its writer reports no errors: a full disk or a file size limit shows as missing frames), then moved
into place (``winpos.utils.output_folders.staged_outputs``). Any failure, Ctrl-C included, leaves the earlier video and
JSON as they were. A camera runs until ``max_frames`` or Ctrl-C (the frames so far are kept and published).
"""
from __future__ import annotations

import errno
import json
import logging
from pathlib import Path

import numpy as np

from winpos.d2.predict import Predictor, check_drawer, class_names, draw, instances_record
from winpos.errors import MissingInputError, WinposError
from winpos.utils.output_folders import staged_outputs
from winpos.utils.outputs import WriteError, atomic_write, check_output_dir

__all__ = ["open_source", "video_name", "predict_video", "count_frames", "check_frames"]

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
    final = Path(output_dir) / name
    records, bar = [], None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=min(filter(None, (total, max_frames)), default=None), desc="predict", unit="frame")
    try:
        with staged_outputs(output_dir, [name, "predictions.json"], force=force, input_files=inputs) as (_, staging):
            staged = staging / name  # the container follows the extension
            writer = None
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
                        writer = cv2.VideoWriter(str(staged), cv2.VideoWriter_fourcc(*"mp4v"), fps, (w, h))
                        if not writer.isOpened():
                            raise OSError(f"OpenCV cannot write an MPEG-4 video to {staged}")
                    writer.write(np.ascontiguousarray(frame))
                    records.append({"frame": len(records), **instances_record(instances, names)})
                    if bar is not None:
                        bar.update(1)
            except KeyboardInterrupt:
                if not isinstance(source, int):
                    raise  # a file stopped half way publishes nothing: the earlier result stays
                logger.info(f"stopped by Ctrl-C after {len(records)} frames")  # a camera has no end: keep them
            finally:
                if writer is not None:
                    writer.release()
            if not records:
                raise WinposError(f"{'--webcam' if isinstance(source, int) else '--video-input'} {source}: no frame "
                                  "could be read; check that the video plays (or the camera streams)")
            check_frames(staged, len(records), final)
            atomic_write(staging / "predictions.json", lambda f: json.dump(records, f, indent=1), "w")
    finally:
        cap.release()
        if bar is not None:
            bar.close()
    logger.info(f"wrote {final} ({len(records)} frames at {fps:g} fps)")
    return records


def count_frames(path) -> int:
    """The frames OpenCV reads back from the video ``path`` (0 when it cannot open it)."""
    import cv2

    cap = cv2.VideoCapture(str(path))
    n = 0
    try:
        while cap.isOpened() and cap.grab():
            n += 1
    finally:
        cap.release()
    return n


def check_frames(path, expected: int, final) -> None:
    """Raise ``WriteError`` unless the written video ``path`` reads back with ``expected`` frames: OpenCV's writer
    reports no error, so a full disk or a file size limit shows only here (a video cut short, or no index)."""
    found = count_frames(path)
    if found != expected:
        state = "the previous file is unchanged" if Path(final).exists() else "nothing was written"
        raise WriteError(errno.EIO, f"could not write {final}: OpenCV reads back {found} of the {expected} frames "
                                    f"written (a full disk or a file size limit?); {state}; free disk space (or "
                                    "raise the file size limit, ulimit -f) and run again")
