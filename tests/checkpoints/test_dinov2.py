"""DINOv2 into ViTDet: its format in Meta's, timm's and transformers' names, parity with timm and transformers, and the
stride-16 presets (``winpos.backbones.dinov2``).

What is compared: timm's random-init ``vit_small_patch14[_reg4]_dinov2`` (every weight non-trivial) saves its
``state_dict()``; the same weights in Meta's layout are written here (a cls row in front of ``pos_embed``,
``register_tokens``, a ``mask_token``); transformers' ``Dinov2[WithRegisters]Model`` is built small with its own
weights. winpos detects the format, converts into ``vitdet_dinov2_s`` built with patch 14, global attention and no
block terms at the pretraining size, and its feature map is compared with the oracle's trunk as ViTDet keeps it: the
patch tokens alone (ViTDet drops the cls and register tokens on import) through the oracle's own blocks, before its
final norm. Tolerance: max abs error <= 1e-4 x max(1, output scale), fp32.
"""
import pytest
import torch

from tests.conftest import require
from tests.helpers import randomize
from winpos.backbones import create
from winpos.checkpoints import load_external
from winpos.checkpoints.formats import Format, detect
from winpos.errors import WinposError

TOL = 1e-4


def _check(ours, ref, label):
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    err = (ours - ref).abs().max().item()
    scale = ref.abs().max().item()
    print(f"PARITY {label}: max abs err {err:.2e} (scale {scale:.2f})")
    assert err <= TOL * max(1.0, scale), err


def _x(n, seed=3):
    return torch.randn(1, 3, n, n, generator=torch.Generator().manual_seed(seed))


def _target(img_size, preset="s", **kw):
    return create(f"vitdet_dinov2_{preset}", window_size=0, global_blocks=(), global_pos="none", window_pos="none",
                  img_size=img_size, pretrain_img_size=img_size, patch_size=14, **kw).eval()


HF_SIZE = dict(embed_dim=64, depth=2, num_heads=2)


def _load(sd, fmt, img_size=224, **kw):
    assert detect(sd) == Format(fmt)
    ours = _target(img_size, **kw)
    converted, report = load_external(sd, ours)
    result = ours.load_state_dict(converted, strict=False)
    assert not result.missing_keys and not result.unexpected_keys, result
    assert not report.unknown and not report.missing, report.summary()
    return ours, report


# --------------------------------------------------------------------------------------------------- timm / Meta
def _timm(name, img_size=224):
    timm = require("timm")
    torch.manual_seed(0)
    return randomize(timm.create_model(name, pretrained=False, num_classes=0, img_size=img_size)).eval()


def _timm_trunk(model, x):
    """timm's DINOv2 blocks on the patch tokens alone (plus their position embedding), before the final norm."""
    tokens = model.patch_embed(x)
    pos = model.pos_embed
    tokens = tokens + (pos[:, 1:] if pos.shape[1] == tokens.shape[1] + 1 else pos)  # the registers' models: no cls row
    for blk in model.blocks:
        tokens = blk(tokens)
    n = x.shape[-1] // 14
    return tokens.transpose(1, 2).reshape(1, -1, n, n)


def meta_layout(sd: dict, cls_pos: torch.Tensor) -> dict:
    """timm's DINOv2 state dict in Meta's names (written for this test): ``register_tokens``, a ``mask_token``, and
    ``pos_embed`` with the cls row in front (Meta gives the cls token a position; timm's register models keep none)."""
    out = {("register_tokens" if k == "reg_token" else k): v for k, v in sd.items()}
    if "reg_token" in sd:
        out["pos_embed"] = torch.cat([cls_pos, sd["pos_embed"]], dim=1)
    out["mask_token"] = torch.zeros(1, sd["pos_embed"].shape[-1])
    return out


@pytest.mark.parametrize("layout", ["timm", "meta"])
@pytest.mark.parametrize("name", ["vit_small_patch14_dinov2", "vit_small_patch14_reg4_dinov2"])
def test_parity_with_timm(name, layout):
    model = _timm(name)
    sd = model.state_dict()
    if layout == "meta":
        sd = meta_layout(sd, torch.randn(1, 1, model.embed_dim))
    ours, report = _load(sd, "dinov2")
    lost = [k for k, _ in report.lost]
    assert lost == (["register_tokens" if layout == "meta" else "reg_token"] if "reg4" in name else []), lost
    assert dict(report.unexpected)["cls_token"].startswith("ViTDet keeps no cls token")
    x = _x(224)
    with torch.no_grad():
        _check(ours(x), _timm_trunk(model, x), f"{name} ({layout}) 224 px")


def test_parity_is_sensitive_to_layer_scale():
    model = _timm("vit_small_patch14_dinov2")
    ours, _ = _load(model.state_dict(), "dinov2")
    x = _x(224)
    with torch.no_grad():
        ref = _timm_trunk(model, x)
        ours.blocks[3].ls2.gamma.mul_(2)
        assert (ours(x) - ref).abs().max() > 1e-2 * ref.abs().max()


# ----------------------------------------------------------------------------------------------------- transformers
def _hf(registers: int, swiglu: bool = False):
    T = require("transformers")
    kw = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=56, patch_size=14,
              layerscale_value=0.5, use_swiglu_ffn=swiglu)
    if registers:
        model = T.Dinov2WithRegistersModel(T.Dinov2WithRegistersConfig(num_register_tokens=registers, **kw))
    else:
        model = T.Dinov2Model(T.Dinov2Config(**kw))
    torch.manual_seed(0)
    return randomize(model).eval()


def _hf_trunk(hf, x):
    tokens = hf.embeddings.patch_embeddings(x) + hf.embeddings.position_embeddings[:, 1:]
    for layer in hf.encoder.layer:
        tokens = layer(tokens)
        tokens = tokens[0] if isinstance(tokens, tuple) else tokens
    n = x.shape[-1] // 14
    return tokens.transpose(1, 2).reshape(1, -1, n, n)


@pytest.mark.parametrize("registers", [0, 4], ids=["dinov2", "dinov2_reg"])
def test_parity_with_transformers(registers):
    hf = _hf(registers)
    sd = hf.state_dict()
    ours, report = _load(sd, "dinov2", img_size=56, mlp_ratio=4.0, **HF_SIZE)
    assert report.source == "dinov2 (Hugging Face transformers names)"
    assert [k for k, _ in report.lost] == (["embeddings.register_tokens"] if registers else [])
    assert dict(report.converted)["blocks.1.ls1.gamma"] == "renamed from 'encoder.layer.1.layer_scale1.lambda1'"
    x = _x(56)
    with torch.no_grad():
        _check(ours(x), _hf_trunk(hf, x), f"transformers DINOv2 (registers {registers}) 56 px")


def test_transformers_swiglu_reads_as_metas_packed_w12():
    """DINOv2-g's SwiGLU: transformers' ``gate_proj`` / ``up_proj`` (``weights_in`` in transformers 4 files) become
    one packed ``mlp.fc1``, gate rows first, and the block equals transformers' forward."""
    hf = _hf(0, swiglu=True)
    sd = hf.state_dict()
    hidden = sd["encoder.layer.0.mlp.down_proj.weight"].shape[1]
    ours, _ = _load(sd, "dinov2", img_size=56, mlp_ratio=hidden / 64, block={"mlp": "swiglu"}, **HF_SIZE)
    x = _x(56)
    with torch.no_grad():
        _check(ours(x), _hf_trunk(hf, x), "transformers DINOv2 SwiGLU 56 px")


# ------------------------------------------------------------------------------------------ the stride-16 presets
def test_the_preset_takes_the_37x37_grid_and_a_resampled_kernel():
    model = _timm("vit_small_patch14_dinov2", img_size=518)
    ours = create("vitdet_dinov2_s", img_size=1024)
    converted, report = load_external(model.state_dict(), ours)
    assert tuple(converted["patch_embed.proj.weight"].shape[-2:]) == (16, 16)
    how = dict(report.converted + report.reshaped)["patch_embed.proj.weight"]
    assert "patch kernel resampled (14, 14) -> (16, 16)" in how, report.summary()
    stored = converted["pos_embed.pos_embed"]  # the 37 x 37 grid as it was, behind its cls row
    assert stored.shape == (1, 1 + 37 * 37, 384)
    torch.testing.assert_close(stored, model.pos_embed, rtol=0, atol=0)
    ours.load_state_dict(converted, strict=False)
    with torch.no_grad():
        assert ours(_x(64)).shape == (1, 384, 4, 4)


def test_a_dinov2_file_into_a_plain_vitdet_is_refused_naming_the_loss():
    model = _timm("vit_small_patch14_dinov2")
    with pytest.raises(WinposError, match="ls1.gamma|LayerScale"):
        load_external(model.state_dict(), create("vitdet_b", img_size=224, embed_dim=384, num_heads=6,
                                                 patch_size=14, pretrain_img_size=224), allow_loss=False)


def test_other_layerscale_vits_are_not_taken_for_dinov2():
    sd = {"cls_token": torch.zeros(1, 1, 8), "pos_embed": torch.zeros(1, 197, 8),
          "patch_embed.proj.weight": torch.zeros(8, 3, 16, 16), "blocks.0.ls1.gamma": torch.zeros(8),
          "blocks.0.attn.qkv.weight": torch.zeros(24, 8)}
    assert detect(sd) != Format.DINOV2  # a patch-16 LayerScale ViT is not DINOv2
    sd["patch_embed.proj.weight"] = torch.zeros(8, 3, 14, 14)
    assert detect(sd) == Format.DINOV2


def test_transformers_4_names_read_the_same():
    """The Hub's DINOv2 files carry transformers 4's names (``attention.attention.query``, ``attention.output.dense``,
    SwiGLU ``mlp.weights_in`` / ``weights_out``); they convert to the same tensors as transformers 5's."""
    import re

    from winpos.checkpoints.hf import to_native

    for swiglu in (False, True):
        sd = _hf(0, swiglu=swiglu).state_dict()
        legacy = {}
        for k, v in sd.items():
            k = re.sub(r"attention\.([qkv])_proj", lambda m: "attention.attention." + {"q": "query", "k": "key",
                                                                                     "v": "value"}[m.group(1)], k)
            k = k.replace("attention.o_proj", "attention.output.dense")
            legacy[k] = v
        if swiglu:
            for i in range(2):
                p = f"encoder.layer.{i}.mlp."
                for part in ("weight", "bias"):
                    legacy[f"{p}weights_in.{part}"] = torch.cat([legacy.pop(f"{p}gate_proj.{part}"),
                                                                 legacy.pop(f"{p}up_proj.{part}")])
                    legacy[f"{p}weights_out.{part}"] = legacy.pop(f"{p}down_proj.{part}")
        assert legacy.keys() != sd.keys()
        ours = {}
        for layout in (sd, legacy):
            model = _target(56, mlp_ratio=sd["encoder.layer.0.mlp." + ("down_proj" if swiglu else "fc2") +
                                            ".weight"].shape[1] / 64, **HF_SIZE,
                            **({"block": {"mlp": "swiglu"}} if swiglu else {}))
            converted, report = load_external(layout, model)
            assert not report.unknown and not report.missing, report.summary()
            ours[len(ours)] = converted
        assert ours[0].keys() == ours[1].keys()
        for k in ours[0]:
            torch.testing.assert_close(ours[0][k], ours[1][k], rtol=0, atol=0)
        assert "blocks.0.mlp.w12.weight" in to_native(legacy).state_dict or not swiglu


# --------------------------------------------------------------------------------------------------- giant (SwiGLU)
GIANT_SMALL = dict(embed_dim=192, num_heads=3, depth=2)  # timm's SwiGLU hidden: int(192 * 5.33334) = 1024, packed


@pytest.mark.parametrize("layout", ["timm", "meta"])
def test_the_giant_swiglu_trunk_equals_timms(layout):
    """timm's ``vit_giant_patch14_dinov2`` (SwiGLUPacked: ``fc1`` the gate rows then the value rows, ``silu(gate) *
    value``) narrowed to width 192, 2 blocks, into ``vitdet_dinov2_g`` narrowed the same way (its SwiGLU 512 wide);
    in Meta's names the MLP is ``w12`` / ``w3``. A swapped gate / value order would fail the tolerance."""
    timm = require("timm")
    torch.manual_seed(0)
    model = randomize(timm.create_model("vit_giant_patch14_dinov2", pretrained=False, num_classes=0, img_size=224,
                                        **GIANT_SMALL)).eval()
    assert model.blocks[0].mlp.fc1.out_features == 1024 and model.blocks[0].mlp.fc2.in_features == 512
    sd = model.state_dict()
    if layout == "meta":
        sd = {k.replace(".mlp.fc1.", ".mlp.w12.").replace(".mlp.fc2.", ".mlp.w3."): v
              for k, v in meta_layout(sd, torch.randn(1, 1, 192)).items()}
    ours, report = _load(sd, "dinov2", **GIANT_SMALL, block={"mlp": "swiglu", "mlp_hidden": 512}, preset="g")
    assert not report.lost, report.summary()
    x = _x(224)
    with torch.no_grad():
        _check(ours(x), _timm_trunk(model, x), f"vit_giant_patch14_dinov2 narrowed ({layout}) 224 px")
    swapped = {k: (torch.cat(v.chunk(2)[::-1]) if ".mlp.fc1." in k else v) for k, v in model.state_dict().items()}
    wrong, _ = _load(swapped, "dinov2", **GIANT_SMALL, block={"mlp": "swiglu", "mlp_hidden": 512}, preset="g")
    with torch.no_grad():
        assert (wrong(x) - _timm_trunk(model, x)).abs().max() > 1e-2


def test_the_giant_preset_holds_every_tensor_of_the_full_size_giant_at_its_shape():
    """At full size (meta device: nothing allocated) every block tensor of timm's ViT-g/14 DINOv2 is in
    ``vitdet_dinov2_g`` at its shape (width 1536, 40 blocks, 24 heads, SwiGLU 4096), and the preset is the one its
    width and depth fit."""
    timm = require("timm")
    from winpos.checkpoints import fitting_presets

    with torch.device("meta"):
        theirs = timm.create_model("vit_giant_patch14_dinov2", pretrained=False, num_classes=0).state_dict()
        ours = create("vitdet_dinov2_g").state_dict()
    blocks = {k: v.shape for k, v in theirs.items() if k.startswith("blocks.")}
    assert len(blocks) == 40 * 14
    assert {k: ours[k].shape for k in blocks if k in ours} == blocks
    assert fitting_presets(theirs)[1:] == (1536, 40, ["vitdet_dinov2_g"])
