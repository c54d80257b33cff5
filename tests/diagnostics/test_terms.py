"""The doctor's block-term verdicts (winpos.diagnostics.terms) on models whose answer is computed here
independently: axial RoPE frequencies written out from their definition, relpos table lengths from the grid."""
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from winpos.backbones import create
from winpos.d2.doctor import diagnose
from winpos.errors import WinposError
from winpos.diagnostics.terms import position_terms
from winpos.posemb.rope import COORDS, KINDS, RoPE

ROOT = Path(__file__).resolve().parents[2]


def _terms(report):
    return {(t.term, t.group.kind): t for t in report.terms}


def _unseen_slots(base, rot_dims, trained_offset, new_offset):
    """Independent count: axial slots w_i = base^(-i/n), i < n = R/4, one per axis; a slot meets new rotations when
    its trained rotations +-w*D stayed inside half a turn and the offsets grow."""
    n = rot_dims // 4
    per_axis = sum(1 for i in range(n) if base ** (-i / n) * trained_offset < math.pi)
    return 2 * per_axis if new_offset > trained_offset else 0


@pytest.mark.parametrize("kind,coords", [(k, c) for k in KINDS for c in COORDS if (k, c) != ("mixed", "centered")])
def test_grid_angles_are_the_tables_angles(kind, coords):
    """The doctor reads ``grid_angles``; for every coordinate convention they must be the angles the tables hold
    (a new convention that computes its tables elsewhere fails here)."""
    ref = (16, 16) if coords == "normalized" else None
    rope = RoPE(64, 4, kind=kind, shared_heads=kind == "axial", coords=coords, ref_hw=ref)
    t = rope.tables((5, 7), (5, 7))
    ang = rope.grid_angles((5, 7))
    assert torch.equal(ang.cos(), t.cos_k) and torch.equal(ang.sin(), t.sin_k)
    pos = rope.grid_positions((5, 7))
    assert pos.shape == (35, 2)
    if coords == "integer":
        assert torch.equal(pos[6], torch.tensor([0.0, 6.0]))


def test_rope_at_its_pretraining_size_is_ok():
    r = diagnose("vitdet_b", 224, recipe="rope")
    terms = _terms(r)
    assert set(terms) == {("RoPE", "window"), ("RoPE", "global")}
    assert all(t.level == "OK" for t in r.terms) and r.text().startswith("[OK]"), r.text()


@pytest.mark.parametrize("size", [448, 1024])
def test_integer_rope_extrapolates_in_the_slots_counted_independently(size):
    r = diagnose("vitdet_b", size, recipe="rope")  # axial, base 100, R = 32 of head_dim 64, integer positions
    glob, win = _terms(r)[("RoPE", "global")], _terms(r)[("RoPE", "window")]
    grid = size // 16
    expected = _unseen_slots(100.0, 32, 13, grid - 1)
    assert expected == 10  # i = 3..7 per axis: 100^(-3/8) * 13 = 2.28 < pi, 100^(-2/8) * 13 = 4.11 > pi
    assert glob.level == "WARN" and int(glob.data["new_angles"].sum()) == expected
    assert f"EXTRAPOLATES: offsets reach {grid - 1}/{grid - 1}, trained 13/13" in glob.text()
    assert f"{expected} of 16 rotation slots" in glob.text()
    # the angle range of slot i is w_i * (grid - 1), written out from the definition
    w = [100.0 ** (-i / 8) for i in range(8)]
    assert glob.data["new"].span[0, :8] == pytest.approx([wi * (grid - 1) for wi in w], rel=1e-5)
    assert glob.data["ref"].span[0, :8] == pytest.approx([wi * 13 for wi in w], rel=1e-5)
    # window blocks see window-local positions 0..13 at every size: nothing new
    assert win.level == "OK" and int(win.data["new_angles"].sum()) == 0 and "0..13" in win.text()
    assert r.ok and r.text().startswith("[WARN]")  # a warning, not the bug: exit status stays 0


def test_trained_size_moves_the_reference():
    assert all(t.level == "OK" for t in diagnose("vitdet_b", 1024, recipe="rope", trained_size=1024).terms)


def test_rescaled_positions_compress_and_never_extrapolate():
    """EVA-02's convention: positions t = i * 16 / n. Global blocks at 1024 px (64 tokens): step 16/64 (x4 closer),
    the largest offset 16 * 63/64 = 15.75 (within one trained step of 15); window blocks (14 tokens): step 16/14."""
    net_args = dict(pretrain_img_size=256,
                    window_pos={"kind": "rope", "rope": {"coords": "normalized", "ref_hw": (16, 16)}},
                    global_pos={"kind": "rope", "rope": {"coords": "normalized", "ref_hw": (16, 16)}})
    with torch.device("meta"):
        net = create("vitdet_b", recipe="rope", **net_args)
    terms = {t.group.kind: t for t in position_terms(net, 1024)}
    glob, win = terms["global"], terms["window"]
    assert not glob.data["extrapolates"] and int(glob.data["new_angles"].sum()) == 0
    assert glob.data["step_ratio"] == pytest.approx([16 / 64, 16 / 64]) and "COMPRESSED" in glob.text()
    assert "x4 closer" in glob.text() and glob.data["new"].pos_span == pytest.approx([15.75, 15.75])
    assert win.data["step_ratio"] == pytest.approx([16 / 14, 16 / 14]) and "STRETCHED" in win.text()
    assert "window-local and image coordinates give the same" not in win.text()  # not true for rescaled positions


def test_rescaled_positions_alias_on_a_small_grid():
    """At 64 px (4x4 tokens) rescaled into a 16-token grid the step is 4 positions: slot i turns 4 * 100^(-i/8)
    rad per token, above pi only for i = 0 (4.0; i = 1: 2.25), once per axis."""
    with torch.device("meta"):
        net = create("vitdet_b", recipe="rope", pretrain_img_size=256, window_size=0, pos_embed="none",
                     global_pos={"kind": "rope", "rope": {"coords": "normalized", "ref_hw": (16, 16)}})
    (glob,) = position_terms(net, 64)
    expected = 2 * sum(1 for i in range(8) if 4 * 100.0 ** (-i / 8) > math.pi)
    assert expected == 2 and int(glob.data["aliased"].sum()) == expected
    assert glob.level == "WARN" and "ALIASING: 2 of 16 rotation slots" in glob.text()


def test_learned_frequencies_are_read_per_block_from_a_real_model():
    """Mixed RoPE with learned frequencies: the worst block is reported; one block's frequencies raised above pi
    per token make it alias, and the doctor names that block."""
    torch.manual_seed(0)
    mixed = {"kind": "rope", "rope": {"kind": "mixed", "shared_heads": False}}
    net = create("vitdet_toy", recipe="rope", window_pos=mixed, global_pos=mixed, img_size=224)
    with torch.no_grad():
        net.blocks[3].attn.rope.freqs.mul_(8.0)  # a global block (global_blocks 1, 3)
    terms = {t.group.kind: t for t in position_terms(net, 224)}
    glob = terms["global"]
    fastest = float(net.blocks[3].attn.rope.freqs.detach().abs().max())
    assert fastest > math.pi and "block 3's" in glob.text() and glob.data["aliased"].any()
    assert "initialization" not in glob.text()


def test_relpos_tables_stretch_by_the_grid_ratio():
    r = diagnose("vitdet_b", 2048)  # recipe original: relpos everywhere, global tables stored for 64 tokens
    glob, win = _terms(r)[("relpos", "global")], _terms(r)[("relpos", "window")]
    assert glob.data["stored"] == (127, 127) and glob.data["used"] == (2 * 128 - 1,) * 2
    assert glob.data["stretch"][0] == pytest.approx(255 / 127)
    assert "127 -> 255 (x2.01" in glob.text() and "128 offsets (|d| 64..127)" in glob.text()
    assert win.level == "OK" and win.data["stretch"] == (1.0, 1.0)
    assert all(t.level == "OK" for t in diagnose("vitdet_b", 1024).terms)  # at its own size
    small = _terms(diagnose("vitdet_b", 448))[("relpos", "global")]  # 28 tokens: 55 of the 127 stored
    assert small.data["stretch"][0] == pytest.approx(55 / 127) and "SQUEEZED 127 -> 55" in small.text()


def test_hiera_global_blocks_use_the_stage_grid():
    r = diagnose("hieradet_b", 1024, recipe="rope")
    glob = [t for t in r.terms if t.group.kind == "global"]
    assert len(glob) == 1 and glob[0].group.blocks == [12, 16, 20] and glob[0].group.extent == (64, 64)


def test_abs_embedding_with_rope_under_windows_is_the_bug_and_the_fix_keeps_rope():
    """EVA-02's detection backbone: an absolute embedding interpolated naively under windows, RoPE in the blocks.
    The fix tiles the embedding (pos_embed=abswin) and keeps recipe rope; pasted, the bug is gone."""
    r = diagnose("vitdet_b", 1024, recipe="rope", overrides=["pos_embed=abs"])
    assert not r.ok and r.text().startswith("[BUG]") and r.affected_blocks == [0, 1, 3, 4, 6, 7, 9, 10]
    assert "--to vitdet_b --recipe rope --pos-embed abswin" in r.fix
    pasted = re.search(r"winpos-posemb doctor vitdet_b (pos_embed=\S+) --recipe (\S+)", r.fix)
    fixed = diagnose("vitdet_b", 1024, recipe=pasted.group(2), overrides=["pos_embed=abs", pasted.group(1)])
    assert fixed.ok and any(t.term == "RoPE" for t in fixed.terms)


def test_cli_exit_codes_and_plots(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, str(ROOT / "tools/posemb_viz.py"), "doctor", *args],
                              capture_output=True, text=True)

    warn = run("vitdet_b", "--recipe", "rope", "--image-size", "1024", "--plots", str(tmp_path / "p"))
    assert warn.returncode == 0 and warn.stdout.startswith("[WARN]"), warn.stdout + warn.stderr
    assert "RoPE, global blocks (2, 5, 8, 11): WARN" in warn.stdout
    png = tmp_path / "p" / "vitdet_b_1024px_rope.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = run("vitdet_b", "--recipe", "rope", "--plots", str(tmp_path / "p"))
    assert again.returncode == 2 and "--force" in again.stderr  # figures of an earlier run are not replaced silently
    bug = run("vitdet_b", "pos_embed=abs", "--recipe", "rope", "--image-size", "1024", "--plots", str(tmp_path / "b"))
    assert bug.returncode == 1 and bug.stdout.startswith("[BUG]")
    assert sorted(p.name for p in (tmp_path / "b").glob("*.png")) == ["vitdet_b_1024px_abs_windows.png",
                                                                      "vitdet_b_1024px_rope.png"]
    relpos = run("vitdet_b", "--image-size", "2048", "--plots", str(tmp_path / "r"))
    assert (tmp_path / "r" / "vitdet_b_2048px_relpos.png").is_file() and relpos.returncode == 1
    bad = run("vitdet_b", "--rope-trained-size", "0")
    assert bad.returncode == 2 and "--rope-trained-size" in bad.stderr


def test_centered_coordinates_compress_in_global_blocks_only():
    """DINOv3's convention: c = 2 (t + 0.5) / n - 1 over the attention extent, step 2 / n. Global blocks at 1024 px
    step 2/64 against 2/14 trained (x64/14 closer); 14-token windows step 2/14 as trained, while image coordinates
    would step 2/64: here window-local coordinates are what keeps window blocks at the trained step."""
    centered = {"kind": "rope", "rope": {"coords": "centered"}}
    with torch.device("meta"):
        net = create("vitdet_b", recipe="rope", window_pos=centered, global_pos=centered)
    terms = {t.group.kind: t for t in position_terms(net, 1024)}
    glob, win = terms["global"], terms["window"]
    assert glob.data["new"].pos_step == pytest.approx([2 / 64] * 2) and glob.data["ref"].pos_step == pytest.approx(
        [2 / 14] * 2)
    assert glob.level == "WARN" and not glob.data["extrapolates"] and "x4.57 closer" in glob.text()
    assert win.level == "OK" and "image coordinates over the 64x64 grid would step 0.0312" in win.text()


def test_checkpoint_supplies_learned_frequencies_and_table_lengths(tmp_path):
    """A converted checkpoint is read for what the preset cannot know: the learned mixed frequencies (one block's
    raised above pi per token: the doctor finds it) and the relpos table lengths it was trained with."""
    mixed = "{'kind': 'rope', 'rope': {'kind': 'mixed', 'shared_heads': false}}"
    overrides = [f"window_pos={mixed}", f"global_pos={mixed}", "pos_embed=none"]
    torch.manual_seed(0)
    net = create("vitdet_toy", recipe="rope", window_pos={"kind": "rope", "rope": {"kind": "mixed",
                                                                                   "shared_heads": False}},
                 global_pos={"kind": "rope", "rope": {"kind": "mixed", "shared_heads": False}}, pos_embed="none")
    with torch.no_grad():
        net.blocks[1].attn.rope.freqs.mul_(8.0)
    ckpt = tmp_path / "mixed.pth"
    torch.save({"model": {f"backbone.net.{k}": v for k, v in net.state_dict().items()}}, ckpt)
    plain = diagnose("vitdet_toy", 224, recipe="rope", overrides=overrides)
    read = diagnose("vitdet_toy", 224, recipe="rope", overrides=overrides, checkpoint=str(ckpt))
    assert "initialization" in plain.text() and "initialization" not in read.text()
    glob = _terms(read)[("RoPE", "global")]
    assert "block 1's" in glob.text() and "no aliasing" in _terms(plain)[("RoPE", "global")].text()
    # integer positions step 1 at every size: a slot fast enough to alias did so in training too (not new)
    assert glob.data["aliased"].any() and "aliasing (as in training)" in glob.text() and glob.level == "OK"

    small = create("vitdet_toy", img_size=224)  # relpos tables for 14 tokens (27 long) in the global blocks
    torch.save(small.state_dict(), tmp_path / "relpos.pth")
    r = diagnose("vitdet_toy", 1024, checkpoint=str(tmp_path / "relpos.pth"))  # the preset itself sizes 127
    assert _terms(r)[("relpos", "global")].data["stored"] == (27, 27) and "27 -> 127" in r.text()
    assert _terms(diagnose("vitdet_toy", 1024))[("relpos", "global")].level == "OK"
    shared = create("vitdet_toy", recipe="rope", pos_embed="none",
                    window_pos={"kind": "rope", "rope": {"kind": "mixed"}}, global_pos={"kind": "rope",
                                                                                       "rope": {"kind": "mixed"}})
    torch.save(shared.state_dict(), tmp_path / "shared.pth")  # one frequency set for all heads: not this model's
    with pytest.raises(WinposError, match=r"frequencies have shape \(2, 1, 8\), the model's \(2, 3, 8\)"):
        diagnose("vitdet_toy", 224, recipe="rope", overrides=overrides, checkpoint=str(tmp_path / "shared.pth"))
    with pytest.raises(WinposError, match="holds no ViT blocks"):
        torch.save({"w": torch.zeros(1)}, tmp_path / "none.pth")
        diagnose("vitdet_toy", 1024, checkpoint=str(tmp_path / "none.pth"))


def test_a_trained_size_compares_each_block_kind_with_itself():
    """SAM3's encoder was trained at 1008 px with its windows: window blocks (24-token windows, positions rescaled
    into 24) step 1 as trained, global blocks step 24/72 as trained: all OK. Against the 336-px pretraining (global
    attention on 24x24) the global blocks are x3 compressed; at 1344 px against 1008 they step 24/96 against 24/72."""
    assert all(t.level == "OK" for t in diagnose("vitdet_sam3_toy", 1008, trained_size=1008).terms)
    glob = _terms(diagnose("vitdet_sam3_toy", 1008))[("RoPE", "global")]
    assert glob.data["step_ratio"] == pytest.approx([1 / 3, 1 / 3]) and "COMPRESSED" in glob.text()
    terms = _terms(diagnose("vitdet_sam3_toy", 1344, trained_size=1008))
    assert terms[("RoPE", "global")].data["step_ratio"] == pytest.approx([72 / 96] * 2)
    assert terms[("RoPE", "window")].level == "OK"
    assert "window attention on 24x24 tokens at 1008 px" in terms[("RoPE", "window")].text()
