"""The stage-1 checkpoint shipped for the demo is what its manifest says it is.

The demo (README command 1) prints the manifest's claims: that the embedding *learned* its window pattern from a
random start in stage 0, the pattern's window similarity (WS) after stage 1, and what naive interpolation and abs-win
make of it. These tests recompute each claim from the shipped files, so a replaced checkpoint or an edited manifest
cannot make the demo say something the weights do not show.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
CKPT = ROOT / "tools" / "checkpoints" / "stage1_hieradet_abs_learned_64px.pth"
MANIFEST = CKPT.with_suffix(".json")


@pytest.fixture(scope="module")
def manifest():
    assert CKPT.is_file() and MANIFEST.is_file(), f"the shipped checkpoint or its manifest is missing: {CKPT}"
    return json.loads(MANIFEST.read_text())


def test_the_file_is_the_one_the_manifest_hashes(manifest):
    from winpos.experiments.checkpoints import sha256
    from winpos.experiments.demo import check_stage1

    assert manifest["file"] == CKPT.name
    assert sha256(CKPT) == manifest["sha256"]
    assert check_stage1(str(CKPT), str(MANIFEST)) == manifest


def test_the_window_structure_in_the_manifest_is_measured_from_the_weights(manifest):
    from winpos.experiments.checkpoints import window_structure

    measured = window_structure(str(CKPT))
    stated = manifest["window_structure"]
    assert set(measured) == set(stated)
    for key, value in measured.items():
        assert value == pytest.approx(stated[key], abs=1e-6), key
    # the claim the demo prints: a window pattern that naive interpolation destroys and abs-win keeps
    # (the long stage 1 fades the stage-0 pattern, WS 0.93 -> about 0.4, but keeps it well clear of 0)
    assert stated["ws"] > 0.3
    for k in ("1.25x", "1.5x", "2x", "4x"):
        assert abs(stated[f"ws_naive_{k}"]) < 0.1 and stated[f"ws_abswin_{k}"] > 0.4, k


def test_the_pattern_was_learned_from_a_random_start_in_stage0(manifest):
    """'learned' is printed only because stage 0 started without the pattern (WS about 0) and ended with it."""
    s0 = manifest["stage0"]
    assert manifest["encoding"] == "abs_learned" and s0 is not None
    history = s0["history"]
    assert history[0]["iter"] == 0 and abs(history[0]["ws"]) < 0.05
    assert history[-1]["iter"] == s0["spec"]["iters"] and history[-1]["ws"] > 0.8
    rel = s0["reliance"]  # misaligned by a token hurts, realigned by a whole window does not
    assert rel["rolled_1_token"] > 5 * rel["learned"] and rel["rolled_1_window"] < 2 * rel["learned"]


def test_the_weights_are_a_detector_with_a_learned_absolute_embedding(manifest):
    sd = torch.load(CKPT, weights_only=True)["model"]
    pos = [k for k in sd if k.endswith("pos_embed")]
    assert len(pos) == 1 and sd[pos[0]].dtype == torch.float16
    assert sd[pos[0]].float().std() > 0.01  # not the zero start
    assert any(k.startswith("roi_heads.") for k in sd) and manifest["dtype"] == "float16"
    assert manifest["stage1"]["iters"] > 0 and 0 < manifest["box_AP_64px"] <= 100
