"""Finding the effective position embedding in each project's checkpoint format.

Two kinds of checks: (1) small fake state dicts with the right key names and shapes and a planted periodic
structure, and (2) tiny models built from the real packages (sam2, hiera, timm, segment_anything, detectron2),
saved the way each project ships checkpoints, where the oracle is the embedding the real model adds to its tokens.
"""

import json
import pickle
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from tests.conftest import require
from winpos.diagnostics.extract import effective_embeddings
from winpos.diagnostics.metrics import window_similarity
from winpos.diagnostics.report import analyze, run_posemb_viz

C = 16


def periodic(w, H, W, seed=0, c=C):
    t = torch.randn(c, w, w, generator=torch.Generator().manual_seed(seed))
    return t.tile(1, -(-H // w), -(-W // w))[:, :H, :W].contiguous()


def flat(grid, cls=None):
    """(C, H, W) -> (1, [1+]H*W, C) row-major, optionally with a cls row in front."""
    tokens = grid.flatten(1).T[None]
    return torch.cat([cls.reshape(1, 1, -1), tokens], 1) if cls is not None else tokens


def only(infos):
    assert len(infos) == 1, [i.name for i in infos]
    return infos[0]


def loop_abswin(G, Wn, H, W, antialias):
    Gi = F.interpolate(G[None], size=(H, W), mode="bicubic", align_corners=False, antialias=antialias)[0]
    w = Wn.shape[-1]
    return torch.stack([torch.stack([Gi[:, i, j] + Wn[:, i % w, j % w] for j in range(W)], -1) for i in range(H)], -2)


# ---- fake state dicts per format -------------------------------------------------------------------------------

def test_official_hiera_model_state():
    grid = periodic(8, 56, 56)
    sd = {"pos_embed": flat(grid), "patch_embed.proj.weight": torch.zeros(C, 3, 7, 7), "head.projection.weight": torch.zeros(3, C)}
    info = only(effective_embeddings({"model_state": sd}))
    assert (info.format, info.window, info.stride, info.image_hw, info.antialias) == ("hiera", 8, 4, (224, 224), False)
    torch.testing.assert_close(info.grid, grid, rtol=0, atol=0)
    assert window_similarity(info.grid, 8) == pytest.approx(1.0)
    assert info.abswin_source == "projection"
    torch.testing.assert_close(info.window_embed, grid[:, :8, :8], rtol=0, atol=1e-6)  # mean tile = the tile
    assert info.global_embed.abs().max() < 1e-5
    assert info.grid_hw_for(448) == (112, 112) and info.grid_hw_for(472) == (118, 118)  # stride-4 conv: ceil


def test_hiera_video_spatial_and_timm_plain():
    grid = periodic(8, 56, 56, seed=1)
    sd = {"pos_embed_spatial": flat(grid), "pos_embed_temporal": torch.zeros(1, 8, C)}
    info = only(effective_embeddings({"model_state": sd}))
    assert info.format == "hiera" and info.name == "pos_embed_spatial"
    torch.testing.assert_close(info.grid, grid, rtol=0, atol=0)
    timm_sd = {"pos_embed": flat(grid), "head.fc.weight": torch.zeros(3, C)}
    info = only(effective_embeddings(timm_sd))
    assert info.format == "timm_hiera" and info.antialias


def test_timm_hiera_abswin_builds_at_native_and_other_sizes():
    g = torch.Generator().manual_seed(2)
    G, Wn = torch.randn(1, C, 16, 16, generator=g), torch.randn(1, C, 8, 8, generator=g)
    info = only(effective_embeddings({"pos_embed": G, "pos_embed_win": Wn, "head.fc.weight": torch.zeros(2, C)}))
    assert (info.format, info.window, info.stride, info.image_hw) == ("timm_abswin", 8, 4, (256, 256))
    assert info.abswin_source == "checkpoint" and info.native_from.startswith("assumed: the global grid x 16")
    torch.testing.assert_close(info.grid, loop_abswin(G[0], Wn[0], 64, 64, True), rtol=0, atol=1e-5)
    info = only(effective_embeddings({"pos_embed": G, "pos_embed_win": Wn}, resolution=300))
    assert info.grid.shape == (C, 75, 75)  # ceil(300 / 4): windows do not divide it, tiling still works
    torch.testing.assert_close(info.grid, loop_abswin(G[0], Wn[0], 75, 75, True), rtol=0, atol=1e-5)


def test_sam2_checkpoint_layout_and_super_window():
    g = torch.Generator().manual_seed(3)
    G, Wn = torch.randn(1, C, 7, 7, generator=g), torch.randn(1, C, 8, 8, generator=g)
    model = {"image_encoder.trunk.pos_embed": G, "image_encoder.trunk.pos_embed_window": Wn,
             "image_encoder.neck.convs.0.conv.weight": torch.zeros(4, C, 1, 1),
             "sam_prompt_encoder.pe_layer.positional_encoding_gaussian_matrix": torch.zeros(2, 8)}
    info = only(effective_embeddings({"model": model}, resolution=256))
    assert (info.format, info.window, info.stride, info.image_hw) == ("sam2", 8, 4, (256, 256))
    assert info.name == "image_encoder.trunk.pos_embed"
    torch.testing.assert_close(info.grid, loop_abswin(G[0], Wn[0], 64, 64, False), rtol=0, atol=1e-5)
    info = only(effective_embeddings({"model": model}, window=56))  # SAM2's 224 px super-window
    assert info.window == 56 and info.image_hw == (1024, 1024) and info.grid.shape == (C, 256, 256)


def test_sam_v1_nhwc():
    grid = periodic(14, 64, 64, seed=4)
    sd = {"image_encoder.pos_embed": grid.permute(1, 2, 0)[None], "image_encoder.blocks.0.attn.rel_pos_h": torch.zeros(27, 4),
          "prompt_encoder.pe_layer.positional_encoding_gaussian_matrix": torch.zeros(2, 8)}
    info = only(effective_embeddings(sd))
    assert (info.format, info.window, info.stride, info.image_hw) == ("sam", 14, 16, (1024, 1024))
    torch.testing.assert_close(info.grid, grid, rtol=0, atol=0)
    assert window_similarity(info.grid, 14) == pytest.approx(1.0)


def test_mae_drops_cls_and_tiles_as_abswin():
    grid = torch.randn(C, 14, 14, generator=torch.Generator().manual_seed(5))
    sd = {"cls_token": torch.zeros(1, 1, C), "pos_embed": flat(grid, cls=torch.full((C,), 7.0)),
          "patch_embed.proj.weight": torch.zeros(C, 3, 16, 16)}
    info = only(effective_embeddings({"model": sd}))
    assert (info.format, info.window, info.stride, info.image_hw) == ("mae", 14, 16, (224, 224))
    torch.testing.assert_close(info.grid, grid, rtol=0, atol=0)  # the cls row (all 7) is gone
    assert "cls row dropped" in info.notes[0]
    tiled = info.abswin_at((64, 64))  # abs-win from a window-sized grid: window part = that grid, global part = 0
    assert window_similarity(tiled, 14) == pytest.approx(1.0)
    torch.testing.assert_close(tiled[:, 14:28, 28:42], grid, rtol=0, atol=1e-6)


def test_vitdet_pkl_from_disk(tmp_path):
    grid = torch.randn(C, 14, 14, generator=torch.Generator().manual_seed(6))
    model = {"backbone.net.pos_embed": flat(grid, cls=torch.zeros(C)).numpy(),
             "backbone.net.blocks.0.attn.rel_pos_h": np.zeros((27, 4), np.float32)}
    path = tmp_path / "model_final_abc.pkl"
    with open(path, "wb") as f:
        pickle.dump({"model": model, "__author__": "Detectron2 ViTDet Model Zoo"}, f)
    info = only(effective_embeddings(path))
    assert (info.format, info.window, info.stride, info.source) == ("detectron2", 14, 16, str(path))
    torch.testing.assert_close(info.grid, grid, rtol=0, atol=0)


def test_winpos_hook_layout():
    g = torch.Generator().manual_seed(7)
    sd = {"backbone.net.pos_embed.global_embed": torch.randn(1, C, 14, 14, generator=g),
          "backbone.net.pos_embed.window_embed": torch.randn(1, C, 14, 14, generator=g),
          "backbone.net.patch_embed.proj.weight": torch.zeros(C, 3, 16, 16)}
    info = only(effective_embeddings(sd, resolution=1024))
    assert (info.format, info.window, info.stride, info.grid.shape) == ("winpos", 14, 16, (C, 64, 64))
    assert window_similarity(info.grid, 14, centred=True) > 0.3


def test_overrides_and_errors():
    grid = periodic(8, 56, 56)
    sd = {"pos_embed": flat(grid)}
    assert only(effective_embeddings(sd, window=16)).window == 16
    assert only(effective_embeddings(sd, format="timm_hiera")).antialias
    with pytest.raises(ValueError, match=r"fixed 56x56 grid.*analyze\(target_sizes"):
        effective_embeddings(sd, resolution=448)
    with pytest.raises(ValueError, match="unknown checkpoint format 'vit'"):
        effective_embeddings(sd, format="vit")
    with pytest.raises(ValueError, match=r"no absolute position embedding of format 'sam2'"):
        effective_embeddings(sd, format="sam2")
    no_pos = {"blocks.0.attn.rel_pos_h": torch.zeros(27, 4), "blocks.0.attn.qkv.weight": torch.zeros(3, 1)}
    with pytest.raises(ValueError, match=r"no absolute position embedding.*rel_pos_h.*relative/rotary"):
        effective_embeddings({"model": no_pos})
    with pytest.raises(ValueError, match=r"pos_embed \(1, 16, 7, 7\)"):  # an NCHW global part without its window
        effective_embeddings({"pos_embed": torch.zeros(1, C, 7, 7)})
    odd = {"pos_embed": torch.zeros(1, 48, C)}  # neither a square grid nor one plus a cls row
    with pytest.raises(ValueError, match=r"position-like keys: \['pos_embed \(1, 48, 16\)'\]"):
        effective_embeddings(odd)
    with pytest.raises(ValueError, match="not a square grid"):
        effective_embeddings(odd, format="hiera")


# ---- real packages -------------------------------------------------------------------------------------------------

def _randomize(*params):
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in params:
            p.copy_(torch.randn(p.shape, generator=g))


def test_real_sam2_trunk(tmp_path):
    Hiera = require("sam2.modeling.backbones.hieradet").Hiera
    trunk = Hiera(embed_dim=C, num_heads=1, stages=(1, 1, 1, 1), global_att_blocks=(2,),
                  window_pos_embed_bkg_spatial_size=(7, 7))
    _randomize(trunk.pos_embed, trunk.pos_embed_window)
    path = tmp_path / "sam2.1_hiera_tiny_fake.pt"
    torch.save({"model": {"image_encoder.trunk." + k: v for k, v in trunk.state_dict().items()}}, path)
    info = only(effective_embeddings(path, resolution=512))
    assert (info.format, info.window, info.stride) == ("sam2", 8, 4)
    with torch.no_grad():
        oracle = trunk._get_pos_embed((128, 128))[0].permute(2, 0, 1)  # what SAM2 adds at 512 px (NHWC)
    torch.testing.assert_close(info.grid, oracle, rtol=0, atol=1e-6)


def test_real_timm_hiera_abswin_and_hieradet(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hiera_mod = require("timm.models.hiera")
        det_mod = require("timm.models.hieradet_sam2")
    m = hiera_mod.Hiera(img_size=(256, 256), embed_dim=C, num_heads=1, stages=(1, 1, 1, 1), abs_win_pos_embed=True,
                        global_pos_size=(16, 16))
    save_file({k: v.contiguous() for k, v in m.state_dict().items()}, str(tmp_path / "model.safetensors"))
    info = only(effective_embeddings(tmp_path / "model.safetensors"))
    assert info.format == "timm_abswin" and info.image_hw == (256, 256)
    with torch.no_grad():
        oracle = m._pos_embed(torch.zeros(1, 64 * 64, C))[0].T.reshape(C, 64, 64)
    torch.testing.assert_close(info.grid, oracle, rtol=0, atol=1e-6)

    d = det_mod.HieraDet(embed_dim=C, num_heads=1, stages=(1, 1, 1, 1), global_att_blocks=(2,))
    _randomize(d.pos_embed, d.pos_embed_window)
    info = only(effective_embeddings({k: v for k, v in d.state_dict().items()}, resolution=256))
    assert info.format == "sam2" and not info.antialias
    with torch.no_grad():
        oracle = d._pos_embed(torch.zeros(1, 64, 64, C))[0].permute(2, 0, 1)
    torch.testing.assert_close(info.grid, oracle, rtol=0, atol=1e-6)


def test_real_official_hiera(tmp_path):
    hiera = require("hiera")
    m = hiera.Hiera(input_size=(224, 224), embed_dim=C, num_heads=1, stages=(1, 1, 1, 1))
    _randomize(m.pos_embed)
    torch.save({"model_state": m.state_dict()}, tmp_path / "hiera_tiny_224.pth")
    info = only(effective_embeddings(tmp_path / "hiera_tiny_224.pth"))
    assert (info.format, info.image_hw) == ("hiera", (224, 224))
    # the oracle's token order: the patch embed flattens its 56x56 output row-major, then adds get_pos_embed()
    with torch.no_grad():
        x = torch.randn(1, 3, 224, 224)
        feat, tokens = m.patch_embed.proj(x), m.patch_embed(x)
    torch.testing.assert_close(tokens, feat.flatten(2).transpose(1, 2), rtol=0, atol=0)
    torch.testing.assert_close(info.grid, m.get_pos_embed()[0].detach().T.reshape(C, 56, 56), rtol=0, atol=0)


def test_real_segment_anything_and_detectron2(tmp_path):
    sam_enc = require("segment_anything.modeling").ImageEncoderViT
    enc = sam_enc(img_size=448, patch_size=16, embed_dim=C, depth=1, num_heads=1, window_size=14, out_chans=8)
    _randomize(enc.pos_embed)
    torch.save({"image_encoder." + k: v for k, v in enc.state_dict().items()}, tmp_path / "sam_vit_tiny.pth")
    info = only(effective_embeddings(tmp_path / "sam_vit_tiny.pth"))
    assert (info.format, info.image_hw, info.window) == ("sam", (448, 448), 14)
    torch.testing.assert_close(info.grid, enc.pos_embed[0].detach().permute(2, 0, 1), rtol=0, atol=0)

    vit_mod = require("detectron2.modeling.backbone.vit")
    get_abs_pos = require("detectron2.modeling.backbone.utils").get_abs_pos
    vit = vit_mod.ViT(img_size=256, patch_size=16, embed_dim=C, depth=1, num_heads=1, window_size=14)
    _randomize(vit.pos_embed)
    zoo = {"model": {"backbone.net." + k: v.numpy() for k, v in vit.state_dict().items()}, "__author__": "fake zoo"}
    with open(tmp_path / "model_final.pkl", "wb") as f:
        pickle.dump(zoo, f)
    info = only(effective_embeddings(tmp_path / "model_final.pkl"))
    assert (info.format, info.image_hw) == ("detectron2", (224, 224))
    res = analyze(info, target_sizes=[1024])
    with torch.no_grad():
        as_used = get_abs_pos(vit.pos_embed, True, (64, 64))[0].permute(2, 0, 1)  # what ViTDet adds at 1024
    naive_ws = window_similarity(as_used, 14, centred=True)
    assert res["targets"][0]["naive"]["ws_centred"] == pytest.approx(naive_ws, abs=1e-6)
    assert res["targets"][0]["abswin"]["ws_centred"] == pytest.approx(1.0, abs=1e-6)


def test_real_timm_vit_as_mae():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vt = require("timm.models.vision_transformer")
    m = vt.VisionTransformer(img_size=224, patch_size=16, embed_dim=C, depth=1, num_heads=1, num_classes=0)
    _randomize(m.pos_embed)
    info = only(effective_embeddings({"model": m.state_dict()}))
    assert (info.format, info.stride, info.image_hw) == ("mae", 16, (224, 224))
    torch.testing.assert_close(info.grid, m.pos_embed[0, 1:].detach().T.reshape(C, 14, 14), rtol=0, atol=0)


# ---- report and end-to-end driver -------------------------------------------------------------------------------

def test_analyze_numbers_and_verdicts():
    grid = periodic(8, 56, 56, c=64)
    info = only(effective_embeddings({"model_state": {"pos_embed": flat(grid)}}))
    res = analyze(info, target_sizes=[448, 224])
    json.dumps(res)
    assert res["native"]["ws"] == pytest.approx(1.0) and res["native"]["period_peak"] == 8
    t448, t224 = res["targets"]
    assert t448["grid_hw"] == [112, 112] and t448["naive"]["period_peak"] == 16
    assert t448["naive"]["ws_centred"] < 0.4 and t448["abswin"]["ws_centred"] == pytest.approx(1.0, abs=1e-6)
    assert "no longer see the same embedding" in t448["verdict"] and "winpos-convert" in t448["verdict"]
    assert "kept:" in t224["verdict"] and "80% threshold" in t224["verdict"]


def test_run_posemb_viz_end_to_end(tmp_path):
    grid = periodic(14, 14, 14, c=8)
    torch.save({"model": {"pos_embed": flat(grid, cls=torch.zeros(8)), "cls_token": torch.zeros(1, 1, 8)}},
               tmp_path / "mae_fake.pth")
    out = tmp_path / "viz"
    report = run_posemb_viz([tmp_path / "mae_fake.pth"], out, sizes=[448], progress=False)
    emb = report["checkpoints"][0]["embeddings"][0]
    assert emb["format"] == "mae" and emb["native"]["error"] is not None  # a single 14x14 window at 224 px
    assert emb["targets"][0]["abswin"]["ws"] == pytest.approx(1.0, abs=1e-6)
    assert json.loads((out / "report.json").read_text()) == json.loads(json.dumps(report))
    assert [p.split("_")[-1] for p in emb["plots"]] == ["embedding.png", "scan.png", "similarity.png"]
    for p in emb["plots"]:
        assert (out / p.split("/")[-1]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(ValueError, match="cannot be written"):
        run_posemb_viz([tmp_path / "mae_fake.pth"], blocker / "sub", sizes=[448], progress=False)


def test_period_scan_figure_png_and_pdf(tmp_path):
    from winpos.diagnostics.plots import plot_period_scan

    E = periodic(8, 32, 32, c=4)
    files = plot_period_scan([("native", E)], 8, 4, tmp_path / "scan.png", pdf=True)
    assert [f.suffix for f in files] == [".png", ".pdf"]
    assert files[0].read_bytes()[:4] == b"\x89PNG" and files[1].read_bytes()[:5] == b"%PDF-"
    with pytest.raises(ValueError, match="cannot write figure"):
        (tmp_path / "blocker").write_text("")
        plot_period_scan([("native", E)], 8, 4, tmp_path / "blocker" / "scan.png")
