"""The doctor's padding lines: what padding the token grid to whole windows costs, per window size, against the
grid arithmetic written out here (ceil to a multiple of the window), and that it never changes the verdict."""
import subprocess
import sys

import pytest

import torch

from winpos.backbones import create
from winpos.diagnostics.doctor import diagnose_preset, window_padding


def _meta(preset):
    with torch.device("meta"):  # shapes only: ViT-B costs nothing
        return create(preset)


def _expected(grid: int, window: int) -> tuple[int, float]:
    padded = grid
    while padded % window:
        padded += 1
    return padded, padded * padded / (grid * grid) - 1


@pytest.mark.parametrize("image_size", [1024, 896, 512, 640])
def test_vitdet_b_padding_matches_the_grid_arithmetic(image_size):
    lines = window_padding(_meta("vitdet_b"), image_size)
    grid = image_size // 16
    padded, extra = _expected(grid, 14)
    assert len(lines) == 1 and lines[0].startswith("blocks 0-1, 3-4, 6-7, 9-10: ")
    if padded == grid:
        assert lines[0].endswith(f"{grid}x{grid} tokens tile 14-token windows exactly (no padding)")
    else:
        assert f"padded to {padded}x{padded} for 14-token windows" in lines[0]
        assert f"{extra:+.1%} tokens" in lines[0]


def test_vitdet_b_at_1024_pays_a_fifth_more_attention_tokens_and_16_would_tile():
    (line,) = window_padding(_meta("vitdet_b"), 1024)
    assert "64x64 tokens padded to 70x70" in line and "+19.6% tokens" in line
    assert "windows of 16 or 8 tokens would tile it exactly" in line


def test_hieradet_pools_the_grid_between_stages():
    lines = window_padding(_meta("hieradet_b"), 1024)
    assert lines[0] == "blocks 0-2: 256x256 tokens tile 8-token windows exactly (no padding)"
    assert lines[1] == "blocks 3-5: 128x128 tokens tile 4-token windows exactly (no padding)"
    assert "64x64 tokens padded to 70x70 for 14-token windows" in lines[2]
    assert "32x32 tokens padded to 35x35 for 7-token windows" in lines[3]  # 64 pooled to 32 after block 21
    assert len(lines) == 4


def test_padding_is_reported_but_never_a_verdict():
    report = diagnose_preset("vitdet_b", 1024, recipe="paper")
    assert report.ok and not report.warn
    assert any(ln.startswith("  padding: blocks") for ln in report.text().splitlines())
    done = subprocess.run([sys.executable, "-m", "winpos.cli.posemb_viz", "doctor", "vitdet_b", "--recipe", "paper",
                           "--image-size", "1024"], capture_output=True, text=True)
    assert done.returncode == 0 and "+19.6% tokens" in done.stdout
