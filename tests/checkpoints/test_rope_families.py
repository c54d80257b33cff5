"""DINOv3, EVA-02 and RoPE-ViT into ViTDet: formats, conversion and parity with timm.

What is compared: timm's random-init model of each family saves its ``state_dict()`` (timm's layout), and the same
weights in the authors' layout (written here by inverting timm's checkpoint filter); winpos detects the format,
converts it into the family's preset built with global attention at the pretraining size, and its feature map
``(B, C, H, W)`` is compared with timm's own forward on the same weights: the patch tokens after the last block
(``forward_intermediates(norm=False)``, before timm's final norm, which ViTDet has no counterpart of), reshaped to the
grid. ViTDet drops the prefix tokens (cls, DINOv3's storage tokens) on import, so the oracle is timm's model of the
same name built without them (``class_token=False, num_reg_tokens=0``) holding the same weights: timm's forward of
the trunk as ViTDet keeps it. Tolerance: max abs error <= 1e-4 in fp32.

EVA-02 is compared at its own patch 14 (``patch_size=14``); the stride-16 detector it becomes (kernel resampled on
import) is checked by its defining property on each patch. With windows, the presets equal ``_reference``, an
independent implementation of the intended computation written below.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import require
from tests.helpers import randomize
from winpos.backbones import create
from winpos.checkpoints import load_external
from winpos.checkpoints.formats import Format, detect

TOL = 1e-4

# (timm model, winpos preset, recipe, format); every size timm defines up to L. B and L run at a small image.
FAST = [
    ("vit_tiny_patch16_dinov3_qkvb", "vitdet_dinov3_t", "original", "dinov3"),
    ("vit_small_patch16_dinov3", "vitdet_dinov3_s", "original", "dinov3"),
    ("vit_small_patch16_dinov3_qkvb", "vitdet_dinov3_s", "original", "dinov3"),
    ("vit_small_plus_patch16_dinov3", "vitdet_dinov3_splus", "original", "dinov3"),
    ("eva02_tiny_patch14_224", "vitdet_eva02_t", "original", "eva02"),
    ("eva02_small_patch14_224", "vitdet_eva02_s", "original", "eva02"),
    ("vit_small_patch16_rope_224", "vitdet_ropevit_s", "original", "rope_vit"),
    ("vit_small_patch16_rope_mixed_224", "vitdet_ropevit_s", "mixed", "rope_vit"),
    ("vit_small_patch16_rope_ape_224", "vitdet_ropevit_s", "axial_ape", "rope_vit"),
    ("vit_small_patch16_rope_mixed_ape_224", "vitdet_ropevit_s", "mixed_ape", "rope_vit"),
]
LARGE = [
    ("vit_base_patch16_dinov3", "vitdet_dinov3_b", "original", "dinov3"),
    ("vit_base_patch16_dinov3_qkvb", "vitdet_dinov3_b", "original", "dinov3"),
    ("vit_large_patch16_dinov3", "vitdet_dinov3_l", "original", "dinov3"),
    ("eva02_base_patch14_224", "vitdet_eva02_b", "original", "eva02"),
    ("eva02_large_patch14_224", "vitdet_eva02_l", "original", "eva02"),
    ("vit_base_patch16_rope_224", "vitdet_ropevit_b", "original", "rope_vit"),
    ("vit_base_patch16_rope_mixed_224", "vitdet_ropevit_b", "mixed", "rope_vit"),
    ("vit_large_patch16_rope_224", "vitdet_ropevit_l", "original", "rope_vit"),
    ("vit_large_patch16_rope_mixed_ape_224", "vitdet_ropevit_l", "mixed_ape", "rope_vit"),
]


def _timm_pair(name, img_size):
    """timm's model (random, every weight non-trivial) and the same model without prefix tokens, same weights."""
    timm = require("timm")
    kw = {} if img_size == 224 else {"img_size": img_size}
    torch.manual_seed(0)
    full = randomize(timm.create_model(name, pretrained=False, num_classes=0, **kw))
    trunk = timm.create_model(name, pretrained=False, num_classes=0, class_token=False, num_reg_tokens=0,
                              global_pool="avg", **kw).eval()
    # the final norms are not compared (ViTDet has none): the two models place them differently without a cls token
    sd = {k: v for k, v in full.state_dict().items()
          if k not in ("cls_token", "reg_token") and not k.startswith(("norm.", "fc_norm."))}
    if "pos_embed" in sd and not full.no_embed_class:
        sd["pos_embed"] = sd["pos_embed"][:, full.num_prefix_tokens:]
    missing, unexpected = trunk.load_state_dict(sd, strict=False)
    assert not unexpected and all("k_bias" in k or k.startswith(("norm.", "fc_norm.")) for k in missing), missing
    return full, trunk


def _timm_features(model, x):
    (out,) = model.forward_intermediates(x, indices=[len(model.blocks) - 1], norm=False, intermediates_only=True)
    return out


def original_layout(sd: dict, fmt: str, model) -> dict:
    """timm's state dict in the authors' layout: timm's ``checkpoint_filter_fn`` inverted, written for this test."""
    out = {}
    swiglu = any(".mlp.fc1_g." in k for k in sd)
    for k, v in sd.items():
        if fmt == "dinov3":
            if k.endswith(("attn.q_bias", "attn.v_bias")):
                continue  # written below as Meta's fused, masked qkv.bias
            k = k.replace("reg_token", "storage_tokens").replace("gamma_1", "ls1.gamma").replace("gamma_2", "ls2.gamma")
            if swiglu:
                k = k.replace("mlp.fc1_g.", "mlp.w1.").replace("mlp.fc1_x.", "mlp.w2.").replace("mlp.fc2.", "mlp.w3.")
        elif fmt == "eva02":
            k = k.replace("attn.q_proj.bias", "attn.q_bias").replace("attn.v_proj.bias", "attn.v_bias")
            k = k.replace("mlp.fc1_g.", "mlp.w1.").replace("mlp.fc1_x.", "mlp.w2.").replace("mlp.norm.", "mlp.ffn_ln.")
            k = k.replace("mlp.fc2.", "mlp.w3.").replace("mlp.fc1.", "mlp.w12.")
        elif fmt == "rope_vit" and k == "rope.freqs":
            k, v = "freqs", v.flatten(2)  # (2, depth, heads, D/2) -> the authors' (2, depth, heads * D/2)
        out[k] = v
    if fmt == "dinov3":
        out["mask_token"] = torch.zeros(1, model.embed_dim)
        out["rope_embed.periods"] = torch.ones(model.blocks[0].attn.head_dim // 4)
        for i, blk in enumerate(model.blocks):
            w = sd[f"blocks.{i}.attn.qkv.weight"]
            q = sd.get(f"blocks.{i}.attn.q_bias", torch.zeros(w.shape[0] // 3))
            v = sd.get(f"blocks.{i}.attn.v_bias", torch.zeros(w.shape[0] // 3))
            out[f"blocks.{i}.attn.qkv.bias"] = torch.cat([q, torch.randn_like(q), v])  # the mask hides the k part
            out[f"blocks.{i}.attn.qkv.bias_mask"] = torch.cat([torch.ones_like(q), torch.zeros_like(q),
                                                               torch.ones_like(v)])
    elif fmt == "eva02":
        out["mask_token"] = torch.zeros(1, 1, model.embed_dim)
        out["rope.freqs_cos"] = torch.ones(256, model.blocks[0].attn.head_dim)
        if "fc_norm.weight" in out:  # timm moves MIM's final norm to fc_norm
            out["norm.weight"], out["norm.bias"] = out.pop("fc_norm.weight"), out.pop("fc_norm.bias")
    elif fmt == "rope_vit" and "freqs" in out:
        n = model.patch_embed.grid_size
        out["freqs_t_x"] = torch.arange(n[0] * n[1]).float() % n[1]
        out["freqs_t_y"] = torch.div(torch.arange(n[0] * n[1]), n[1], rounding_mode="floor").float()
    return out


def _winpos(preset, recipe, sd, fmt, img_size, patch, qkv_bias):
    extra = {} if patch == 16 else {"patch_size": patch}
    if qkv_bias:
        extra["qkv_bias"] = True
    model = create(preset, recipe=recipe, window_size=0, img_size=img_size, pretrain_img_size=img_size,
                   **extra).eval()
    assert detect(sd) == Format(fmt)
    converted, report = load_external(sd, model)
    assert not report.unknown, report.unknown
    lost = [k for k, _ in report.lost]
    assert all(k in ("storage_tokens", "reg_token") for k in lost), report.summary()
    result = model.load_state_dict(converted, strict=False)
    assert not result.missing_keys and not result.unexpected_keys, result
    return model


def _parity(name, preset, recipe, fmt, img_size, layout):
    full, trunk = _timm_pair(name, img_size)
    patch = full.patch_embed.patch_size[0]
    sd = full.state_dict()
    if layout == "original":
        sd = original_layout(sd, fmt, full)
    model = _winpos(preset, recipe, sd, fmt, img_size, patch, qkv_bias=name.endswith("_qkvb"))
    x = torch.randn(1, 3, img_size, img_size, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours, ref = model(x), _timm_features(trunk, x)
    assert ours.shape == ref.shape
    err = (ours - ref).abs().max().item()
    print(f"PARITY {name} {layout} {img_size}px max_abs={err:.2e} (scale {ref.abs().max().item():.1f})")
    assert err <= TOL, err
    return err


@pytest.mark.parametrize("layout", ["timm", "original"])
@pytest.mark.parametrize("name,preset,recipe,fmt", FAST, ids=[c[0] for c in FAST])
def test_parity_with_timm_at_the_pretraining_size(name, preset, recipe, fmt, layout):
    _parity(name, preset, recipe, fmt, 224, layout)


# the authors' layout of B only: L's goes through the same renaming (CPU time; all 18 measured at 4766504)
LARGE_CASES = [(*c, "timm") for c in LARGE] + [(*c, "original") for c in LARGE if "large" not in c[0]]


@pytest.mark.parametrize("name,preset,recipe,fmt,layout", LARGE_CASES, ids=[f"{c[0]}-{c[4]}" for c in LARGE_CASES])
def test_parity_b_and_l_at_a_small_image(name, preset, recipe, fmt, layout):
    # B and L: every key mapped, one forward at 112 px (EVA-02: 98 px, 7 x 7 patches of 14)
    size = 98 if fmt == "eva02" else 112
    _parity(name, preset, recipe, fmt, size, layout)


# ------------------------------------------------------------------------------ windows: an independent reference
def _angles(conv, extent, head_dim, freqs=None):
    """Rotation angles ``(1 | heads, N, D/2)`` of the tokens of one attention extent (a window, or the whole grid)
    under each family's convention, written out from the papers' formulas."""
    H, W = extent
    ys, xs = torch.meshgrid(torch.arange(H, dtype=torch.float64), torch.arange(W, dtype=torch.float64),
                            indexing="ij")
    y, x = ys.flatten()[:, None], xs.flatten()[:, None]
    i = torch.arange(head_dim // 4, dtype=torch.float64) / (head_dim // 4)
    if conv == "dinov3":  # centered in [-1, 1], periods 100^(i/n)
        cy, cx = 2 * (y + 0.5) / H - 1, 2 * (x + 0.5) / W - 1
        return torch.cat([cy * 2 * math.pi / 100 ** i, cx * 2 * math.pi / 100 ** i], -1)[None]
    if conv == "eva02":  # rescaled into the 16 x 16 pretraining grid, base 10000, y first
        return torch.cat([y * 16 / H / 10000 ** i, x * 16 / W / 10000 ** i], -1)[None]
    if conv == "axial":  # integer positions, base 100, x first
        return torch.cat([x / 100 ** i, y / 100 ** i], -1)[None]
    f = freqs.double()  # mixed: (2, heads, D/2) as (f_y, f_x)
    return y[None] * f[0][:, None] + x[None] * f[1][:, None]


def _rotate(t, ang, pairing):
    """t (B, heads, N, D) rotated by ang (1 | heads, N, D/2): pairs (2j, 2j+1) or (j, j + D/2)."""
    d = t.shape[-1]
    if pairing == "interleaved":
        a, b = t[..., 0::2], t[..., 1::2]
    else:
        a, b = t[..., : d // 2], t[..., d // 2:]
    z = torch.complex(a, b) * torch.polar(torch.ones_like(ang), ang)
    if pairing == "interleaved":
        return torch.stack([z.real, z.imag], -1).flatten(-2)
    return torch.cat([z.real, z.imag], -1)


def _reference(model, sd, x, conv, pairing):
    """The intended computation of a windowed ViTDet from the weights ``sd`` (float64): patchify, token embedding
    (abs: bicubic-resized to the grid; abs-win: window part tiled + global part resized), then per block: LN, zero-pad to whole windows, attention inside each window (or over
    the grid in global blocks) with q / k rotated at positions local to the extent, no key bias, LayerScale, MLP."""
    sd = {k: v.double() for k, v in sd.items()}
    eps, heads, ws = model.blocks[0].norm1.eps, model.num_heads, model.window_size
    h = F.conv2d(x.double(), sd["patch_embed.proj.weight"], sd["patch_embed.proj.bias"], stride=model.patch_size)
    if "pos_embed.pos_embed" in sd:
        ph, pw = model.pretrain_hw
        grid = sd["pos_embed.pos_embed"][:, -ph * pw:].reshape(1, ph, pw, -1).permute(0, 3, 1, 2)
        h = h + F.interpolate(grid, size=h.shape[-2:], mode="bicubic", align_corners=False)
    if "pos_embed.window_embed" in sd:  # abs-win: the window embedding tiled from the origin + the global one resized
        win, hw = sd["pos_embed.window_embed"], h.shape[-2:]
        tiled = win.repeat(1, 1, -(-hw[0] // win.shape[-2]), -(-hw[1] // win.shape[-1]))[..., : hw[0], : hw[1]]
        h = h + tiled + F.interpolate(sd["pos_embed.global_embed"], size=hw, mode="bicubic", align_corners=False)
    h = h.permute(0, 2, 3, 1)
    B, H, W, C = h.shape
    D = C // heads
    for i in range(model.depth):
        p = lambda name: sd[f"blocks.{i}.{name}"]  # noqa: E731
        u = F.layer_norm(h, (C,), p("norm1.weight"), p("norm1.bias"), eps)
        glob = i in model.global_blocks
        if not glob:  # zero-pad after the norm, then cut ws x ws windows
            Hp, Wp = -(-H // ws) * ws, -(-W // ws) * ws
            u = F.pad(u, (0, 0, 0, Wp - W, 0, Hp - H))
            u = u.reshape(B, Hp // ws, ws, Wp // ws, ws, C).permute(0, 1, 3, 2, 4, 5).reshape(-1, ws * ws, C)
            extent = (ws, ws)
        else:
            u, extent = u.reshape(B, H * W, C), (H, W)
        bias = p("attn.qkv.bias").clone() if f"blocks.{i}.attn.qkv.bias" in sd else torch.zeros(3 * C).double()
        if model.block_options.k_bias is False:
            bias[C:2 * C] = 0
        q, k, v = (u @ p("attn.qkv.weight").T + bias).reshape(u.shape[0], -1, 3, heads, D).permute(2, 0, 3, 1, 4)
        ang = _angles(conv, extent, D, sd.get(f"blocks.{i}.attn.rope.freqs"))
        q, k = _rotate(q, ang, pairing), _rotate(k, ang, pairing)
        o = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D), -1) @ v
        o = o.transpose(1, 2).reshape(u.shape[0], -1, C) @ p("attn.proj.weight").T + p("attn.proj.bias")
        if not glob:
            o = o.reshape(B, Hp // ws, Wp // ws, ws, ws, C).permute(0, 1, 3, 2, 4, 5).reshape(B, Hp, Wp, C)
            o = o[:, :H, :W]
        else:
            o = o.reshape(B, H, W, C)
        h = h + sd.get(f"blocks.{i}.ls1.gamma", 1) * o
        u = F.layer_norm(h, (C,), p("norm2.weight"), p("norm2.bias"), eps)
        u = u @ p("mlp.fc1.weight").T + p("mlp.fc1.bias")
        if model.block_options.mlp == "swiglu":
            gate, val = u.chunk(2, -1)
            u = F.silu(gate) * val
            if f"blocks.{i}.mlp.norm.weight" in sd:
                u = F.layer_norm(u, (u.shape[-1],), p("mlp.norm.weight"), p("mlp.norm.bias"), eps)
        else:
            u = F.gelu(u)
        h = h + sd.get(f"blocks.{i}.ls2.gamma", 1) * (u @ p("mlp.fc2.weight").T + p("mlp.fc2.bias"))
    return h.permute(0, 3, 1, 2)


WINDOWED = [  # (preset, recipe, convention, pairing)
    ("vitdet_dinov3_s", "original", "dinov3", "half"),
    ("vitdet_eva02_t", "original", "eva02", "interleaved"),
    ("vitdet_eva02_b", "paper", "eva02", "interleaved"),
    ("vitdet_ropevit_s", "original", "axial", "interleaved"),
    ("vitdet_ropevit_s", "mixed_ape", "mixed", "interleaved"),
]


@pytest.mark.parametrize("preset,recipe,conv,pairing", WINDOWED, ids=[f"{c[0]}-{c[1]}" for c in WINDOWED])
def test_windowed_presets_equal_the_reference(preset, recipe, conv, pairing):
    # 288 px: an 18 x 18 grid, windows of 14 (16 for EVA-02) padded, global blocks off the pretraining grid
    small = {"depth": 4, "global_blocks": (1, 3)}
    if preset.endswith("_b"):
        small.update(embed_dim=192, num_heads=3)  # the B block (sub-LN SwiGLU) at a CPU-sized width
    torch.manual_seed(0)
    # qkv_bias on everywhere (DINOv3-S has none): a random key bias that DINOv3 / EVA-02 must hold at zero
    model = randomize(create(preset, recipe=recipe, img_size=288, qkv_bias=True, **small))
    x = torch.randn(1, 3, 288, 288, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ours, ref = model(x), _reference(model, model.state_dict(), x, conv, pairing)
    err = (ours.double() - ref).abs().max().item()
    print(f"WINDOWED {preset} {recipe} max_abs={err:.2e} (scale {ref.abs().max().item():.1f})")
    assert err <= TOL, err


# ------------------------------------------------------------------------------------------ options, validated
@pytest.mark.parametrize("block,needle", [({"mlp": "geglu"}, "block mlp"), ({"mlp_norm": True}, "mlp='swiglu'"),
                                          ({"mlp_hidden": 0}, "mlp_hidden"), ({"kbias": False}, "unknown block options")])
def test_block_options_refuse_nonsense_in_one_line(block, needle):
    from winpos.errors import WinposError

    with pytest.raises(WinposError, match=needle) as e:
        create("vitdet_toy", block=block)
    assert "\n" not in str(e.value)


def test_centered_coordinates_are_dinov3s_axial_convention():
    from winpos.errors import WinposError
    from winpos.posemb.rope import RoPE

    with pytest.raises(WinposError, match="kind='axial'"):
        RoPE(64, 2, kind="mixed", coords="centered")
    # the same tables as timm's DINOv3 rotary embedding at a non-square grid
    timm_rope = require("timm.layers.pos_embed_sincos")
    ours = RoPE(64, 2, base=100.0, fraction=1.0, pairing="half", coords="centered").tables((6, 10), (6, 10))
    sin, cos = timm_rope.RotaryEmbeddingDinoV3(64, temperature=100).get_embed((6, 10)).chunk(2, -1)
    torch.testing.assert_close(ours.cos_k, cos[:, :32], atol=1e-5, rtol=0)
    torch.testing.assert_close(ours.sin_k, sin[:, :32], atol=1e-5, rtol=0)
