"""The ViTDet half's pieces: MAE's sin-cos table against its formula written out per entry, the three inits (one
trunk, position parts as load_external converts the MAE table), and the paired summary."""
import math

import pytest
import torch

from winpos.experiments import vitdet as V


def test_sincos_table_entry_by_entry():
    grid, dim = 5, 16
    t = V.sincos_2d(grid, dim)
    q = dim // 4
    for r in range(grid):
        for c in range(grid):
            row = t[r * grid + c]
            for i in range(q):
                w = 1 / 10000 ** (i / q)
                assert row[i] == pytest.approx(math.sin(c * w), abs=1e-6)  # first half: the column
                assert row[q + i] == pytest.approx(math.cos(c * w), abs=1e-6)
                assert row[2 * q + i] == pytest.approx(math.sin(r * w), abs=1e-6)  # second half: the row
                assert row[3 * q + i] == pytest.approx(math.cos(r * w), abs=1e-6)
    with pytest.raises(ValueError, match="divisible by 4"):
        V.sincos_2d(4, 18)


def test_inits_share_the_trunk_and_carry_the_sincos_table(tmp_path):
    paths = V.make_inits("configs/shapes", str(tmp_path), seed=3)
    sd = {row: torch.load(p, weights_only=True) for row, p in paths.items()}
    sd = {row: s.get("model", s) for row, s in sd.items()}
    table = V.sincos_2d(V.PRETRAIN_SIZE // V.PATCH, 96)
    trunk = [k for k in sd["abs"] if "pos_embed" not in k]
    assert len(trunk) > 50
    for row in ("abs_relpos", "abswin"):
        assert all(torch.equal(sd["abs"][k], sd[row][k]) for k in trunk), row
    torch.testing.assert_close(sd["abs"]["backbone.net.net.pos_embed.pos_embed"][0, 1:], table)  # cls row dropped
    win = sd["abswin"]["backbone.net.net.pos_embed.window_embed"][0]  # (C, 8, 8): the table, tiled per window
    torch.testing.assert_close(win.flatten(1).T, table)
    assert not sd["abswin"]["backbone.net.net.pos_embed.global_embed"].any()  # zero-initialised global part
    assert any("rel_pos" in k for k in sd["abs_relpos"]) and not any("rel_pos" in k for k in sd["abswin"])
    other = V.make_inits("configs/shapes", str(tmp_path / "s4"), seed=4)
    assert not torch.equal(torch.load(other["abs"], weights_only=True)["model"][trunk[5]], sd["abs"][trunk[5]])


def test_summary_pairs_by_seed():
    def res(row, seed, box):
        return {"spec": {"row": row, "seed": seed}, "bbox": {"AP": box}, "segm": {"AP": box / 2}}

    runs = [res("abs", s, 40 + s) for s in range(3)] + [res("abswin", s, 41 + s) for s in range(3)]
    summary = V.summarize(runs)
    (pair,) = summary["pairs"]
    assert (pair["treatment"], pair["baseline"]) == ("abswin", "abs")
    assert pair["box"]["mean"] == pytest.approx(1.0) and pair["box"]["n"] == 3
    assert "(A) abs interpolated" in V.format_table(summary)
