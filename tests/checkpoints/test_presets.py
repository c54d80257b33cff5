"""A checkpoint converted --to the wrong size: the error names the preset its width and depth match, and that
--to works when pasted (oracle: the official hiera package's layout)."""
import re

import pytest
import torch

from tests.conftest import require
from winpos.checkpoints import load_external
from winpos.checkpoints.formats import Format
from winpos.checkpoints.presets import matching_presets
from winpos.errors import WinposError


def test_matching_presets_by_width_and_depth():
    assert matching_presets(Format.HIERA, 96, None) == ["hieradet_t", "hieradet_s", "hieradet_b"]
    assert matching_presets(Format.SAM2, 112, 24) == ["hieradet_bplus"]
    assert matching_presets(Format.MAE, 768, 12) == ["vitdet_b"] and matching_presets(Format.MAE, 32, 12) == []


def test_wrong_preset_error_names_the_right_one(tmp_path):
    m = require("hiera").Hiera(input_size=(224, 224), embed_dim=32, num_heads=1, stages=(1, 1, 2, 1))
    torch.save({"model_state": m.state_dict()}, tmp_path / "hiera.pth")
    with pytest.raises(WinposError, match="match preset hieradet_toy") as e:
        load_external(tmp_path / "hiera.pth", "hieradet_t")
    to = re.search(r"convert with --to (\w+)", str(e.value)).group(1)
    sd, report = load_external(tmp_path / "hiera.pth", to)
    assert sd and not report.missing
