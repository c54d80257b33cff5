"""The doctor's LookHere reading: key distances and the penalties at the farthest key, against the bias the module
itself builds (its most negative finite entry is -slope * farthest distance) and the grid written out here."""
import math
import subprocess
import sys

import pytest
import torch

from winpos.backbones import create
from winpos.diagnostics.terms import position_terms


def _lookhere(preset, **kw):
    return create(preset, recipe="lookhere", **kw)


def _bias_extremes(module, extent):
    """Per head, the most negative finite bias over all (query, key) pairs of the extent: the head's penalty at the
    farthest key it sees (directed heads see the far corner from the opposite one)."""
    bias = module.bias(extent, extent)
    finite = torch.where(torch.isfinite(bias), bias, torch.zeros_like(bias))
    return finite.flatten(1).min(dim=1).values


@pytest.mark.parametrize("image_size", [224, 448, 1024])
def test_global_blocks_distances_and_penalties_are_the_modules_own(image_size):
    net = _lookhere("vitdet_toy", img_size=image_size)
    reports = {r.group.kind: r for r in position_terms(net, image_size) if r.term == "LookHere"}
    rep = reports["global"]
    grid = image_size // net.patch_size
    assert rep.data["max_distance"] == pytest.approx(math.hypot(grid - 1, grid - 1))
    trained = net.pretrain_hw[0]
    assert rep.data["trained_max_distance"] == pytest.approx(math.hypot(trained - 1, trained - 1))
    assert rep.level == ("WARN" if grid > trained else "OK")
    worst = torch.stack([_bias_extremes(net.blocks[i].attn.lookhere, (grid, grid)) for i in rep.group.blocks])
    lo, hi = rep.data["slopes"]
    # the strongest head's penalty at the farthest key is the most negative bias any of these blocks builds
    assert float(worst.min()) == pytest.approx(-hi * rep.data["max_distance"], rel=1e-5)
    nonzero = worst[worst < 0]
    assert float(nonzero.max()) == pytest.approx(-lo * rep.data["max_distance"], rel=1e-5)


def test_window_blocks_see_the_trained_distances_at_any_size():
    net = _lookhere("vitdet_toy", img_size=1024)
    (window,) = [r for r in position_terms(net, 1024) if r.term == "LookHere" and r.group.kind == "window"]
    ws = net.blocks[window.group.blocks[0]].attn.window_size
    assert window.data["max_distance"] == pytest.approx(math.hypot(ws - 1, ws - 1))
    assert window.level == ("OK" if ws <= net.pretrain_hw[0] else "WARN")


def test_the_doctor_warns_for_far_keys_but_keeps_exit_status_0():
    done = subprocess.run([sys.executable, "-m", "winpos.cli.posemb_viz", "doctor", "vitdet_b", "--recipe", "lookhere",
                           "--image-size", "1024"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("[WARN]")
    assert "LookHere, global blocks (2, 5, 8, 11): WARN" in done.stdout
    assert "keys up to 89.1 tokens away on the 64x64 grid; trained up to 18.4" in done.stdout
