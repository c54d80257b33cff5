"""One format vocabulary and one detector: ``winpos.checkpoints.formats``.

Every format is built here from the key names and shapes its project saves (the real files' layouts are covered by
the parity tests of each importer and by tests/diagnostics/test_extract.py, which go through the same ``detect``).
"""
import pytest
import torch

from winpos.checkpoints import load_external
from winpos.checkpoints.formats import FORMATS, Format, detect, parse_format
from winpos.errors import WinposError

C = 8


def _hiera_trunk(**extra):
    return {"patch_embed.proj.weight": torch.zeros(C, 3, 7, 7), "blocks.0.attn.qkv.weight": torch.zeros(3 * C, C),
            **extra}


def _vit_trunk(**extra):
    return {"patch_embed.proj.weight": torch.zeros(C, 3, 16, 16), "blocks.0.attn.qkv.weight": torch.zeros(3 * C, C),
            **extra}


CASES = {
    "sam2": {"model": {"image_encoder.trunk.pos_embed": torch.zeros(1, C, 7, 7),
                       "image_encoder.trunk.pos_embed_window": torch.zeros(1, C, 8, 8),
                       "image_encoder.trunk.blocks.0.mlp.layers.0.weight": torch.zeros(4, C)}},
    "hiera": {"model_state": _hiera_trunk(pos_embed=torch.zeros(1, 3136, C), **{"head.projection.weight":
                                                                                 torch.zeros(2, C)})},
    "timm_hiera": _hiera_trunk(pos_embed=torch.zeros(1, 3136, C), **{"head.fc.weight": torch.zeros(2, C)}),
    "timm_abswin": _hiera_trunk(pos_embed=torch.zeros(1, C, 14, 14), pos_embed_win=torch.zeros(1, C, 8, 8)),
    "sam": {f"image_encoder.{k}": v for k, v in _vit_trunk(pos_embed=torch.zeros(1, 64, 64, C)).items()},
    "mae": {"model": _vit_trunk(pos_embed=torch.zeros(1, 197, C), cls_token=torch.zeros(1, 1, C))},
    "detectron2": {"model": {"backbone.net.pos_embed": torch.zeros(1, 197, C),
                             "backbone.net.blocks.0.attn.qkv.weight": torch.zeros(3 * C, C),
                             "roi_heads.box_predictor.cls_score.weight": torch.zeros(2, C)}},
    "winpos": {"backbone.net.pos_embed.global_embed": torch.zeros(1, C, 7, 7),
               "backbone.net.pos_embed.window_embed": torch.zeros(1, C, 8, 8)},
    "lookhere": {"weights": _vit_trunk(), "config": {"head_directions": "corners-triangles-none"}},
    "dinov3": _vit_trunk(cls_token=torch.zeros(1, 1, C), storage_tokens=torch.zeros(1, 4, C)),
    "dinov2": {"patch_embed.proj.weight": torch.zeros(C, 3, 14, 14), "pos_embed": torch.zeros(1, 1370, C),
               "cls_token": torch.zeros(1, 1, C), "blocks.0.ls1.gamma": torch.zeros(C),
               "blocks.0.attn.qkv.weight": torch.zeros(3 * C, C)},
    "eva02": _vit_trunk(pos_embed=torch.zeros(1, 257, C), cls_token=torch.zeros(1, 1, C),
                        **{"blocks.0.attn.q_bias": torch.zeros(C)}),
    "rope_vit": _vit_trunk(cls_token=torch.zeros(1, 1, C), freqs=torch.zeros(2, 12, C // 2)),
    "sam3": {"model": {f"detector.backbone.vision_backbone.trunk.{k}": v for k, v in _vit_trunk(
        pos_embed=torch.zeros(1, 577, C), **{"ln_pre.weight": torch.ones(C)}).items()}},
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_detect_names_every_format(name):
    fmt = detect(CASES[name])
    assert fmt is Format(name) and fmt == name and f"{fmt}" == name and str(fmt) == name


def test_the_cases_cover_the_vocabulary():
    assert sorted(CASES) == sorted(FORMATS)


def test_detect_details():
    assert detect(_vit_trunk(pos_embed=torch.zeros(1, 197, C))) == "mae"  # a cls row without a cls_token
    assert detect(_hiera_trunk()) == "winpos"  # a trunk without any token embedding: winpos pos_embed="none"
    assert detect({"blocks.0.attn.qkv.weight": torch.zeros(3, 1), "pos_embed.pos_embed": torch.zeros(1, 4, 1)}) \
        == "winpos"
    # numpy arrays, as a detectron2 .pkl holds them, are read through the same unwrapper
    np_d2 = {"model": {k: v.numpy() for k, v in CASES["detectron2"]["model"].items()}, "__author__": "x"}
    assert detect(np_d2) == "detectron2"
    with pytest.raises(WinposError, match=r"could not tell the checkpoint's format.*encoder\.layer.*name it"):
        detect({"encoder.layer.0.weight": torch.zeros(2)})
    with pytest.raises(WinposError, match="holds a list"):
        detect([1, 2])


def test_parse_format_one_vocabulary():
    assert parse_format("auto") == "auto"
    assert parse_format("sam2") is Format.SAM2
    assert parse_format("timm_hiera_abswin") is Format.TIMM_ABSWIN  # the diagnostics' older names
    assert parse_format("vitdet") is Format.DETECTRON2
    with pytest.raises(WinposError, match="unknown checkpoint format 'timm'; choose one of auto, sam2"):
        parse_format("timm")
    with pytest.raises(WinposError, match="unknown checkpoint format 'auto'"):
        parse_format("auto", allow_auto=False)
    assert all(f.is_hiera != f.is_vit for f in Format if f != Format.WINPOS)
    assert Format.WINPOS.is_hiera and Format.WINPOS.is_vit


def test_both_command_lines_take_the_same_names():
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("convert_checkpoint", root / "tools" / "convert_checkpoint.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    action = next(a for a in mod.build_parser()._actions if "--format" in a.option_strings)
    assert tuple(action.choices) == ("auto",) + FORMATS
    text = (root / "winpos" / "cli" / "posemb_viz.py").read_text()
    assert '"--format", "--family", dest="format"' in text


def test_load_external_refuses_the_wrong_architecture_by_format():
    with pytest.raises(WinposError, match=r"format mae .* is a plain-ViT checkpoint; it cannot load into HieraDet"):
        load_external(CASES["mae"], "hieradet_toy")
    with pytest.raises(WinposError, match=r"format sam2 .* is a Hiera checkpoint; it cannot load into ViTDet"):
        load_external(CASES["sam2"], "vitdet_toy")
    with pytest.raises(WinposError, match=r"format timm_abswin .* cannot load into ViTDet"):
        load_external(CASES["timm_abswin"], "vitdet_toy", format="timm_hiera_abswin")
