"""winpos-predict's outputs are complete or absent (issue 45, cases C09-C12): a run with ``--force`` that fails or is
stopped half way (Ctrl-C, a file size limit, a writer that silently drops frames as OpenCV's does on a full disk)
leaves the earlier video / drawings and ``predictions.json`` byte-identical, and a finished ``--force`` on images
leaves no earlier drawing that the new ``predictions.json`` does not list. Tiny videos (64 px, a few frames) and
the toy detector."""
import json
import subprocess
import sys

import cv2
import numpy as np
import pytest

from tests.bad_inputs_helpers import CONFIG, ROOT, _env, _images, detector  # noqa: F401 - a fixture

FRAMES = 12


def _clip(path, frames=FRAMES, size=64):
    """A noise video (noise keeps the MPEG-4 file large enough for a small file size limit to cut it)."""
    rng = np.random.default_rng(0)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 5.0, (size, size))
    assert writer.isOpened()
    for _ in range(frames):
        writer.write(rng.integers(0, 255, (size, size, 3), dtype=np.uint8))
    writer.release()
    return path


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name != ".winpos-run.lock"}


@pytest.fixture
def earlier(detector, tmp_path):  # noqa: F811
    """A complete earlier result: ``out/clip.mp4`` (FRAMES frames) and its ``predictions.json``."""
    from winpos.d2.video import count_frames, predict_video

    cfg, model, _ = detector
    clip = _clip(tmp_path / "clip.mp4")
    out = tmp_path / "out"
    predict_video(cfg, model, clip, out, 0.0)
    assert count_frames(out / "clip.mp4") == FRAMES and len(json.loads((out / "predictions.json").read_text())) == 12
    return clip, out, _snapshot(out)


def _no_staging(out):
    return not list(out.glob(".staging-*"))


def test_c09_ctrl_c_during_a_forced_video_keeps_the_earlier_result(detector, earlier, monkeypatch):  # noqa: F811
    import winpos.d2.video as video

    cfg, model, _ = detector
    clip, out, before = earlier
    real_open = video.open_source

    class Interrupted:  # the real frames, then Ctrl-C at the 4th
        def __init__(self, source):
            self.cap, self.n = real_open(source), 0

        def read(self):
            self.n += 1
            if self.n == 4:
                raise KeyboardInterrupt
            return self.cap.read()

        def __getattr__(self, name):
            return getattr(self.cap, name)

    monkeypatch.setattr(video, "open_source", Interrupted)
    with pytest.raises(KeyboardInterrupt):
        video.predict_video(cfg, model, clip, out, 0.0, force=True)
    assert _snapshot(out) == before and _no_staging(out)


def test_c10_a_video_cut_short_by_the_writer_is_not_published(detector, earlier, monkeypatch):  # noqa: F811
    """OpenCV's writer reports no error on a full disk; the frames read back tell."""
    import winpos.d2.video as video
    from winpos.utils.outputs import WriteError

    cfg, model, _ = detector
    clip, out, before = earlier
    real_writer = cv2.VideoWriter

    class Dropping:  # as on a full disk: the frames after the 3rd never reach the file, silently
        def __init__(self, *args):
            self.w, self.n = real_writer(*args), 0

        def write(self, frame):
            self.n += 1
            if self.n <= 3:
                self.w.write(frame)

        def __getattr__(self, name):
            return getattr(self.w, name)

    monkeypatch.setattr(cv2, "VideoWriter", Dropping)
    with pytest.raises(WriteError) as e:
        video.predict_video(cfg, model, clip, out, 0.0, force=True)
    assert "reads back 3 of the 12 frames" in str(e.value) and "previous file is unchanged" in str(e.value)
    assert _snapshot(out) == before and _no_staging(out)


def test_c11_a_file_size_limit_keeps_the_earlier_video_and_json(detector, earlier):  # noqa: F811
    """``ulimit -f`` (RLIMIT_FSIZE, SIGXFSZ ignored so that writes fail with EFBIG) in a separate process."""
    _, _, checkpoint = detector
    clip, out, before = earlier
    limit = 8 * 1024
    assert len(before["clip.mp4"]) > 2 * limit  # the new video cannot fit
    script = f"""
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
from winpos.cli.predict import main
sys.exit(main(["--config-file", {str(CONFIG)!r}, "--checkpoint", {str(checkpoint)!r}, "--video-input", {str(clip)!r},
               "--output", {str(out)!r}, "--score-thresh", "0.0", "--no-progress", "--force", "train.device=cpu"]))
"""
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_env(), cwd=ROOT,
                         timeout=600)
    last = res.stderr.strip().splitlines()[-1]
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert last.startswith("error: could not write") and "unchanged" in last and "ulimit -f" in last, last
    assert _snapshot(out) == before and _no_staging(out)


def _three_images(detector, tmp_path):  # noqa: F811
    from winpos.d2.predict import predict_images

    cfg, model, _ = detector
    images = _images(tmp_path / "in", ["a.png", "b.png", "c.png"])
    out = tmp_path / "out"
    predict_images(cfg, model, sorted(images.iterdir()), out, 0.0)
    return cfg, model, images, out


def test_c12_ctrl_c_during_forced_images_keeps_the_earlier_drawings(detector, tmp_path, monkeypatch):  # noqa: F811
    import winpos.d2.predict as predict

    cfg, model, images, out = _three_images(detector, tmp_path)
    before = _snapshot(out)
    assert {"a.png", "b.png", "c.png", "predictions.json"} <= set(before)
    real_read, seen = predict.read_image, []

    def read_then_stop(path, format):
        seen.append(path)
        if len(seen) == 3:
            raise KeyboardInterrupt
        return real_read(path, format=format)

    monkeypatch.setattr(predict, "read_image", read_then_stop)
    with pytest.raises(KeyboardInterrupt):
        predict.predict_images(cfg, model, sorted(images.iterdir()), out, 0.0, force=True)
    assert _snapshot(out) == before and _no_staging(out)


@pytest.mark.parametrize("manifest", [True, False], ids=["manifest", "predictions_json_only"])
def test_force_on_images_leaves_no_drawing_the_new_json_does_not_list(detector, tmp_path, manifest):  # noqa: F811
    """Without the manifest (a folder written before it existed) the earlier predictions.json names the drawings."""
    from winpos.d2.predict import predict_images

    cfg, model, images, out = _three_images(detector, tmp_path)
    (out / "notes.txt").write_text("the user's own file\n")
    if not manifest:
        (out / ".winpos-outputs.json").unlink()
    records = predict_images(cfg, model, [images / "b.png"], out, 0.0, force=True)
    listed = {r["drawing"].rsplit("/", 1)[-1] for r in json.loads((out / "predictions.json").read_text())}
    assert listed == {"b.png"} and len(records) == 1
    assert sorted(p.name for p in out.glob("*.png")) == ["b.png"] and (out / "notes.txt").is_file()
    assert _no_staging(out)
