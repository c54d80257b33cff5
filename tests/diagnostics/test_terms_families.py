"""The doctor on converted checkpoints of each RoPE family at 1024 px: timm's random-init state dicts (timm defines
the families, so no weight is downloaded) converted with ``load_external``, each verdict against an answer computed
here from the family's own convention (RoPE-ViT integer positions, EVA-02 positions rescaled into 16x16, DINOv3
centred coordinates)."""
import math

import torch

from tests.conftest import require
from winpos.checkpoints import load_external
from winpos.d2.doctor import diagnose


def _converted(timm_name, preset, recipe="original"):
    timm = require("timm")
    torch.manual_seed(0)
    model = timm.create_model(timm_name, pretrained=False)
    sd, _ = load_external(model.state_dict(), preset, recipe=recipe)
    return sd


def _terms(report):
    return {(t.term, t.group.kind): t for t in report.terms}


def test_ropevit_axial_extrapolates_in_the_slow_slots():
    """Integer positions, base 100, every head dim rotated (R = 64, 16 frequencies per axis): at 1024 px the global
    blocks' offsets reach 63 against 13 trained; slot i met new angles iff 100^(-i/16) * 13 < pi."""
    sd = _converted("vit_small_patch16_rope_224", "vitdet_ropevit_s")
    r = diagnose("vitdet_ropevit_s", 1024, checkpoint=sd)
    glob, win = _terms(r)[("RoPE", "global")], _terms(r)[("RoPE", "window")]
    expected = 2 * sum(1 for i in range(16) if 100.0 ** (-i / 16) * 13 < math.pi)
    assert expected == 22 and int(glob.data["new_angles"].sum()) == expected and glob.level == "WARN"
    assert f"{expected} of 32 rotation slots" in glob.text() and win.level == "OK" and r.ok


def test_ropevit_mixed_counts_the_learned_frequencies_of_the_checkpoint():
    """Learned per-head frequency vectors (f_y, f_x): over offsets |dy|, |dx| <= D a slot turns |f_y| D + |f_x| D.
    The doctor reports the global block with the most (head, slot) pairs that stayed under pi at D = 13 and now
    exceed it, read from the converted checkpoint, not from the model's initialization."""
    sd = _converted("vit_small_patch16_rope_mixed_224", "vitdet_ropevit_s", "mixed")
    r = diagnose("vitdet_ropevit_s", 1024, recipe="mixed", checkpoint=sd)
    glob = _terms(r)[("RoPE", "global")]
    rank = {}
    for b in (2, 5, 8, 11):
        f = sd[f"blocks.{b}.attn.rope.freqs"].double()  # (2, heads, R/2): (f_y, f_x)
        turn = f[0].abs() + f[1].abs()
        # (pairs meeting new angles, then the fastest turn per one-token step): the doctor's choice of block
        rank[b] = (int(((turn * 13 < math.pi) & (turn * 63 > turn * 13)).sum()), float(f.abs().max()))
    worst = max(rank, key=rank.get)
    assert int(glob.data["new_angles"].sum()) == rank[worst][0] > 0 and f"block {worst}'s" in glob.text()
    assert "initialization" not in glob.text() and glob.level == "WARN"


def test_eva02_has_the_abs_bug_and_compressed_rope():
    """EVA-02's detection backbone: a 16x16 absolute embedding resized to 64x64 under 16-token windows (the bug);
    RoPE positions rescaled into 16x16: the global blocks step 16/64 (x4 closer), window blocks 16/16 (as trained)."""
    sd = _converted("eva02_small_patch14_224", "vitdet_eva02_s")
    r = diagnose("vitdet_eva02_s", 1024, checkpoint=sd)
    assert not r.ok and r.text().startswith("[BUG]") and r.affected_blocks == [0, 1, 3, 4, 6, 7, 9, 10]
    assert "16x16 -> 64x64" in r.text() and "--to vitdet_eva02_s" in r.fix and "--pos-embed abswin" in r.fix
    glob, win = _terms(r)[("RoPE", "global")], _terms(r)[("RoPE", "window")]
    assert list(glob.data["step_ratio"]) == [16 / 64, 16 / 64] and not glob.data["extrapolates"]
    assert "COMPRESSED" in glob.text() and win.level == "OK"
    assert diagnose("vitdet_eva02_s", 1024, recipe="paper", checkpoint=sd).ok  # the family's abs-win recipe


def test_dinov3_compresses_global_blocks_only():
    """DINOv3: centred coordinates 2 (t + 0.5) / n - 1: global blocks step 2/64 against 2/14 trained."""
    sd = _converted("vit_small_patch16_dinov3", "vitdet_dinov3_s")
    r = diagnose("vitdet_dinov3_s", 1024, checkpoint=sd)
    glob, win = _terms(r)[("RoPE", "global")], _terms(r)[("RoPE", "window")]
    assert r.ok and glob.level == "WARN" and win.level == "OK" and not glob.data["extrapolates"]
    assert [round(v, 6) for v in glob.data["step_ratio"]] == [round(14 / 64, 6)] * 2
