"""Helpers of the bad-input tests (``tests/test_bad_inputs*.py``): run a tool as a user would, assert a one-line
refusal, and small models, images and checkpoints to feed the tools."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"
CONFIG = ROOT / "configs" / "shapes" / "mask_rcnn_hieradet_toy_abswin.py"
VIT_CONFIG = ROOT / "configs" / "COCO" / "mask_rcnn_vitdet_b_100ep.py"


def _env():
    return dict(os.environ, OMP_NUM_THREADS="1", TQDM_DISABLE="0")


def tool(name, *args, timeout=600, preexec_fn=None, cwd=None):
    return subprocess.run([sys.executable, str(TOOLS / name), *map(str, args)], capture_output=True, text=True,
                          env=_env(), timeout=timeout, preexec_fn=preexec_fn, cwd=cwd)


def assert_one_line_error(res, *needles, code=2):
    """Exit ``code``, no traceback, and the last stderr line is one ``error:`` line holding every needle."""
    assert res.returncode == code, (res.returncode, res.stderr[-2000:])
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    last = res.stderr.strip().splitlines()[-1]
    assert ("error:" in last) and all(n in last for n in needles), res.stderr[-2000:]


# --------------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def detector(tmp_path_factory):
    """The tiny shapes config, its model and a saved checkpoint of it (``{"model": state_dict}``)."""
    from winpos.d2.config import load_config
    from winpos.d2.engine import build_model

    cfg = load_config(CONFIG, ["train.device=cpu"])
    model = build_model(cfg).eval()
    path = tmp_path_factory.mktemp("ckpt") / "model_final.pth"
    torch.save({"model": model.state_dict()}, path)
    return cfg, model, path


def _images(folder, names, size=64):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name in names:
        Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(folder / name)
    return folder


def _bytes(folder):
    return {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir())}


def _vit(**kw):
    from winpos.backbones import create

    return create("vitdet_toy", img_size=64, window_size=7, **kw)


def _save_vit(path, **kw):
    from tests.helpers import randomize

    model = randomize(_vit(**kw))
    torch.save({"model": model.state_dict()}, path)
    return model
