"""DINOv3, EVA-02 and RoPE-ViT through ``winpos-convert``: what is dropped and why, no partial conversion called success,
patch 14 into a stride-16 detector, and the bad inputs (one line each, nothing written)."""
import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open

from tests.bad_inputs_helpers import assert_one_line_error, tool
from tests.checkpoints.test_rope_families import _timm_features, _timm_pair
from tests.conftest import require
from winpos.backbones import create
from winpos.checkpoints import load_external
from winpos.checkpoints.convert import check_no_loss, resample_patch_kernel
from winpos.errors import WinposError


def _save_timm(path, name, **kw):
    timm = require("timm")
    torch.manual_seed(0)
    torch.save(timm.create_model(name, pretrained=False, num_classes=0, **kw).state_dict(), path)
    return path


# ------------------------------------------------------------------------------------------ tokens: dropped, said
def test_prefix_tokens_are_dropped_with_their_reason_and_storage_tokens_count_as_lost():
    full, trunk = _timm_pair("vit_small_patch16_dinov3", 224)
    model = create("vitdet_dinov3_s", window_size=0, img_size=224).eval()
    sd, report = load_external(full.state_dict(), model)
    why = dict(report.unexpected)
    assert "no cls token" in why["cls_token"] and "register / storage tokens" in why["reg_token"]
    assert [k for k, _ in report.lost] == ["reg_token"]  # the cls token is dropped like MAE's, not a loss
    model.load_state_dict(sd, strict=False)
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, without, with_tokens = model(x), _timm_features(trunk, x), _timm_features(full, x)
    # what ViTDet computes is DINOv3's trunk without its prefix tokens; with them the features differ
    assert (ours - without).abs().max() <= 1e-4
    assert (ours - with_tokens).abs().max() > 1e-2


# ------------------------------------------------------------------------------------------ patch 14 -> stride 16
def test_resampled_patch_kernel_sees_each_resized_patch_as_the_old_kernel_saw_it():
    g = torch.Generator().manual_seed(0)
    w14, patches = torch.randn(8, 3, 14, 14, generator=g), torch.randn(5, 3, 14, 14, generator=g)
    w16 = resample_patch_kernel(w14, (16, 16))
    up = F.interpolate(patches, size=(16, 16), mode="bilinear", align_corners=False)
    assert torch.allclose(F.conv2d(up, w16), F.conv2d(patches, w14), atol=1e-4)
    timm_layers = require("timm.layers")  # the same construction (FlexiViT's PI-resize) in timm
    ref = timm_layers.resample_patch_embed(w14, [16, 16], interpolation="bilinear", antialias=False)
    assert torch.allclose(w16, ref, atol=1e-4)


def test_eva02_becomes_a_stride_16_detector_that_sees_each_patch_resized():
    """EVA-02-T's 14 px kernel resampled to 16 px: the stride-16 preset on an image whose 14 px patches are each
    resized to 16 px equals timm's EVA-02 on the original image (the 16 x 16 pretraining grid is kept: 256 px)."""
    full, trunk = _timm_pair("eva02_tiny_patch14_224", 224)
    model = create("vitdet_eva02_t", window_size=0, img_size=256).eval()
    sd, report = load_external(full.state_dict(), model)
    assert "patch kernel resampled (14, 14) -> (16, 16)" in dict(report.reshaped)["patch_embed.proj.weight"]
    assert not report.lost
    model.load_state_dict(sd, strict=False)
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    cells = x.reshape(1, 3, 16, 14, 16, 14).permute(0, 2, 4, 1, 3, 5).reshape(256, 3, 14, 14)
    cells = F.interpolate(cells, size=(16, 16), mode="bilinear", align_corners=False)
    x16 = cells.reshape(1, 16, 16, 3, 16, 16).permute(0, 3, 1, 4, 2, 5).reshape(1, 3, 256, 256)
    with torch.no_grad():
        err = (model(x16) - _timm_features(trunk, x)).abs().max().item()
    assert err <= 1e-4, err


def test_a_shrunk_patch_kernel_is_a_loss():
    full, _ = _timm_pair("eva02_tiny_patch14_224", 224)
    model = create("vitdet_eva02_t", patch_size=8, pretrain_img_size=128, img_size=128)
    _, report = load_external(full.state_dict(), model)
    with pytest.raises(WinposError, match="patch_embed.proj.weight") as e:
        check_no_loss(report)
    assert "\n" not in str(e.value)


# ------------------------------------------------------------------------------------ no partial conversion
def test_convert_dinov3_to_plain_vitdet_b_refuses_and_names_the_loss(tmp_path):
    # a vit_base_patch16_dinov3 of two blocks: the width of ViTDet-B, fast
    src = _save_timm(tmp_path / "dinov3.pth", "vit_base_patch16_dinov3", depth=2)
    out = tmp_path / "out.safetensors"
    res = tool("convert_checkpoint.py", "--input", src, "--output", out, "--to", "vitdet_b", "--recipe", "rope")
    assert_one_line_error(res, "partial", "drop 5 trunk weights of the source", "blocks.0.gamma_1", "reg_token",
                          "leave 122 trunk weights of the target", "blocks.0.attn.qkv.bias", "--allow-loss")
    assert not out.exists()
    res = tool("convert_checkpoint.py", "--input", src, "--output", out, "--to", "vitdet_b", "--recipe", "rope",
               "--allow-loss")
    assert res.returncode == 0, res.stderr[-2000:]
    with safe_open(str(out), "pt") as f:
        lost = f.metadata()["winpos_lost"]
    for name in ("blocks.0.gamma_1", "blocks.1.gamma_2", "reg_token", "blocks.0.attn.qkv.bias", "blocks.11.norm1"):
        assert name in lost, name


def test_convert_into_the_family_presets(tmp_path):
    src = _save_timm(tmp_path / "mixed.pth", "vit_small_patch16_rope_mixed_224")
    out = tmp_path / "mixed.safetensors"
    res = tool("convert_checkpoint.py", "--input", src, "--output", out, "--to", "vitdet_ropevit_s", "--recipe",
               "mixed")
    assert res.returncode == 0, res.stderr[-2000:]
    with safe_open(str(out), "pt") as f:
        assert "winpos_lost" not in f.metadata() and f.get_tensor("blocks.3.attn.rope.freqs").shape == (2, 6, 32)
    # the axial recipe has no place for the learned frequencies: refused
    res = tool("convert_checkpoint.py", "--input", src, "--output", tmp_path / "axial.pth", "--to",
               "vitdet_ropevit_s")
    assert_one_line_error(res, "partial", "rope.freqs")
    assert not (tmp_path / "axial.pth").exists()


# ------------------------------------------------------------------------------------------------ bad input
def test_truncated_file(tmp_path):
    src = _save_timm(tmp_path / "eva.pth", "eva02_tiny_patch14_224")
    data = src.read_bytes()
    src.write_bytes(data[: len(data) // 2])
    out = tmp_path / "o.pth"
    res = tool("convert_checkpoint.py", "--input", src, "--output", out, "--to", "vitdet_eva02_t")
    assert_one_line_error(res, str(src.name))
    assert not out.exists()


def test_another_family_with_the_wrong_format(tmp_path):
    src = _save_timm(tmp_path / "eva.pth", "eva02_tiny_patch14_224")
    out = tmp_path / "o.pth"
    res = tool("convert_checkpoint.py", "--input", src, "--output", out, "--to", "vitdet_eva02_t", "--format",
               "dinov3")
    assert_one_line_error(res, "--format dinov3", "format eva02", "pass --format eva02")
    assert not out.exists()


def test_a_patch_14_checkpoint_for_a_config_that_cannot_take_it(tmp_path):
    # HieraDet's stride-4 convolution stem has no place for a ViT's patch kernel (a shrunk kernel: see above)
    src = _save_timm(tmp_path / "eva.pth", "eva02_tiny_patch14_224")
    out = tmp_path / "o.pth"
    res = tool("convert_checkpoint.py", "--input", src, "--output", out, "--to", "hieradet_t")
    assert_one_line_error(res, "HieraDet")
    assert not out.exists()


def test_a_partial_conversion_names_the_family_preset_that_holds_it():
    full, _ = _timm_pair("vit_small_patch16_dinov3", 224)
    with pytest.raises(WinposError, match=r"leave 12 trunk weights of the target .*blocks\.0\.attn\.qkv\.bias.*"
                                          r"--to vitdet_dinov3_s") as e:
        load_external(full.state_dict(), "vitdet_ropevit_s", allow_loss=False)
    assert "\n" not in str(e.value)
    _, report = load_external(full.state_dict(), "vitdet_ropevit_s")  # the library default accepts and reports it
    assert len(report.lost) == 13


def test_eva02_detection_checkpoint_layout():
    """The authors' EVA-02 detector keeps the trunk under ``backbone.net.`` with its RoPE tables for window and global
    blocks beside it, and the pyramid outside it: the trunk converts as the MIM file does, the rest is reported."""
    from tests.checkpoints.test_rope_families import original_layout

    full, trunk = _timm_pair("eva02_tiny_patch14_224", 224)
    det = {f"backbone.net.{k}": v for k, v in original_layout(full.state_dict(), "eva02", full).items()}
    det["backbone.net.rope_win.freqs_cos"] = torch.ones(256, 64)
    det["backbone.net.rope_glb.freqs_cos"] = torch.ones(4096, 64)
    det["backbone.simfp_2.0.weight"] = torch.zeros(8, 8, 2, 2)
    det["roi_heads.box_predictor.cls_score.weight"] = torch.zeros(81, 8)
    model = create("vitdet_eva02_t", window_size=0, img_size=224, patch_size=14, pretrain_img_size=224).eval()
    sd, report = load_external({"model": det}, model)
    assert report.source == "eva02" and not report.unknown and not report.lost, report.summary()
    assert "detector part outside the ViT trunk" in dict(report.unexpected)["backbone.simfp_2.0.weight"]
    model.load_state_dict(sd, strict=False)
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (model(x) - _timm_features(trunk, x)).abs().max() <= 1e-4
