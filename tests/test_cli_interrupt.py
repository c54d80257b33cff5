"""Ctrl-C in any winpos command is one line and status 130 (``winpos.utils.cli.run_cli``), not a traceback; an
interrupted ``winpos-predict --force`` over a complete video leaves the earlier video and JSON byte-identical
(the outputs are staged and published only when complete)."""
import hashlib
import os
import signal
import subprocess
import sys
import time

import cv2
import numpy as np

from tests.bad_inputs_helpers import ROOT, _env
from winpos.utils.cli import EXIT_INTERRUPTED, run_cli


def test_ctrl_c_is_one_line_and_status_130(capsys):
    def interrupted(argv):
        raise KeyboardInterrupt

    assert run_cli(interrupted, []) == EXIT_INTERRUPTED == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("interrupted (Ctrl-C)") and "Traceback" not in err[0]


def _digests(folder):
    return {p: hashlib.sha256((folder / p).read_bytes()).hexdigest() for p in ("clip.mp4", "predictions.json")}


def test_ctrl_c_during_a_forced_video_is_one_line_and_keeps_the_earlier_result(tmp_path):
    clip = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(clip), cv2.VideoWriter_fourcc(*"MJPG"), 10, (64, 64))
    for i in range(400):
        frame = np.full((64, 64, 3), 40, np.uint8)
        frame[10:40, (i % 30):(i % 30) + 20] = (0, 200, 0)
        writer.write(frame)
    writer.release()
    out = tmp_path / "out"
    cmd = [sys.executable, str(ROOT / "tools" / "predict.py"), "--config-file", "shapes/mask_rcnn_hieradet_toy_abswin.py",
           "--random-weights", "--video-input", str(clip), "--output", str(out), "--no-progress"]
    first = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    before = _digests(out)
    # SIGINT as a terminal sends it (a child of a non-interactive shell would start with SIGINT ignored)
    proc = subprocess.Popen(cmd + ["--force"], stderr=subprocess.PIPE, text=True, env=_env(),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 300
    while not any(p.name.startswith(".staging") for p in out.iterdir()) and time.time() < deadline:
        time.sleep(0.2)  # the new video is being written into its staging folder
    time.sleep(1.0)
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("interrupted (Ctrl-C)"), err[-2000:]
    assert _digests(out) == before
    assert not [p for p in out.iterdir() if p.name.startswith(".staging")]
