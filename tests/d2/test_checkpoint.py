"""Checkpoints: atomic saves (an interrupted save is never picked up), safe loads, RNG resume, and
train.init_checkpoint from detector, backbone-only and detectron2-ViTDet-named files."""
import os
import pickle
import random

import numpy as np
import pytest
import torch
from detectron2.modeling import SimpleFeaturePyramid
from detectron2.modeling.backbone.fpn import LastLevelMaxPool

from tests.conftest import require
from winpos.d2 import HieraDetBackbone, ViTDetBackbone
from winpos.d2.checkpoint import RNGState, WinposCheckpointer, checkpoint_flags, load_init_checkpoint


class Detector(torch.nn.Module):
    def __init__(self, backbone):
        super().__init__()
        self.backbone = backbone
        self.head = torch.nn.Linear(4, 4)


def _vit_detector():
    net = ViTDetBackbone("vitdet_toy", "original", img_size=64, window_size=4)
    return Detector(SimpleFeaturePyramid(net, "last_feat", 16, (2.0, 1.0), top_block=LastLevelMaxPool(), norm="LN"))


def _randomize(model):
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)
    return model


def _assert_same(a, b):
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        torch.testing.assert_close(x, y, rtol=0, atol=0, msg=name)


def test_interrupted_save_is_never_picked_up(tmp_path, monkeypatch):
    model = _randomize(torch.nn.Linear(3, 3))
    ckpt = WinposCheckpointer(model, str(tmp_path))
    ckpt.save("model_0000009", iteration=9)
    assert ckpt.get_checkpoint_file() == str(tmp_path / "model_0000009.pth")

    def killed_mid_write(obj, f, *a, **k):
        f.write(b"PK\x03\x04 half a zip")
        raise KeyboardInterrupt  # the process is stopped while writing

    monkeypatch.setattr(torch, "save", killed_mid_write)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save("model_0000019", iteration=19)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["last_checkpoint", "model_0000009.pth"]  # no partial file, no tmp
    # a half-written file left by some other writer is not named by last_checkpoint, so resume ignores it
    (tmp_path / "model_0000029.pth").write_bytes(b"PK\x03\x04 truncated")
    fresh = torch.nn.Linear(3, 3)
    extra = WinposCheckpointer(fresh, str(tmp_path)).resume_or_load("", resume=True)
    assert extra["iteration"] == 9
    _assert_same(fresh, model)
    # and if a truncated file is named explicitly, the error says so instead of a pickle traceback
    with pytest.raises(ValueError, match="truncated or corrupt"):
        WinposCheckpointer(fresh).load(str(tmp_path / "model_0000029.pth"))
    (tmp_path / "last_checkpoint").write_text("model_0000099.pth")
    with pytest.raises(ValueError, match="does not exist"):
        WinposCheckpointer(fresh, str(tmp_path)).get_checkpoint_file()
    # an empty last_checkpoint names nothing: said so (it used to read as "names <the folder>, which does not exist")
    (tmp_path / "last_checkpoint").write_text(" \n")
    with pytest.raises(ValueError, match="last_checkpoint is empty, so it names no checkpoint.*delete it"):
        WinposCheckpointer(fresh, str(tmp_path)).resume_or_load("", resume=True)


def test_rng_state_roundtrip_through_a_checkpoint(tmp_path):
    model = torch.nn.Linear(2, 2)
    ckpt = WinposCheckpointer(model, str(tmp_path), rng=RNGState())
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    ckpt.save("model_0000000", iteration=0)
    draws = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(7), np.random.seed(7), random.seed(7)
    WinposCheckpointer(model, str(tmp_path), rng=RNGState()).resume_or_load("", resume=True)
    again = (torch.rand(3), np.random.rand(3), random.random())
    torch.testing.assert_close(draws[0], again[0])
    np.testing.assert_array_equal(draws[1], again[1])
    assert draws[2] == again[2]


class _Evil:
    def __reduce__(self):
        return (open, ("/tmp/winpos_evil_marker", "w"))


def test_loading_never_executes_pickled_code(tmp_path):
    marker = "/tmp/winpos_evil_marker"
    if os.path.exists(marker):
        os.remove(marker)
    bad = tmp_path / "evil.pkl"
    bad.write_bytes(pickle.dumps({"model": {"w": _Evil()}}))
    with pytest.raises(ValueError, match="won't execute"):
        WinposCheckpointer(torch.nn.Linear(2, 2)).load(str(bad))
    bad_pth = tmp_path / "evil.pth"
    torch.save({"model": {"w": _Evil()}}, bad_pth)
    with pytest.raises(ValueError, match="won't execute"):
        load_init_checkpoint(WinposCheckpointer(_vit_detector()), str(bad_pth))
    assert not os.path.exists(marker)


def test_init_from_a_detector_checkpoint(tmp_path):
    src = _randomize(_vit_detector())
    WinposCheckpointer(src, str(tmp_path)).save("model_final")
    dst = _vit_detector()
    msg = load_init_checkpoint(WinposCheckpointer(dst), str(tmp_path / "model_final.pth"))
    assert "detector checkpoint" in msg
    _assert_same(dst, src)


def test_a_detector_of_another_class_count_loads_all_but_its_class_layers_and_says_which():
    """The shipped one-class detector into the four-class model: the six class tensors keep their initialisation,
    the report names each with both shapes, every other tensor is the checkpoint's."""
    from winpos.d2.config import load_config
    from winpos.d2.engine import build_model
    from winpos.model_zoo import config_path, demo_checkpoint

    cfg = load_config(config_path("shapes/reproduce_hieradet.py"), ["train.device=cpu", "model.roi_heads.num_classes=4"])
    torch.manual_seed(0)
    model = build_model(cfg)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    msg = load_init_checkpoint(WinposCheckpointer(model), str(demo_checkpoint()))
    assert "6 tensor(s) have another shape in this model and keep their initialisation" in msg
    assert "roi_heads.box_predictor.cls_score.weight (2, 256) -> (5, 256)" in msg
    assert "roi_heads.mask_head.predictor.weight (1, 64, 1, 1) -> (4, 64, 1, 1)" in msg
    sd = torch.load(demo_checkpoint(), map_location="cpu", weights_only=True)["model"]
    after = model.state_dict()
    kept = [k for k in after if k in sd and sd[k].shape != after[k].shape]
    assert len(kept) == 6 and all(torch.equal(after[k], before[k]) for k in kept)
    assert all(torch.equal(after[k], sd[k].float()) for k in after if k in sd and k not in kept)


def test_init_from_backbone_and_detectron2_vitdet_names(tmp_path):
    src = _randomize(_vit_detector())
    # backbone-only file with the plain model's names -> the winpos ViTDet importer
    torch.save(src.backbone.net.net.state_dict(), tmp_path / "trunk.pth")
    dst = _vit_detector()
    msg = load_init_checkpoint(WinposCheckpointer(dst), str(tmp_path / "trunk.pth"))
    assert "winpos importer" in msg
    _assert_same(dst.backbone.net.net, src.backbone.net.net)
    # a whole detector with detectron2 ViTDet's names (backbone.net.<trunk>, flat pos_embed) -> trunk converted,
    # pyramid and head loaded by name
    d2 = {}
    for k, v in src.state_dict().items():
        if k.startswith("backbone.net.net."):
            k = "backbone.net." + k[len("backbone.net.net."):].replace("pos_embed.pos_embed", "pos_embed")
        d2[k] = v
    torch.save({"model": d2}, tmp_path / "d2_vitdet.pth")
    dst = _vit_detector()
    load_init_checkpoint(WinposCheckpointer(dst), str(tmp_path / "d2_vitdet.pth?matching_heuristics=True"))
    _assert_same(dst, src)


def test_init_hieradet_and_errors(tmp_path):
    make = lambda: Detector(HieraDetBackbone("hieradet_toy", img_size=64, window_spec=(8, 4, 4, 2)))  # noqa: E731
    src = _randomize(make())
    torch.save({"model_state": src.backbone.net.state_dict()}, tmp_path / "hiera.pth")
    dst = make()
    load_init_checkpoint(WinposCheckpointer(dst), str(tmp_path / "hiera.pth"))
    _assert_same(dst.backbone.net, src.backbone.net)
    torch.save({"something.else": torch.zeros(3)}, tmp_path / "junk.pth")
    with pytest.raises(ValueError):
        load_init_checkpoint(WinposCheckpointer(make()), str(tmp_path / "junk.pth"))
    with pytest.raises(FileNotFoundError):
        load_init_checkpoint(WinposCheckpointer(make()), str(tmp_path / "missing.pth"))
    assert checkpoint_flags("a/b.pth?matching_heuristics=True") == (
        "a/b.pth", {"matching_heuristics": True, "allow_loss": False, "allow_other_settings": False})
    with pytest.raises(ValueError, match="unsupported query"):
        checkpoint_flags("a/b.pth?foo=1")


def test_a_partial_backbone_checkpoint_is_refused_unless_the_path_accepts_the_loss(tmp_path):
    """A trunk file missing two blocks would leave them at their initialization: refused as winpos-convert refuses
    it, naming the blocks and '?allow_loss=True'; with the flag it loads, and the report says LOST."""
    src = _randomize(_vit_detector())
    trunk = {k: v for k, v in src.backbone.net.net.state_dict().items() if not k.startswith(("blocks.2.", "blocks.3."))}
    torch.save(trunk, tmp_path / "short.pth")
    dst = _vit_detector()
    before = {k: v.clone() for k, v in dst.state_dict().items()}
    path = str(tmp_path / "short.pth")
    with pytest.raises(ValueError, match=r"partial.*blocks\.2\..*" + "short.pth" + r"\?allow_loss=True"):
        load_init_checkpoint(WinposCheckpointer(dst), path)
    assert all(torch.equal(v, dst.state_dict()[k]) for k, v in before.items())  # refused before loading anything
    msg = load_init_checkpoint(WinposCheckpointer(dst), path + "?allow_loss=True")
    assert "LOST" in msg
    torch.testing.assert_close(dst.backbone.net.net.blocks[0].attn.qkv.weight,
                               src.backbone.net.net.blocks[0].attn.qkv.weight, rtol=0, atol=0)


@pytest.mark.parametrize("path,message", [
    ("a/b.pth?allow_loss=maybe", "neither True nor False"),
    ("a/b.pth?strict=True", "unsupported query"),
])
def test_checkpoint_path_flags_are_checked(path, message):
    with pytest.raises(ValueError, match=message):
        checkpoint_flags(path)
    assert checkpoint_flags("a/b.pth?allow_loss=True&matching_heuristics=true") == (
        "a/b.pth", {"matching_heuristics": True, "allow_loss": True, "allow_other_settings": False})
    assert checkpoint_flags("a/b.pth?allow_other_settings=True") == (
        "a/b.pth", {"matching_heuristics": False, "allow_loss": False, "allow_other_settings": True})
    assert checkpoint_flags("a/b.pth") == ("a/b.pth", dict.fromkeys(
        ("matching_heuristics", "allow_loss", "allow_other_settings"), False))


def test_init_from_a_hugging_face_transformers_file(tmp_path):
    """``train.init_checkpoint`` = a ViTDet as transformers' ``save_pretrained`` writes it (``model.safetensors``):
    the trunk converted by the winpos importer, equal to transformers' forward on the same weights."""
    transformers = require("transformers")
    cfg = transformers.VitDetConfig(hidden_size=96, num_hidden_layers=4, num_attention_heads=3, image_size=64,
                                    pretrain_image_size=224, patch_size=16, window_size=4, window_block_indices=[0, 2],
                                    use_relative_position_embeddings=True)
    hf = _randomize(transformers.VitDetModel(cfg)).eval()
    hf.save_pretrained(tmp_path / "hub")
    x = torch.randn(1, 3, 64, 64)
    for path in (tmp_path / "hub" / "model.safetensors", tmp_path / "hub"):  # the file, or the folder holding it
        dst = _vit_detector()
        msg = load_init_checkpoint(WinposCheckpointer(dst), str(path))
        assert "winpos importer (detectron2 (Hugging Face transformers names))" in msg, msg
        with torch.no_grad():
            torch.testing.assert_close(dst.backbone.net.net.eval()(x), hf(x).last_hidden_state, rtol=1e-4, atol=1e-4)


def test_a_trunk_at_another_pretraining_grid_names_the_config_keys_that_fit_it(tmp_path):
    """A SAM-like trunk (its embedding a 4x4 grid without a cls row, at 64 px) into a detector built with the preset's
    14x14 grid with one: refused, naming the two keys of the config's backbone node; built with them, it loads."""
    def make(**kw):
        net = ViTDetBackbone("vitdet_toy", "original", img_size=64, window_size=4, **kw)
        return Detector(SimpleFeaturePyramid(net, "last_feat", 16, (2.0, 1.0), top_block=LastLevelMaxPool(), norm="LN"))

    grid = dict(pretrain_img_size=64, pretrain_use_cls_token=False)
    src = _randomize(make(**grid))
    torch.save(src.backbone.net.net.state_dict(), tmp_path / "sam_like.pth")
    with pytest.raises(ValueError, match="model.backbone.net.pretrain_img_size=64 "
                                         "model.backbone.net.pretrain_use_cls_token=False"):
        load_init_checkpoint(WinposCheckpointer(make()), str(tmp_path / "sam_like.pth"))
    dst = make(**grid)
    load_init_checkpoint(WinposCheckpointer(dst), str(tmp_path / "sam_like.pth"))
    _assert_same(dst.backbone.net.net, src.backbone.net.net)


LOOKHERE_90 = {"kind": "lookhere", "lookhere": {"variant": "90", "global_slope": 1.5, "slope_units": "official"}}


def _detector(recipe, **kw):
    net = ViTDetBackbone("vitdet_toy", recipe, img_size=64, window_size=4, **kw)
    return Detector(SimpleFeaturePyramid(net, "last_feat", 16, (2.0, 1.0), top_block=LastLevelMaxPool(), norm="LN"))


def test_a_converted_file_recorded_for_other_settings_is_refused_unless_on_purpose(tmp_path):
    """A LookHere trunk that winpos-convert recorded with variant 90 and its own slope, as ``train.init_checkpoint``
    of a detector built with the recipe's defaults (variant 45): its tensors fit by name and shape, so only the
    record tells. Refused before anything loads, naming the setting, the config's backbone keys and the flag; the
    detector built as recorded loads it exactly; ``?allow_other_settings=True`` loads it and the report says so."""
    import json

    from safetensors.torch import save_file

    src = _randomize(_detector("lookhere", window_pos=LOOKHERE_90))
    path = tmp_path / "lh.safetensors"
    save_file({k: v.contiguous() for k, v in src.backbone.net.net.state_dict().items()}, str(path),
              metadata={"winpos_preset": "vitdet_toy", "winpos_recipe": "lookhere",
                        "winpos_kwargs": json.dumps({"img_size": 64, "window_size": 4, "window_pos": LOOKHERE_90})})
    dst = _detector("lookhere")
    before = {k: v.clone() for k, v in dst.state_dict().items()}
    with pytest.raises(ValueError, match=r"LookHere variant '90' in the recorded build, '45' in this model.*"
                                         r"model\.backbone\.net\.net, model\.backbone\.net\.recipe.*"
                                         r"lh\.safetensors\?allow_other_settings=True"):
        load_init_checkpoint(WinposCheckpointer(dst), str(path))
    assert all(torch.equal(v, dst.state_dict()[k]) for k, v in before.items())
    same = _detector("lookhere", window_pos=LOOKHERE_90)
    load_init_checkpoint(WinposCheckpointer(same), str(path))
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(same.backbone.net.net.eval()(x), src.backbone.net.net.eval()(x), rtol=0, atol=0)
    msg = load_init_checkpoint(WinposCheckpointer(dst), str(path) + "?allow_other_settings=True")
    assert "on purpose (?allow_other_settings=True): LookHere variant '90'" in msg, msg


def test_a_runs_checkpoint_is_checked_against_the_config_beside_it(tmp_path):
    """A winpos-train output folder: model_final.pth with its config.yaml, whose backbone node built RoPE at base
    10000. Into a detector at the recipe's base (100) it is refused naming the base; the run's own build loads it."""
    rope = {"kind": "rope", "rope": {"base": 10000.0}}
    src = _randomize(_detector("rope", window_pos=rope, global_pos=rope))
    run = tmp_path / "run"
    run.mkdir()
    torch.save({"model": src.state_dict(), "iteration": 9}, run / "model_final.pth")
    (run / "config.yaml").write_text(
        "model:\n  backbone:\n    _target_: detectron2.modeling.SimpleFeaturePyramid\n    net:\n"
        "      _target_: winpos.d2.backbone.ViTDetBackbone\n      net: vitdet_toy\n      recipe: rope\n"
        "      img_size: 64\n      window_size: 4\n"
        "      window_pos: {kind: rope, rope: {base: 10000.0}}\n      global_pos: {kind: rope, rope: {base: 10000.0}}\n")
    with pytest.raises(ValueError, match=r"RoPE base 10000\.0 in the recorded build, 100\.0 in this model.*"
                                         r"the run's .*config\.yaml"):
        load_init_checkpoint(WinposCheckpointer(_detector("rope")), str(run / "model_final.pth"))
    dst = _detector("rope", window_pos=rope, global_pos=rope)
    msg = load_init_checkpoint(WinposCheckpointer(dst), str(run / "model_final.pth"))
    assert "as a detector checkpoint" in msg and "on purpose" not in msg
    _assert_same(dst, src)


def test_a_runs_config_this_winpos_cannot_rebuild_loads_as_before_and_says_so(tmp_path):
    """The run's config.yaml names a backbone argument this winpos does not take: the checkpoint loads as a
    detector checkpoint as before, and the report says the settings were not compared."""
    src = _randomize(_detector("rope"))
    run = tmp_path / "run"
    run.mkdir()
    torch.save({"model": src.state_dict()}, run / "model_final.pth")
    (run / "config.yaml").write_text("model:\n  backbone:\n    net:\n      net: vitdet_toy\n      recipe: rope\n"
                                     "      img_size: 64\n      window_size: 4\n      no_such_argument: 1\n")
    dst = _detector("rope")
    msg = load_init_checkpoint(WinposCheckpointer(dst), str(run / "model_final.pth"))
    assert "settings not compared: the build the run's" in msg and "no_such_argument" in msg, msg
    _assert_same(dst, src)
