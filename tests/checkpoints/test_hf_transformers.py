"""Checkpoints in Hugging Face ``transformers`` names: parity with ``transformers``' own models on the same weights.

Each family's ``transformers`` model is built small from its config (random weights, every one non-trivial), its
``state_dict()`` is what ``save_pretrained`` writes to ``model.safetensors``, and winpos reads it with
``format="auto"``. The oracle is ``transformers``' forward of the trunk as ViTDet / HieraDet keeps it: the last
block's tokens (before the neck or final norm, which the detector replaces) for the ViTs, the four stage outputs for
Hiera and SAM2. Where ViTDet drops the prefix tokens (ViT's cls token, DINOv3's cls and register tokens), the oracle
runs ``transformers``' own blocks on the patch tokens alone. Tolerance: max abs error <= 1e-4 x the output's scale,
fp32. The report must name the file's own keys, and the families' legacy names (files written by transformers 4)
read the same as the current ones.
"""
import re

import pytest
import torch

from tests.conftest import require
from tests.helpers import randomize
from winpos.backbones import create
from winpos.backbones.hieradet import HieraDet
from winpos.backbones.vitdet import ViTDet
from winpos.checkpoints import load_external
from winpos.checkpoints.formats import Format, detect
from winpos.checkpoints.hf import hf_family, to_native
from winpos.checkpoints.io import load_checkpoint_object
from winpos.errors import WinposError

TOL = 1e-4


def _T():
    return require("transformers")


def _random(model):
    torch.manual_seed(0)
    return randomize(model).eval()


def _load(sd, ours, fmt):
    assert detect(sd) == Format(fmt)
    converted, report = load_external(sd, ours)
    result = ours.load_state_dict(converted, strict=False)
    assert not result.unexpected_keys, result
    assert report.source == f"{fmt} (Hugging Face transformers names)", report.source
    assert not report.unknown, report.unknown
    # every key the report names is a key of the file (plus a fused q / k / v named by its three parts)
    assert report.converted
    for _, how in report.converted:
        for src in re.findall(r"renamed from '([^']+)'", how):
            assert all(part in sd for part in src.split(" + ")), src
    for key, _ in report.unexpected:
        assert key in sd, key
    return ours.eval(), report, result.missing_keys


def _check(ours_out, ref, label):
    assert ours_out.shape == ref.shape, (ours_out.shape, ref.shape)
    err = (ours_out - ref).abs().max().item()
    scale = ref.abs().max().item()
    print(f"PARITY {label}: max abs err {err:.2e} (scale {scale:.2f})")
    assert err <= TOL * max(scale, 1.0), err


def _x(hw, seed=3):
    return torch.randn(1, 3, *hw, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------------------------- SAM
def _hf_sam():
    T = _T()
    cfg = T.SamVisionConfig(hidden_size=32, num_hidden_layers=3, num_attention_heads=2, image_size=128, patch_size=16,
                            window_size=4, global_attn_indexes=[2], output_channels=16, mlp_dim=128)
    return _random(T.SamVisionModel(cfg))


def test_sam_vision_model_equals_transformers():
    hf = _hf_sam()
    sd = hf.state_dict()
    sd["prompt_encoder.shared_embedding.positional_embedding"] = torch.zeros(2, 8)  # a SamModel's other parts
    ours, report, missing = _load(sd, ViTDet(img_size=128, embed_dim=32, depth=3, num_heads=2, window_size=4,
                                             global_blocks=(2,), pretrain_img_size=128, pretrain_use_cls_token=False),
                                  "sam")
    assert not missing and not report.missing
    assert dict(report.converted)["blocks.0.mlp.fc1.weight"] == \
        "renamed from 'vision_encoder.layers.0.mlp.lin1.weight'"
    ignored = {k for k, _ in report.unexpected}
    assert "prompt_encoder.shared_embedding.positional_embedding" in ignored
    assert {k for k in ignored if k.startswith("vision_encoder.neck.")} == {k for k in sd if ".neck." in k}
    x = _x((128, 128))
    with torch.no_grad():
        ref = hf(x, output_hidden_states=True).hidden_states[-1].permute(0, 3, 1, 2)  # last block, before the neck
        _check(ours(x), ref, "SAM 128 px")


# ----------------------------------------------------------------------------------------------------------- ViTDet
def _hf_vitdet(legacy_prefix=""):
    T = _T()
    cfg = T.VitDetConfig(hidden_size=32, num_hidden_layers=3, num_attention_heads=2, image_size=128,
                         pretrain_image_size=64, patch_size=16, window_size=4, window_block_indices=[0, 1],
                         use_relative_position_embeddings=True, use_absolute_position_embeddings=True)
    return _random(T.VitDetModel(cfg))


@pytest.mark.parametrize("hw", [(128, 128), (64, 128)])
def test_vitdet_equals_transformers(hw):
    hf = _hf_vitdet()
    ours, report, missing = _load(hf.state_dict(), ViTDet(img_size=128, embed_dim=32, depth=3, num_heads=2,
                                                          window_size=4, global_blocks=(2,), pretrain_img_size=64),
                                  "detectron2")
    assert not missing and not report.missing and not report.unexpected
    assert dict(report.converted)["pos_embed.pos_embed"] == "renamed from 'embeddings.position_embeddings'"
    x = _x(hw)
    with torch.no_grad():
        _check(ours(x), hf(x).last_hidden_state, f"ViTDet {hw}")


# ----------------------------------------------------------------------------------------------------------- DINOv3
def _hf_dinov3(gated):
    T = _T()
    cfg = T.DINOv3ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                            image_size=64, patch_size=16, num_register_tokens=4, use_gated_mlp=gated,
                            layerscale_value=0.5, hidden_act="silu" if gated else "gelu")  # S+ / H+: SwiGLU
    return _random(T.DINOv3ViTModel(cfg))


def _dinov3_trunk(hf, x):
    """transformers' DINOv3 on the patch tokens alone (its RoPE skips the prefix tokens; here there are none)."""
    tokens = hf.embeddings.patch_embeddings(x).flatten(2).transpose(1, 2)
    h = hf.model(tokens, position_embeddings=hf.rope_embeddings(x)).last_hidden_state
    n = x.shape[-2] // 16, x.shape[-1] // 16
    return h.transpose(1, 2).reshape(1, -1, *n)


@pytest.mark.parametrize("gated", [False, True], ids=["mlp", "swiglu"])
def test_dinov3_equals_transformers(gated):
    hf = _hf_dinov3(gated)
    sd = hf.state_dict()
    sd["rope_embeddings.inv_freq"] = hf.rope_embeddings.inv_freq  # a buffer some saves keep: computed, not loaded
    block = {"k_bias": False, "mlp": "swiglu"} if gated else {"k_bias": False}
    ours, report, missing = _load(sd, create("vitdet_dinov3_s", window_size=0, img_size=64, pretrain_img_size=64,
                                             embed_dim=64, depth=2, num_heads=2, global_blocks=(), qkv_bias=True,
                                             mlp_ratio=2.0, block=block), "dinov3")
    assert [k for k, _ in report.lost] == ["embeddings.register_tokens"]  # ViTDet keeps no register tokens
    assert not missing
    x = _x((64, 64))
    with torch.no_grad():
        _check(ours(x), _dinov3_trunk(hf, x), f"DINOv3 {'SwiGLU' if gated else 'MLP'} 64 px")


def test_dinov3_files_of_transformers_4_read_the_same():
    """The Hub's DINOv3 files name the blocks ``layer.N`` (transformers 5 loads them as ``model.layer.N``)."""
    sd = _hf_dinov3(False).state_dict()
    legacy = {k.replace("model.layer.", "layer."): v for k, v in sd.items()}
    a, b = to_native(sd).state_dict, to_native(legacy).state_dict
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------------------------------------------- ViT / MAE
def _hf_vit():
    T = _T()
    cfg = T.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                      image_size=64, patch_size=16)
    return _random(T.ViTModel(cfg))


def _vit_trunk(hf, x):
    """transformers' ViT on the patch tokens alone (plus their rows of the position embedding)."""
    tokens = hf.embeddings.patch_embeddings(x) + hf.embeddings.position_embeddings[:, 1:]
    for layer in hf.layers if hasattr(hf, "layers") else hf.encoder.layer:
        tokens = layer(tokens)
        tokens = tokens[0] if isinstance(tokens, tuple) else tokens
    return tokens.transpose(1, 2).reshape(1, -1, x.shape[-2] // 16, x.shape[-1] // 16)


def _legacy_vit(sd: dict) -> dict:
    """The names transformers 4 wrote (``encoder.layer.N.attention.attention.query``, ...): the Hub's ViT files."""
    out = {}
    for k, v in sd.items():
        k = re.sub(r"^layers\.(\d+)\.", r"encoder.layer.\1.", k)
        k = k.replace("attention.q_proj", "attention.attention.query").replace("attention.k_proj",
                                                                                "attention.attention.key")
        k = k.replace("attention.v_proj", "attention.attention.value").replace("attention.o_proj",
                                                                                "attention.output.dense")
        k = k.replace("mlp.fc1", "intermediate.dense").replace("mlp.fc2", "output.dense")
        out[k] = v
    return out


@pytest.mark.parametrize("names", ["transformers5", "transformers4"])
def test_vit_equals_transformers(names):
    hf = _hf_vit()
    sd = hf.state_dict() if names == "transformers5" else _legacy_vit(hf.state_dict())
    ours, report, missing = _load(sd, ViTDet(img_size=64, embed_dim=32, depth=2, num_heads=2, window_size=0,
                                             global_blocks=(0, 1), pretrain_img_size=64, global_pos="none",
                                             norm_eps=1e-12), "mae")
    assert not missing
    fused = dict(report.converted)["blocks.0.attn.qkv.weight"]
    assert fused.count(" + ") == 2 and ("q_proj" in fused or "query" in fused)
    assert {k for k, _ in report.unexpected} == {k for k in sd if k.startswith(("embeddings.cls_token", "layernorm.",
                                                                                "pooler."))}
    x = _x((64, 64))
    with torch.no_grad():
        _check(ours(x), _vit_trunk(hf, x), f"ViT ({names} names) 64 px")


def test_vit_mae_pretraining_file_reads_its_encoder():
    T = _T()
    cfg = T.ViTMAEConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                         image_size=64, patch_size=16, decoder_hidden_size=16, decoder_num_hidden_layers=1,
                         decoder_num_attention_heads=1, decoder_intermediate_size=32)
    sd = _random(T.ViTMAEForPreTraining(cfg)).state_dict()
    ours = ViTDet(img_size=64, embed_dim=32, depth=2, num_heads=2, window_size=0, global_blocks=(0, 1),
                  pretrain_img_size=64, global_pos="none")
    _, report, missing = _load(sd, ours, "mae")
    assert not missing
    assert {k for k, _ in report.unexpected} == {k for k in sd if k.startswith(("decoder.", "vit.embeddings.cls_token",
                                                                                "vit.layernorm."))}
    native = to_native(sd).state_dict
    torch.testing.assert_close(native["blocks.1.attn.qkv.bias"],
                               torch.cat([sd[f"vit.layers.1.attention.{p}_proj.bias"] for p in "qkv"]), rtol=0, atol=0)


# ------------------------------------------------------------------------------------------------------------ SAM3
def _hf_sam3():
    T = _T()
    # SAM3's own settings (24-token windows, the 336 px pretraining grid, LayerNorm eps 1e-5) at a narrow width
    cfg = T.Sam3ViTConfig(hidden_size=128, num_hidden_layers=4, num_attention_heads=2, intermediate_size=592,
                          image_size=560, patch_size=14, pretrain_image_size=336, window_size=24,
                          global_attn_indexes=[1, 3], layer_norm_eps=1e-5)
    return _random(T.Sam3ViTModel(cfg))


def test_sam3_vit_equals_transformers():
    hf = _hf_sam3()
    sd = {f"vision_encoder.backbone.{k}": v for k, v in hf.state_dict().items()}
    sd["detr_decoder.query_embed.weight"] = torch.zeros(4, 8)
    ours, report, missing = _load(sd, create("vitdet_sam3_toy", img_size=560), "sam3")
    assert not report.lost and all(k.startswith("pos_embed.global_embed") for k in missing)  # tiled: zero global
    assert "detr_decoder.query_embed.weight" in {k for k, _ in report.unexpected}
    x = _x((560, 560))  # 40 x 40 tokens: windows padded to 48, as SAM3 pads
    with torch.no_grad():
        ref = hf(x).last_hidden_state.transpose(1, 2).reshape(1, -1, 40, 40)
        _check(ours(x), ref, "SAM3 ViT 560 px")


# ----------------------------------------------------------------------------------------------------------- Hiera
def _hf_hiera():
    T = _T()
    cfg = T.HieraConfig(embed_dim=16, depths=[1, 1, 2, 1], num_heads=[1, 2, 4, 8], image_size=[224, 224])
    return _random(T.HieraModel(cfg))


def test_hiera_equals_transformers():
    hf = _hf_hiera()
    ours, report, missing = _load(hf.state_dict(), HieraDet(img_size=224, pos_embed="abs", embed_dim=16, num_heads=1,
                                                           stages=(1, 1, 2, 1), window_spec=(8, 4, 0, 0),
                                                           global_blocks=()), "hiera")
    assert not missing and not report.missing
    assert dict(report.converted)["blocks.3.attn.qkv.weight"] == \
        "renamed from 'encoder.stages.2.layers.1.attn.qkv.weight'"  # blocks numbered over the stages
    x = _x((224, 224))
    with torch.no_grad():
        refs = hf(x, output_hidden_states=True).reshaped_hidden_states[1:]
        outs = ours(x)
    for i, (o, r) in enumerate(zip(outs, refs)):
        _check(o, r.permute(0, 3, 1, 2), f"Hiera stage {i + 1}")


# ------------------------------------------------------------------------------------------------------------ SAM2
def _hf_sam2_trunk():
    T = _T()
    cfg = T.Sam2HieraDetConfig(hidden_size=16, num_attention_heads=1, blocks_per_stage=[1, 1, 2, 1],
                               embed_dim_per_stage=[16, 32, 64, 128], num_attention_heads_per_stage=[1, 2, 4, 8],
                               window_size_per_stage=[8, 4, 14, 7], global_attention_blocks=[3],
                               window_positional_embedding_background_size=[7, 7], image_size=[256, 256])
    return _random(T.Sam2HieraDetModel(cfg))


def test_sam2_equals_transformers():
    hf = _hf_sam2_trunk()
    sd = {f"vision_encoder.backbone.{k}": v for k, v in hf.state_dict().items()}
    sd["vision_encoder.neck.convs.0.weight"] = torch.zeros(4, 4, 1, 1)
    ours, report, missing = _load(sd, HieraDet(img_size=256, pos_embed="abswin", pos_global_size=7, embed_dim=16,
                                               num_heads=1, stages=(1, 1, 2, 1), global_blocks=(3,)), "sam2")
    assert not missing and not report.missing
    assert dict(report.converted)["pos_embed.window_embed"] == \
        "renamed from 'vision_encoder.backbone.pos_embed_window'"
    x = _x((256, 256))
    with torch.no_grad():
        refs = hf(x, output_hidden_states=True).intermediate_hidden_states
        outs = ours(x)
    for i, (o, r) in enumerate(zip(outs, refs)):
        _check(o, r.permute(0, 3, 1, 2), f"SAM2 stage {i + 1}")


# ----------------------------------------------------------------------------------------------------- refusals
def test_an_incomplete_fused_projection_is_refused():
    sd = _hf_vit().state_dict()
    del sd["layers.1.attention.v_proj.weight"]
    with pytest.raises(WinposError, match="block 1 .* not all three of query / key / value"):
        to_native(sd)


def test_a_nonzero_dinov3_key_bias_is_refused():
    T = _T()
    cfg = T.DINOv3ViTConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=128,
                            image_size=32, patch_size=16, num_register_tokens=1, key_bias=True)
    sd = _random(T.DINOv3ViTModel(cfg)).state_dict()
    with pytest.raises(WinposError, match="non-zero key bias"):
        to_native(sd)
    sd = {k: (torch.zeros_like(v) if k.endswith("k_proj.bias") else v) for k, v in sd.items()}
    assert hf_family(sd) == "dinov3" and "blocks.0.attn.k_bias" in to_native(sd).state_dict


def test_native_layouts_are_not_taken_for_transformers():
    sd = {"image_encoder.patch_embed.proj.weight": torch.zeros(8, 3, 16, 16),
          "image_encoder.blocks.0.attn.qkv.weight": torch.zeros(24, 8), "image_encoder.pos_embed": torch.zeros(1, 4, 4, 8)}
    assert hf_family(sd) is None and detect(sd) == Format.SAM


# ------------------------------------------------------------------------------ files: save_pretrained's output
def test_save_pretrained_file_through_winpos_convert(tmp_path):
    """What a user downloads (``model.safetensors`` + ``config.json``) through the command: converted into the
    ``vitdet_toy`` preset it fits, then loaded by name, equal to transformers' forward."""
    from safetensors.torch import load_file

    from tests.bad_inputs_helpers import tool

    T = _T()
    cfg = T.VitDetConfig(hidden_size=96, num_hidden_layers=4, num_attention_heads=3, image_size=224,
                         pretrain_image_size=224, patch_size=16, window_size=14, window_block_indices=[0, 2],
                         use_relative_position_embeddings=True)
    hf = _random(T.VitDetModel(cfg))
    hf.save_pretrained(tmp_path / "hub")
    out = tmp_path / "vitdet_toy.safetensors"
    res = tool("convert_checkpoint.py", "--input", tmp_path / "hub" / "model.safetensors", "--output", out, "--to",
               "vitdet_toy", "--img-size", "224")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "detectron2 (Hugging Face transformers names)" in res.stdout
    ours = create("vitdet_toy", img_size=224).eval()
    result = ours.load_state_dict(load_file(str(out)), strict=False)
    assert not result.missing_keys and not result.unexpected_keys
    x = _x((224, 224))
    with torch.no_grad():
        _check(ours(x), hf(x).last_hidden_state, "ViTDet toy via winpos-convert")


def test_the_diagnostics_read_a_transformers_file(tmp_path):
    """``winpos-posemb plot`` on a transformers SAM file: the NHWC embedding found under its transformers name."""
    from safetensors.torch import save_file

    from winpos.diagnostics.report import run_posemb_viz

    hf = _hf_sam()
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in hf.state_dict().items()}, str(path))
    report = run_posemb_viz([path], tmp_path / "viz", sizes=[256], window=4, progress=False)
    emb = report["checkpoints"][0]["embeddings"][0]
    assert emb["format"] == "sam" and emb["name"] == "vision_encoder.pos_embed"
    assert emb["native_from"] == "the stored 8x8 grid x patch size 16 px"
    assert "256x256 px (16x16 tokens, 4x4-token windows)" in emb["targets"][0]["verdict"]


def test_the_doctor_reads_relpos_tables_under_transformers_names():
    """``winpos-posemb doctor --checkpoint``: the relpos table lengths come from the file (its transformers names),
    not from the model the doctor built; a shortened global table reads as stretched further."""
    from winpos.diagnostics.doctor import diagnose_backbone

    sd = _hf_sam().state_dict()
    sd = {k: (v[:9] if "layers.2.attn.rel_pos" in k else v) for k, v in sd.items()}
    net = ViTDet(img_size=128, embed_dim=32, depth=3, num_heads=2, window_size=4, global_blocks=(2,),
                 pretrain_img_size=128, pretrain_use_cls_token=False)
    text = diagnose_backbone(net, 256, checkpoint=sd).text()
    assert "tables STRETCHED 9 -> 31" in text and "tables 7 long used as stored" in text, text
    assert "tables STRETCHED 15 -> 31" in diagnose_backbone(net, 256).text()


@pytest.mark.parametrize("shard", [None, "60KB"], ids=["one_file", "sharded"])
def test_a_model_folder_is_read_whole(tmp_path, shard):
    """``save_pretrained``'s folder (or a Hub snapshot) as the input: its ``model.safetensors``, or every shard its
    index lists, give the same state dict as the model's."""
    hf = _hf_vitdet()
    hf.save_pretrained(tmp_path / "hub", **({"max_shard_size": shard} if shard else {}))
    files = sorted(p.name for p in (tmp_path / "hub").iterdir())
    assert ("model.safetensors.index.json" in files) == bool(shard), files
    ours, report, missing = _load(load_checkpoint_object(tmp_path / "hub"), ViTDet(
        img_size=128, embed_dim=32, depth=3, num_heads=2, window_size=4, global_blocks=(2,), pretrain_img_size=64),
        "detectron2")
    x = _x((128, 128))
    with torch.no_grad():
        _check(ours(x), hf(x).last_hidden_state, f"ViTDet from a folder ({shard or 'one file'})")


def test_a_sharded_folder_missing_a_shard_is_refused(tmp_path):
    _hf_vitdet().save_pretrained(tmp_path / "hub", max_shard_size="60KB")
    shards = sorted((tmp_path / "hub").glob("model-*.safetensors"))
    assert len(shards) >= 2
    shards[-1].unlink()
    with pytest.raises(FileNotFoundError, match="are not in the folder .* download is incomplete"):
        load_checkpoint_object(tmp_path / "hub")


def test_winpos_convert_builds_the_target_with_the_checkpoints_pretraining_grid(tmp_path):
    """SAM's embedding is a grid without a cls row at its own size (here 16 x 16, not the preset's 14 x 14 with a cls
    row). ``winpos-convert`` builds the target with that grid (said in the report, the metadata and the printed
    line) and the result equals transformers' forward; the library call without ``fit_pretrain_grid`` and a ``--set``
    that contradicts the file are refused, naming the two arguments that fit."""
    import json

    from safetensors import safe_open
    from safetensors.torch import load_file

    from tests.bad_inputs_helpers import assert_one_line_error, tool

    T = _T()
    cfg = T.SamVisionConfig(hidden_size=96, num_hidden_layers=4, num_attention_heads=3, image_size=256, patch_size=16,
                            window_size=14, global_attn_indexes=[1, 3], output_channels=16, mlp_dim=384)
    hf = _random(T.SamVisionModel(cfg))
    hf.save_pretrained(tmp_path / "hub")
    out = tmp_path / "sam_toy.safetensors"
    base = ("convert_checkpoint.py", "--input", tmp_path / "hub", "--output", out, "--to", "vitdet_toy", "--img-size",
            "256")
    res = tool(*base)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "target built with pretrain_img_size=256, pretrain_use_cls_token=False (from the checkpoint)" in res.stdout
    assert "create('vitdet_toy', recipe='original', img_size=256, pretrain_img_size=256, " \
           "pretrain_use_cls_token=False)" in res.stdout  # the line that builds the model
    with safe_open(str(out), "pt") as f:
        kwargs = json.loads(f.metadata()["winpos_kwargs"])
    assert kwargs == {"img_size": 256, "pretrain_img_size": 256, "pretrain_use_cls_token": False}
    ours = create("vitdet_toy", **kwargs).eval()
    result = ours.load_state_dict(load_file(str(out)), strict=False)
    assert not result.missing_keys and not result.unexpected_keys
    x = _x((256, 256))  # 16 x 16 tokens: windows of 14 padded, as SAM pads
    with torch.no_grad():
        ref = hf(x, output_hidden_states=True).hidden_states[-1].permute(0, 3, 1, 2)
        _check(ours(x), ref, "SAM toy via winpos-convert")
    # the library's default keeps the preset's grid and names what would fit
    with pytest.raises(WinposError, match="pretrain_img_size=256 and pretrain_use_cls_token=False"):
        load_external(tmp_path / "hub", "vitdet_toy", img_size=256)
    # an explicit --set is the user's word: a grid that contradicts the file is refused, naming the --set flags
    wrong = tool(*base, "--force", "--set", "pretrain_img_size=224")
    assert_one_line_error(wrong, "--set pretrain_img_size=256 --set pretrain_use_cls_token=False")
    res = tool(*base, "--force", "--set", "pretrain_img_size=256", "--set", "pretrain_use_cls_token=False")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "target built with" not in res.stdout  # the user's values: nothing chosen for them
    assert torch.equal(load_file(str(out))["pos_embed.pos_embed"], ours.state_dict()["pos_embed.pos_embed"])
    assert_one_line_error(tool(*base, "--force", "--set", "pretrain_img_size"), "is not KEY=VALUE")
