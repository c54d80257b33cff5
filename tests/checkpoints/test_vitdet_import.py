"""Foreign ViT weights in winpos ViTDet: parity with detectron2 ``ViT``, segment-anything ``ImageEncoderViT`` and a
timm (MAE-layout) ViT after conversion, exact abs -> abs-win conversion, relpos resampling, and clear errors."""
import pickle
from functools import partial

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.conftest import require
from tests.helpers import randomize
from winpos.backbones.vitdet import ViTDet
from winpos.checkpoints.vitdet import (
    convert_detectron2_vit, convert_mae_vit, convert_sam_image_encoder, vit_format, load_vitdet_checkpoint,
    load_vitdet_weights,
)

LN = partial(nn.LayerNorm, eps=1e-6)
TINY = dict(embed_dim=32, depth=3, num_heads=2)


def d2_vit(img_size=1024, window_size=14, **kw):
    vit = require("detectron2.modeling.backbone.vit")
    args = dict(img_size=img_size, norm_layer=LN, use_rel_pos=True, window_size=window_size,
                window_block_indexes=[0, 2], **TINY)
    return randomize(vit.ViT(**{**args, **kw}))


def assert_parity(ref, ours, label):
    err = (ref - ours).abs().max().item()
    scale = ref.abs().max().item()
    print(f"{label}: max abs err {err:.3g}, max rel err {err / scale:.3g}")
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4 * scale)


@pytest.fixture(scope="module")
def d2_pair():
    torch.manual_seed(0)
    ref = d2_vit()
    ours = ViTDet(img_size=1024, global_blocks=(1,), **TINY).eval()
    # A detectron2 model-zoo .pkl holds numpy arrays under "model" with the "backbone.net." prefix.
    pkl = {"model": {f"backbone.net.{k}": v.numpy() for k, v in ref.state_dict().items()}, "__author__": "test"}
    pkl["model"]["backbone.simfp_2.0.weight"] = torch.zeros(3).numpy()
    report = load_vitdet_weights(ours, pkl)
    return ref, ours, report, pkl


@pytest.mark.parametrize("hw", [(1024, 1024), (512, 768), (224, 224)])
def test_detectron2_parity(d2_pair, hw):
    ref, ours, report, _ = d2_pair
    assert report.source == "detectron2" and not report.missing and not report.unknown
    assert [k for k, _ in report.unexpected] == ["backbone.simfp_2.0.weight"]
    x = torch.randn(1, 3, *hw)
    with torch.no_grad():
        assert_parity(ref(x)["last_feat"], ours(x), f"detectron2 ViT {hw}")


def test_detectron2_parity_is_sensitive_to_relpos(d2_pair):
    ref, ours, _, _ = d2_pair
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        a = ref(x)["last_feat"]
        ours.blocks[1].attn.rel_pos_h.mul_(-1)
        try:
            assert (ours(x) - a).abs().max() > 1e-2 * a.abs().max()
        finally:
            ours.blocks[1].attn.rel_pos_h.mul_(-1)


def test_pkl_file_roundtrip(d2_pair, tmp_path):
    ref, _, _, pkl = d2_pair
    path = tmp_path / "model_final.pkl"
    path.write_bytes(pickle.dumps(pkl))
    ours = ViTDet(img_size=1024, global_blocks=(1,), **TINY).eval()
    report = load_vitdet_checkpoint(ours, path)
    # every tensor loads; the one renamed (detectron2's flat pos_embed -> winpos pos_embed.pos_embed) is converted
    assert report.source == "detectron2" and len(report.matched) == len(ref.state_dict()) - 1
    assert report.converted == [("pos_embed.pos_embed", "renamed from 'backbone.net.pos_embed'")]
    x = torch.randn(1, 3, 224, 320)
    with torch.no_grad():
        assert_parity(ref(x)["last_feat"], ours(x), "detectron2 .pkl")


def sam_trunk(enc, x):
    """segment-anything ``ImageEncoderViT.forward`` up to (not including) the neck."""
    t = enc.patch_embed(x)
    t = t + enc.pos_embed
    for blk in enc.blocks:
        t = blk(t)
    return t.permute(0, 3, 1, 2)


@pytest.fixture(scope="module")
def sam_encoder():
    torch.manual_seed(1)
    ie = require("segment_anything.modeling.image_encoder")
    enc = ie.ImageEncoderViT(img_size=1024, norm_layer=LN, use_rel_pos=True, window_size=14,
                             global_attn_indexes=(1,), **TINY)
    return randomize(enc)


def test_sam_parity(sam_encoder):
    sd = {f"image_encoder.{k}": v for k, v in sam_encoder.state_dict().items()}
    sd["prompt_encoder.pe_layer.positional_encoding_gaussian_matrix"] = torch.zeros(2, 128)
    ours = ViTDet(img_size=1024, global_blocks=(1,), pretrain_img_size=1024, pretrain_use_cls_token=False,
                  **TINY).eval()
    assert vit_format(sd) == "sam"
    report = load_vitdet_weights(ours, sd)
    ignored = {k for k, _ in report.unexpected}
    assert ignored == {k for k in sd if ".neck." in k or k.startswith("prompt_encoder.")}
    converted = dict(report.converted)
    assert converted.pop("pos_embed.pos_embed") == "NHWC grid flattened row-major" and not report.missing
    assert converted == {k.replace(".lin", ".fc"): f"renamed from 'image_encoder.{k}'" for k in sam_encoder.state_dict()
                         if ".mlp.lin" in k}
    x = torch.randn(1, 3, 1024, 1024)
    with torch.no_grad():
        assert_parity(sam_trunk(sam_encoder, x), ours(x), "SAM ImageEncoderViT trunk 1024")


def test_sam_to_abswin_exact_with_full_global(sam_encoder):
    """abs_to_abswin with w=14 on SAM's 64x64 grid keeps the residual at 64x64: the model reproduces SAM."""
    ours = ViTDet(img_size=1024, global_blocks=(1,), pos_embed="abswin", pos_global_size=64, **TINY).eval()
    _, report = convert_sam_image_encoder(sam_encoder.state_dict(), ours)
    load_vitdet_weights(ours, sam_encoder.state_dict(), source="sam")
    assert not report.reshaped
    x = torch.randn(1, 3, 1024, 1024)
    with torch.no_grad():
        assert_parity(sam_trunk(sam_encoder, x), ours(x), "SAM -> abswin(global 64)")
        # the window part is the mean of SAM's 16 full 14x14 tiles
        tiles = sam_encoder.pos_embed[0, :56, :56].reshape(4, 14, 4, 14, -1).mean(dim=(0, 2))
        torch.testing.assert_close(ours.pos_embed.window_embed[0].permute(1, 2, 0), tiles, rtol=0, atol=1e-6)


@pytest.mark.parametrize("pos", ["abswin", "abswin_recursive"])
def test_sam_to_abswin_small_global_is_reported_lossy(sam_encoder, pos):
    ours = ViTDet(img_size=1024, global_blocks=(1,), pos_embed=pos, **TINY)
    _, report = convert_sam_image_encoder(sam_encoder.state_dict(), ours)
    assert [k for k, _ in report.reshaped] == ["pos_embed.global_embed"]
    assert "lossy" in report.reshaped[0][1]


def test_abs_to_abswin_equals_source_at_224_and_tiles_at_1024(d2_pair):
    ref, _, _, pkl = d2_pair
    ours = ViTDet(img_size=1024, global_blocks=(1,), pos_embed="abswin", **TINY).eval()
    report = load_vitdet_weights(ours, pkl)
    assert {k for k, _ in report.converted} == {"pos_embed.window_embed", "pos_embed.global_embed"}
    assert not ours.pos_embed.global_embed.any()
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        assert_parity(ref(x)["last_feat"], ours(x), "abs->abswin at 224")
        grid = ref.pos_embed[0, 1:].reshape(14, 14, -1)
        emb = ours.pos_embed((64, 64))[0]  # (64, 64, C)
        for i in range(0, 64, 14):
            for j in range(0, 64, 14):
                win = emb[i:i + 14, j:j + 14]
                torch.testing.assert_close(win, grid[:win.shape[0], :win.shape[1]], rtol=0, atol=0)
        # detectron2's naive interpolation gives windows different embeddings: the bug abs-win removes
        naive = F.interpolate(grid.permute(2, 0, 1)[None], size=(64, 64), mode="bicubic")[0].permute(1, 2, 0)
        assert (naive[:14, :14] - naive[14:28, 14:28]).abs().max() > 0.1


@pytest.mark.parametrize("recipe_pos", [("abswin", "none"), ("abswin_recursive", "relpos")])
def test_paper_recipe_from_detectron2(d2_pair, recipe_pos):
    """Window relpos is dropped (reported); at 224 the model equals detectron2 with zeroed window relpos."""
    ref, _, _, _ = d2_pair
    pos, window_pos = recipe_pos
    ours = ViTDet(img_size=1024, global_blocks=(1,), pos_embed=pos, window_pos=window_pos, **TINY).eval()
    report = load_vitdet_weights(ours, ref.state_dict())
    dropped = {k for k, why in report.unexpected if "not relpos" in why}
    assert dropped == ({"blocks.0.attn.rel_pos_h", "blocks.0.attn.rel_pos_w", "blocks.2.attn.rel_pos_h",
                        "blocks.2.attn.rel_pos_w"} if window_pos == "none" else set())
    oracle = d2_vit()
    oracle.load_state_dict(ref.state_dict())
    with torch.no_grad():
        if window_pos == "none":
            for i in (0, 2):
                oracle.blocks[i].attn.rel_pos_h.zero_()
                oracle.blocks[i].attn.rel_pos_w.zero_()
        x = torch.randn(1, 3, 224, 224)
        assert_parity(oracle(x)["last_feat"], ours(x), f"{pos}/{window_pos} at 224")


def test_relpos_resampled_to_new_training_size(d2_pair):
    """A 1024 checkpoint (global tables 127) in an img_size=512 model: tables resampled to 63, same outputs."""
    ref, _, _, _ = d2_pair
    ours = ViTDet(img_size=512, global_blocks=(1,), **TINY).eval()
    report = load_vitdet_weights(ours, ref.state_dict())
    assert {k for k, _ in report.reshaped} == {"blocks.1.attn.rel_pos_h", "blocks.1.attn.rel_pos_w"}
    assert ours.blocks[1].attn.rel_pos_h.shape[0] == 63
    x = torch.randn(1, 3, 512, 512)
    with torch.no_grad():
        assert_parity(ref(x)["last_feat"], ours(x), "relpos 127 -> 63 at 512")


def test_relpos_resampled_to_new_window(d2_pair):
    ref, _, _, _ = d2_pair
    ours = ViTDet(img_size=1024, window_size=8, global_blocks=(1,), pos_embed="abs", **TINY).eval()
    load_vitdet_weights(ours, ref.state_dict())
    oracle = d2_vit(window_size=8)
    sd = dict(ref.state_dict())
    for i in (0, 2):  # independent linear resampling of the window tables 27 -> 15
        for a in "hw":
            t = sd[f"blocks.{i}.attn.rel_pos_{a}"]
            sd[f"blocks.{i}.attn.rel_pos_{a}"] = F.interpolate(t.t()[None], size=15, mode="linear")[0].t()
    oracle.load_state_dict(sd)
    x = torch.randn(1, 3, 256, 320)
    with torch.no_grad():
        assert_parity(oracle(x)["last_feat"], ours(x), "relpos window 14 -> 8")


def test_mae_layout_parity_with_timm():
    """MAE/timm encoder weights (cls token, final norm, head): trunk equals timm's cls-free ViT at 224."""
    vt = require("timm.models.vision_transformer")
    torch.manual_seed(2)
    mae = randomize(vt.VisionTransformer(img_size=224, patch_size=16, num_classes=5, **TINY))
    oracle = vt.VisionTransformer(img_size=224, patch_size=16, class_token=False, global_pool="avg", fc_norm=False,
                                  num_classes=0, **TINY).eval()
    sd = {k: v for k, v in mae.state_dict().items() if k not in ("cls_token",) and not k.startswith("head.")}
    sd["pos_embed"] = sd["pos_embed"][:, 1:]
    oracle.load_state_dict(sd)
    oracle.norm = nn.Identity()
    ours = ViTDet(img_size=224, window_size=0, global_blocks=(), window_pos="none", global_pos="none",
                  **TINY).eval()
    report = load_vitdet_weights(ours, {"model": mae.state_dict()})
    assert report.source == "mae" and not report.missing
    assert {k for k, _ in report.unexpected} == {"cls_token", "norm.weight", "norm.bias", "head.weight", "head.bias"}
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        ref = oracle.forward_features(x).transpose(1, 2).reshape(2, -1, 14, 14)
        assert_parity(ref, ours(x), "MAE layout vs timm ViT")


def test_mae_into_vitdet_reports_missing_relpos():
    vt = require("timm.models.vision_transformer")
    mae = vt.VisionTransformer(img_size=224, patch_size=16, num_classes=0, **TINY)
    ours = ViTDet(img_size=1024, global_blocks=(1,), **TINY)
    report = load_vitdet_weights(ours, {"model": mae.state_dict()})
    assert {k for k, _ in report.missing} == {f"blocks.{i}.attn.rel_pos_{a}" for i in range(3) for a in "hw"}
    # MAE's (1, 197, C) is stored as is, cls row included; only its name changes
    assert dict(report.converted) == {"pos_embed.pos_embed": "renamed from 'pos_embed'"}


def test_wrong_shape_names_key_expected_found(d2_pair):
    ref, _, _, _ = d2_pair
    sd = dict(ref.state_dict())
    sd["blocks.1.mlp.fc1.weight"] = torch.zeros(64, 32)
    ours = ViTDet(img_size=1024, global_blocks=(1,), **TINY)
    with pytest.raises(ValueError, match=r"blocks\.1\.mlp\.fc1\.weight.*\(64, 32\).*\(128, 32\)"):
        convert_detectron2_vit(sd, ours)
    sd = dict(ref.state_dict())
    sd["blocks.0.attn.rel_pos_h"] = torch.zeros(27, 8)
    with pytest.raises(ValueError, match=r"rel_pos_h.*\(27, 8\).*\(27, 16\).*head_dim"):
        convert_detectron2_vit(sd, ours)


def test_abs_grid_mismatch_explains_fix(sam_encoder):
    ours = ViTDet(img_size=1024, global_blocks=(1,), **TINY)  # abs at 14x14 + cls
    with pytest.raises(ValueError, match=r"pos_embed.*64x64 grid.*pretrain_img_size=1024.*pretrain_use_cls_token"):
        convert_sam_image_encoder(sam_encoder.state_dict(), ours)


def test_strict_refuses_unknown_and_missing_trunk(d2_pair):
    ref, _, _, _ = d2_pair
    sd = dict(ref.state_dict())
    sd["blocks.7.attn.qkv.weight"] = torch.zeros(96, 32)
    ours = ViTDet(img_size=1024, global_blocks=(1,), **TINY)
    with pytest.raises(ValueError, match=r"blocks\.7\.attn\.qkv\.weight.*strict=False"):
        load_vitdet_weights(ours, sd)
    report = load_vitdet_weights(ours, sd, strict=False)
    assert report.unknown == ["blocks.7.attn.qkv.weight"]
    del sd["blocks.7.attn.qkv.weight"], sd["blocks.2.norm2.weight"]
    with pytest.raises(ValueError, match=r"blocks\.2\.norm2\.weight"):
        load_vitdet_weights(ours, sd)


def test_bad_containers_and_sources():
    ours = ViTDet(img_size=224, **{**TINY, "depth": 1}, global_blocks=())
    with pytest.raises(ValueError, match="unknown checkpoint format .timm."):
        load_vitdet_weights(ours, {"pos_embed": torch.zeros(1, 197, 32)}, source="timm")
    with pytest.raises(ValueError, match="no tensors"):
        load_vitdet_weights(ours, {"__author__": "x"})
    with pytest.raises(ValueError, match="holds a list, not a dict of tensors"):
        load_vitdet_weights(ours, [1, 2])
    with pytest.raises(ValueError, match="square grid"):
        convert_mae_vit({"pos_embed": torch.zeros(1, 200, 32)}, ours)
