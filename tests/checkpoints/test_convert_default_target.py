"""What ``winpos-convert`` chooses for the target. Without ``--to``: the preset comes from what the file records (winpos-convert's output), else
from the checkpoint's trunk width and depth (the family's own presets first); a checkpoint no preset fits is
refused in one line that names its width and depth. The chosen preset is the one an explicit ``--to`` gives: the
outputs are equal tensor for tensor. ``--pos-global-size`` keeps SAM's 64x64 grid exact in a ViTDet abs-win target,
and is refused for a target without an abs-win embedding."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from tests.conftest import require
from tests.helpers import randomize
from winpos.backbones import create
from winpos.backbones.vitdet import ViTDet
from winpos.cli.convert_checkpoint import main
from winpos.errors import WinposError


def _sam_toy_file(tmp_path):
    """A segment-anything image encoder of vitdet_toy's width and depth (96 x 4), at 256 px: its 16x16 embedding
    has no cls row, so the target also needs the checkpoint's pretraining grid."""
    require("segment_anything")
    from segment_anything.modeling.image_encoder import ImageEncoderViT

    torch.manual_seed(0)
    enc = randomize(ImageEncoderViT(img_size=256, patch_size=16, embed_dim=96, depth=4, num_heads=3, out_chans=16,
                                    use_rel_pos=True, window_size=14, global_attn_indexes=(1, 3)))
    path = tmp_path / "sam_toy.pth"
    torch.save({"model": {f"image_encoder.{k}": v for k, v in enc.state_dict().items()}}, path)
    return path


def _meta(path) -> dict:
    with safe_open(str(path), "pt") as f:
        return f.metadata()


def test_without_to_the_preset_that_fits_the_trunk_is_taken(tmp_path, capsys):
    src = _sam_toy_file(tmp_path)
    chosen, named = tmp_path / "chosen.safetensors", tmp_path / "named.safetensors"
    assert main(["--input", str(src), "--output", str(chosen), "--img-size", "256"]) == 0
    out = capsys.readouterr().out
    assert "--to vitdet_toy: the sam checkpoint's width 96 and 4 blocks fit it" in out
    assert "target built with pretrain_img_size=256, pretrain_use_cls_token=False" in out
    assert main(["--input", str(src), "--output", str(named), "--img-size", "256", "--to", "vitdet_toy"]) == 0
    a, b = load_file(str(chosen)), load_file(str(named))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    meta = _meta(chosen)
    assert meta["winpos_preset"] == "vitdet_toy" and meta == _meta(named)
    model = create("vitdet_toy", **json.loads(meta["winpos_kwargs"]))
    result = model.load_state_dict(a, strict=False)
    assert not result.missing_keys and not result.unexpected_keys


def test_without_to_a_converted_file_converts_into_its_recorded_preset(tmp_path, capsys):
    """A winpos-convert output read again (here into recipe ``paper``) keeps the preset it records."""
    src = _sam_toy_file(tmp_path)
    first, second = tmp_path / "abs.safetensors", tmp_path / "paper.safetensors"
    assert main(["--input", str(src), "--output", str(first), "--img-size", "256", "--to", "vitdet_toy"]) == 0
    capsys.readouterr()
    assert main(["--input", str(first), "--output", str(second), "--recipe", "paper",
                 "--set", "pretrain_img_size=256", "--set", "pretrain_use_cls_token=False"]) == 0
    out = capsys.readouterr().out
    assert f"--to vitdet_toy: the preset {first} records (winpos_preset)" in out
    assert _meta(second)["winpos_preset"] == "vitdet_toy" and _meta(second)["winpos_recipe"] == "paper"
    model = create("vitdet_toy", recipe="paper", pretrain_img_size=256, pretrain_use_cls_token=False)
    result = model.load_state_dict(load_file(str(second)), strict=False)
    assert not result.missing_keys and not result.unexpected_keys


def test_without_to_a_hiera_file_fits_the_hieradet_preset(tmp_path, capsys):
    torch.manual_seed(0)
    net = create("hieradet_toy")
    src, out = tmp_path / "hiera.pth", tmp_path / "hiera.safetensors"
    torch.save(net.state_dict(), src)
    assert main(["--input", str(src), "--output", str(out)]) == 0
    assert "--to hieradet_toy: the winpos checkpoint's width 32 and 5 blocks fit it" in capsys.readouterr().out
    got = load_file(str(out))
    assert all(torch.equal(got[k], v) for k, v in net.state_dict().items())


def test_without_to_a_trunk_no_preset_fits_is_refused_naming_its_sizes(tmp_path, capsys):
    net = ViTDet(img_size=64, embed_dim=40, depth=2, num_heads=2, window_size=4, global_blocks=(1,))
    src, out = tmp_path / "odd.pth", tmp_path / "odd.safetensors"
    torch.save(net.state_dict(), src)
    assert main(["--input", str(src), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "no winpos preset fits this winpos checkpoint (width 40 and 2 blocks); name one with --to" in err
    assert err.count("\n") == 1 and not out.exists()


def test_fitting_presets_puts_the_familys_own_first():
    """A DINOv2-B trunk is also a plain ViT-B by width and depth: its own preset (LayerScale, 14 px kernel) first."""
    require("timm")
    import timm

    from winpos.checkpoints import fitting_presets

    sd = timm.create_model("vit_base_patch14_dinov2", pretrained=False, img_size=224).state_dict()
    fmt, width, depth, found = fitting_presets(sd)
    assert (str(fmt), width, depth, found) == ("dinov2", 768, 12, ["vitdet_dinov2_b", "vitdet_b"])
    with pytest.raises(WinposError, match="width 96 and 4 blocks"):  # the hint a wrong --to gets, from the same table
        from winpos.checkpoints import load_external

        load_external(create("vitdet_toy").state_dict(), "vitdet_b", format="winpos")


@pytest.mark.parametrize("model,first", [("vit_small_patch16_dinov3", "vitdet_dinov3_s"),
                                         ("vit_small_plus_patch16_dinov3", "vitdet_dinov3_splus")])
def test_presets_of_the_same_width_and_depth_are_told_apart_by_their_tensors(model, first):
    """DINOv3 S and S+ are both 384 wide and 12 blocks deep; S+ has a SwiGLU MLP: the preset whose tensors have the
    file's shapes comes first, so that ``winpos-convert`` without ``--to`` takes it."""
    require("timm")
    import timm

    from winpos.checkpoints import fitting_presets

    sd = timm.create_model(model, pretrained=False).state_dict()
    fmt, width, depth, found = fitting_presets(sd)
    assert (str(fmt), width, depth) == ("dinov3", 384, 12)
    assert found[0] == first and sorted(found) == ["vitdet_dinov3_s", "vitdet_dinov3_splus"]


def test_pos_global_size_keeps_sams_grid_exact_in_a_vitdet_abswin_target(tmp_path, capsys):
    """SAM's 64x64 embedding into recipe ``paper`` (abs-win, 14-token windows): by default the global part is
    resized to the preset's 14x14 (lossy, reported); with ``--pos-global-size 64`` it is kept, and the abs-win
    embedding the target builds at 1024 px equals SAM's own to float rounding."""
    require("segment_anything")
    from segment_anything.modeling.image_encoder import ImageEncoderViT

    torch.manual_seed(0)
    sam = ImageEncoderViT(img_size=1024, patch_size=16, embed_dim=96, depth=4, num_heads=3, out_chans=16,
                          use_rel_pos=True, window_size=14, global_attn_indexes=(1, 3))
    torch.nn.init.normal_(sam.pos_embed, std=0.5)
    src = tmp_path / "sam.pth"
    torch.save({f"image_encoder.{k}": v for k, v in sam.state_dict().items()}, src)
    lossy, exact = tmp_path / "lossy.safetensors", tmp_path / "exact.safetensors"
    assert main(["--input", str(src), "--output", str(lossy), "--recipe", "paper"]) == 0
    assert "global embedding resized (64, 64) -> (14, 14)" in capsys.readouterr().out
    assert main(["--input", str(src), "--output", str(exact), "--recipe", "paper", "--pos-global-size", "64"]) == 0
    out = capsys.readouterr().out
    assert "resized" not in out and "pos_global_size=64" in out
    model = create("vitdet_toy", recipe="paper", pos_global_size=64, img_size=1024)
    result = model.load_state_dict(load_file(str(exact)), strict=False)
    assert not result.missing_keys and not result.unexpected_keys
    with torch.no_grad():
        built = model.pos_embed((64, 64))  # (1, H, W, C), as SAM stores its embedding
    torch.testing.assert_close(built, sam.pos_embed.detach(), rtol=0, atol=1e-5)
    # a target without an abs-win embedding has no global grid to size
    assert main(["--input", str(src), "--output", str(tmp_path / "abs.safetensors"), "--pos-global-size", "64"]) == 2
    assert "--pos-global-size sizes an abs-win embedding's global grid, but vitdet_toy with recipe 'original' has " \
           "none" in capsys.readouterr().err
    assert not (tmp_path / "abs.safetensors").exists()
