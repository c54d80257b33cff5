"""``load_external``: one entry point for every family, file or state dict, with format checks."""
import pytest
import torch

from tests.conftest import require
from winpos.backbones import create
from winpos.checkpoints import load_external


def _sam2_file(tmp_path):
    hieradet = require("sam2.modeling.backbones.hieradet")
    trunk = hieradet.Hiera(embed_dim=32, num_heads=1, stages=(1, 1, 2, 1), global_att_blocks=(3,),
                           window_pos_embed_bkg_spatial_size=(7, 7), window_spec=(8, 4, 14, 7))
    with torch.no_grad():
        for p in trunk.parameters():
            p.normal_(std=0.02)
    path = tmp_path / "sam2.pt"
    torch.save({"model": {"image_encoder.trunk." + k: v for k, v in trunk.state_dict().items()}}, path)
    return trunk, path


def test_sam2_file_into_hieradet_preset_matches_sam2(tmp_path):
    trunk, path = _sam2_file(tmp_path)
    model = create("hieradet_toy", window_spec=(8, 4, 14, 7)).eval()
    sd, report = load_external(path, model, strict=True)
    model.load_state_dict(sd, strict=False)
    assert not report.missing and report.source == "sam2"
    x = torch.randn(1, 3, 256, 256)
    with torch.no_grad():
        torch.testing.assert_close(model(x)[-1], trunk.eval()(x)[-1], rtol=1e-5, atol=1e-5)


def test_detectron2_vit_into_vitdet_by_preset_name():
    vit = require("detectron2.modeling.backbone.vit")
    src = vit.ViT(img_size=224, patch_size=16, embed_dim=96, depth=4, num_heads=3, window_size=14,
                  window_block_indexes=[0, 2], use_rel_pos=True, out_feature="last_feat")
    sd, report = load_external({"model": {"backbone.net." + k: v for k, v in src.state_dict().items()}},
                               "vitdet_toy", img_size=224)
    assert report.source == "detectron2" and len(report.matched) + len(report.converted) > 10


def test_wrong_family_and_unknown_format_are_explained(tmp_path):
    _, path = _sam2_file(tmp_path)
    with pytest.raises(ValueError, match="cannot load into ViTDet"):
        load_external(path, "vitdet_toy", format="sam2")
    with pytest.raises(ValueError, match="unknown checkpoint format"):
        load_external(path, "hieradet_toy", format="onnx")
    with pytest.raises(ValueError, match="list_presets|vitdet_b"):
        load_external(path, "hieradet_zz")
