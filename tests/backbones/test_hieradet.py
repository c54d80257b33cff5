"""HieraDet against sam2's ``Hiera`` trunk (oracle for the schedule, windows, q-pooling and abs-win), timm's Hiera
(oracle for full-size parameter counts), and its own contract: any image size, errors, checkpointing, autocast,
torch.compile, presets and recipes."""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from tests.conftest import require
from tests.helpers import assert_features_close, randomize_
from winpos.backbones.hieradet import RECIPES, BlockSpec, HieraBlock, HieraDet, block_schedule
from winpos.backbones.registry import create, list_presets
from winpos.checkpoints.hiera import load_hiera_checkpoint
from winpos.posemb import rope

SAM2_TINY = dict(embed_dim=16, num_heads=1, stages=(1, 1, 2, 1), global_att_blocks=(3,), window_spec=(8, 4, 14, 7))
TINY = dict(embed_dim=16, num_heads=1, stages=(1, 1, 2, 1), global_blocks=(3,), window_spec=(8, 4, 14, 7))  # winpos names
SIZES = ("hieradet_toy", "hieradet_t", "hieradet_s", "hieradet_b", "hieradet_bplus", "hieradet_l", "hieradet_h")


def tiny(**kw):
    return HieraDet(**{**TINY, "pos_global_size": 7, **kw}).eval()


# ------------------------------------------------------------------------------------------ sam2 parity
@pytest.fixture(scope="module")
def sam2_pair():
    hieradet = require("sam2.modeling.backbones.hieradet")
    ref = hieradet.Hiera(**SAM2_TINY, window_pos_embed_bkg_spatial_size=(7, 7)).eval()
    randomize_(ref)
    ours = tiny(img_size=1024)
    report = load_hiera_checkpoint(ours, ref.state_dict())
    assert not report.missing and not report.unexpected and report.source == "sam2"
    return ref, ours


@pytest.mark.parametrize("size", [1024, 512])
def test_matches_sam2_trunk(sam2_pair, size):
    ref, ours = sam2_pair
    x = torch.randn(1, 3, size, size)
    with torch.no_grad():
        expected, got = ref(x), ours(x)
    assert [f.shape[-1] for f in got] == [size // s for s in ours.strides]
    assert_features_close(got, expected)


def test_any_grid_where_sam2_fails(sam2_pair):
    ref, ours = sam2_pair
    x = torch.randn(1, 3, 1000, 1000)  # 250x250 tokens: not a multiple of the 8-token window
    with pytest.raises(RuntimeError):
        with torch.no_grad():
            ref(x)  # sam2 tiles its window embedding with floor division
    with torch.no_grad():
        out = ours(x)
    assert [tuple(f.shape[-2:]) for f in out] == [(250, 250), (125, 125), (63, 63), (32, 32)]
    assert all(torch.isfinite(f).all() for f in out)


def _sam2_block(window, dim=8, dim_out=16, heads=2):
    hieradet = require("sam2.modeling.backbones.hieradet")
    ref = randomize_(hieradet.MultiScaleBlock(dim, dim_out, heads, q_stride=(2, 2), window_size=window).eval())
    ours = HieraBlock(BlockSpec(1, 1, dim, dim_out, heads, window, 2)).eval()
    rename = {"mlp.layers.0": "mlp.fc1", "mlp.layers.1": "mlp.fc2"}
    sd = {}
    for k, v in ref.state_dict().items():
        for old, new in rename.items():
            k = k.replace(old, new)
        sd[k] = v
    ours.load_state_dict(sd)
    return ref, ours


@pytest.mark.parametrize("hw,window", [((13, 11), 8), ((7, 11), 4), ((7, 7), 14), ((16, 12), 8)])
def test_pooling_block_padding_policy(hw, window):
    """Odd grids: outputs are ceil-sized. Oracle: sam2's block on the floor part, sam2's pieces on the rest."""
    utils = require("sam2.modeling.backbones.utils")
    ref, ours = _sam2_block(window)
    x = torch.randn(2, *hw, 8)
    (H, W), (Ho, Wo) = hw, (-(-hw[0] // 2), -(-hw[1] // 2))
    with torch.no_grad():
        out = ours(x)
        assert out.shape == (2, Ho, Wo, 16)
        torch.testing.assert_close(out[:, : H // 2, : W // 2], ref(x), rtol=1e-5, atol=1e-5)
        # Full ceil grid: attention on the zero-padded windows, shortcut max over the valid tokens of each cell.
        xn = ref.norm1(x)
        windows, pad_hw = utils.window_partition(xn, window)
        att = utils.window_unpartition(ref.attn(windows), window // 2, (pad_hw[0] // 2, pad_hw[1] // 2), (Ho, Wo))
        proj = F.pad(ref.proj(xn).permute(0, 3, 1, 2), (0, 2 * Wo - W, 0, 2 * Ho - H), value=-math.inf)
        y = F.max_pool2d(proj, 2).permute(0, 2, 3, 1) + att
        y = y + ref.mlp(ref.norm2(y))
    torch.testing.assert_close(out, y, rtol=1e-5, atol=1e-5)


def test_global_pooling_block_never_attends_to_padding():
    """A global pooling block on an odd grid: ceil-pooled queries (pooled over the zero-padded grid, like window
    blocks), keys = the valid tokens only. Reference written here from sam2's block weights."""
    ref, ours = _sam2_block(0)
    x = torch.randn(2, 7, 9, 8)
    with torch.no_grad():
        out = ours(x)  # (sam2's block has no global pooling variant: it divides by the window)
        xn = ref.norm1(x)
        qkv = ref.attn.qkv(F.pad(xn, (0, 0, 0, 1, 0, 1))).reshape(2, 8, 10, 3, 2, 8)
        q = F.max_pool2d(qkv[..., 0, :, :].flatten(3).permute(0, 3, 1, 2), 2).permute(0, 2, 3, 1)
        q = q.reshape(2, 20, 2, 8).transpose(1, 2)
        k, v = (qkv[:, :7, :9, i].reshape(2, 63, 2, 8).transpose(1, 2) for i in (1, 2))
        att = ref.attn.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(2, 4, 5, 16))
        short = F.max_pool2d(ref.proj(xn).permute(0, 3, 1, 2), 2, ceil_mode=True).permute(0, 2, 3, 1)
        y = short + att
        y = y + ref.mlp(ref.norm2(y))
    torch.testing.assert_close(out, y, rtol=1e-5, atol=1e-5)


@settings(max_examples=12, deadline=None)
@given(h=st.integers(1, 200), w=st.integers(1, 200))
def test_output_sizes_are_ceil(h, w):
    model = HieraDet(embed_dim=8, num_heads=1, stages=(1, 1, 1, 1), global_blocks=(2,),
                     window_spec=(8, 4, 14, 7), pos_global_size=7).eval()
    with torch.no_grad():
        out = model(torch.randn(1, 3, h, w))
    assert [tuple(f.shape[-2:]) for f in out] == [(-(-h // s), -(-w // s)) for s in model.strides]
    assert [f.shape[1] for f in out] == model.channels == [8, 16, 32, 64]
    assert all(torch.isfinite(f).all() for f in out)


def test_pad_mode_mask_changes_only_padded_grids():
    zeros = randomize_(tiny())
    mask = tiny(pad_mode="mask")
    mask.load_state_dict(zeros.state_dict())
    with torch.no_grad():
        x = torch.randn(1, 3, 448, 448)  # every window tiles every stage grid: no padding anywhere
        assert_features_close(mask(x), zeros(x), rtol=1e-6)
        x = torch.randn(1, 3, 512, 512)  # only the last block pads: its 32x32 input to 42x42 for 14-token windows
        got, ref = mask(x), zeros(x)
    assert_features_close(got[:3], ref[:3], rtol=1e-6)
    assert (got[3] - ref[3]).abs().max() > 1e-3


# ------------------------------------------------------------------------------------ schedule and presets
# sam2's configs/sam2.1/sam2.1_hiera_{t,s,b+,l}.yaml: stages and global blocks; embed dims shrunk, the schedule
# does not depend on them.
SAM2_CONFIGS = {
    "hieradet_t": dict(stages=(1, 2, 7, 2), global_att_blocks=(5, 7, 9)),
    "hieradet_s": dict(stages=(1, 2, 11, 2), global_att_blocks=(7, 10, 13)),
    "hieradet_bplus": dict(stages=(2, 3, 16, 3), global_att_blocks=(12, 16, 20)),
    "hieradet_l": dict(stages=(2, 6, 36, 4), global_att_blocks=(23, 33, 43), window_spec=(8, 4, 16, 8)),
}


@pytest.mark.parametrize("name", sorted(SAM2_CONFIGS))
def test_schedule_matches_sam2(name):
    hieradet = require("sam2.modeling.backbones.hieradet")
    ref = hieradet.Hiera(embed_dim=8, num_heads=2, **SAM2_CONFIGS[name])
    with torch.device("meta"):
        ours = create(name, embed_dim=8, num_heads=2)
    assert len(ours.blocks) == len(ref.blocks) == ours.num_layers
    for a, b in zip(ours.blocks, ref.blocks):
        assert (a.window, a.q_stride > 1, a.dim, a.dim_out) == (b.window_size, b.pool is not None, b.dim, b.dim_out)
        assert a.attn.num_heads == b.attn.num_heads
    assert ours.channels == [ref.blocks[i].dim_out for i in ref.stage_ends]


@pytest.mark.parametrize("name,timm_name", [("hieradet_t", "hiera_tiny_224"), ("hieradet_s", "hiera_small_224"),
                                            ("hieradet_b", "hiera_base_224"), ("hieradet_bplus", "hiera_base_plus_224"),
                                            ("hieradet_l", "hiera_large_224"), ("hieradet_h", "hiera_huge_224")])
def test_full_size_trunks_match_timm_parameter_counts(name, timm_name):
    timm = require("timm")
    with torch.device("meta"):
        ref = timm.create_model(timm_name, pretrained=False)
        ours = create(name, "lookhere")  # no position parameters at all
    count = lambda m, skip: sum(p.numel() for n, p in m.named_parameters() if not n.startswith(skip))  # noqa: E731
    assert count(ours, ()) == count(ref, ("head", "pos_embed"))
    assert ours.channels == [f["num_chs"] for f in ref.feature_info]


@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("name", SIZES)
def test_every_preset_and_recipe_instantiates(name, recipe):
    with torch.device("meta"):
        model = create(name, recipe)
    assert isinstance(model, HieraDet) and model.strides == [4, 8, 16, 32]
    assert len(model.channels) == 4 and model.num_layers == len(model.blocks)
    names = [n for n, _ in model.named_parameters()]
    assert (RECIPES[recipe]["pos_embed"] != "none") == any(n.startswith("pos_embed.") for n in names)
    assert (recipe == "paper") == any("rel_pos" in n for n in names)
    assert model.no_weight_decay() == {n for n in names if "pos_embed" in n or "rel_pos" in n or "rope" in n}


@pytest.mark.parametrize("recipe", ["original", "paper"])  # rope / lookhere run on the tiny preset below
def test_hieradet_t_forward_224(recipe):
    model = create("hieradet_t", recipe, img_size=224).eval()
    with torch.no_grad():
        out = model(torch.randn(1, 3, 224, 224))
    assert [tuple(f.shape) for f in out] == [(1, 96, 56, 56), (1, 192, 28, 28), (1, 384, 14, 14), (1, 768, 7, 7)]
    assert all(torch.isfinite(f).all() for f in out)


def test_block_schedule_lag_rule_hiera_t():
    """Hiera-T at 1024 px, worked by hand: a block attends in its stage's window, except the first block of stages
    2-4 (the pooling block), which keeps the previous stage's window (the "lag"); global blocks 5, 7, 9."""
    specs = block_schedule(96, 1, (1, 2, 7, 2), (8, 4, 14, 7), (5, 7, 9))
    assert [s.window for s in specs] == [8, 8, 4, 4, 14, 0, 14, 0, 14, 0, 14, 7]
    assert [s.q_stride for s in specs] == [1, 2, 1, 2, 1, 1, 1, 1, 1, 1, 2, 1]
    assert [s.num_heads for s in specs] == [1, 2, 2, 4, 4, 4, 4, 4, 4, 4, 8, 8]


# --------------------------------------------------------------------------------------- block encodings
def test_paper_recipe_relpos_extents():
    model = create("hieradet_toy", "paper", img_size=1024, **TINY)
    hd = model.blocks[3].attn.head_dim
    assert model.blocks[3].attn.window_size == 0
    assert tuple(model.blocks[3].attn.rel_pos_h.shape) == (2 * 64 - 1, hd)  # stage-3 grid at 1024
    assert not any(hasattr(b.attn, "rel_pos_h") for i, b in enumerate(model.blocks) if i != 3)
    windowed = create("hieradet_toy", "paper", window_pos="relpos", **TINY)
    assert tuple(windowed.blocks[4].attn.rel_pos_w.shape) == (2 * 14 - 1, windowed.blocks[4].attn.head_dim)
    assert model.pos_embed.mode == "recursive" and model.pos_embed.base_hw == (56, 56)


def test_rope_pooled_blocks_use_pooled_query_grid(monkeypatch):
    calls = []
    original = rope.RoPE.tables

    def spy(self, q_hw, k_hw):
        calls.append((tuple(q_hw), tuple(k_hw)))
        return original(self, q_hw, k_hw)

    monkeypatch.setattr(rope.RoPE, "tables", spy)
    model = randomize_(create("hieradet_toy", "rope", **TINY)).eval()
    with torch.no_grad():
        out = model(torch.randn(1, 3, 256, 256))
    assert all(torch.isfinite(f).all() for f in out)
    # block 1 pools 8 -> 4 windows, block 2 pools 4 -> 2, block 3 global on 16x16, block 4 pools 14 -> 7 windows
    assert calls == [((8, 8), (8, 8)), ((4, 4), (8, 8)), ((2, 2), (4, 4)), ((16, 16), (16, 16)), ((7, 7), (14, 14))]


def test_lookhere_recipe_trains():
    model = randomize_(create("hieradet_toy", "lookhere", **TINY))
    out = model(torch.randn(2, 3, 128, 96))
    sum(f.square().mean() for f in out).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    assert model.pos_embed is None


# ------------------------------------------------------------------------------------------- contract
def test_bad_inputs_raise_clear_errors():
    model = tiny()
    with pytest.raises(ValueError, match="nonzero size"):
        model(torch.randn(1, 3, 0, 64))
    with pytest.raises(ValueError, match="3 input channels"):
        model(torch.randn(1, 1, 64, 64))
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        model(torch.randn(3, 64, 64))
    with pytest.raises(ValueError, match="available presets: .*hieradet_bplus"):
        create("hieradet_xl")
    assert set(SIZES) <= set(list_presets())
    with pytest.raises(ValueError, match="recipe.*'original'"):
        create("hieradet_toy", "sam3")
    with pytest.raises(ValueError, match="unknown HieraDet arguments.*'windowspec'"):  # was a TypeError
        create("hieradet_toy", windowspec=(8, 4, 14, 7))
    with pytest.raises(ValueError, match="pos_embed.*'abswin_recursive'"):
        tiny(pos_embed="sincos")
    with pytest.raises(ValueError, match="block position encoding.*'lookhere'"):
        tiny(global_pos="alibi")
    with pytest.raises(ValueError, match="even window"):
        tiny(window_spec=(7, 4, 14, 7))
    with pytest.raises(ValueError, match="one window per stage"):
        tiny(window_spec=(8, 4, 14))
    with pytest.raises(ValueError, match=r"outside the 5 blocks"):
        tiny(global_blocks=(5,))
    with pytest.raises(ValueError, match="pad_mode"):
        tiny(pad_mode="reflect")


def test_activation_checkpointing_matches():
    plain = randomize_(tiny()).train()
    ckpt = tiny(use_checkpoint=True).train()
    ckpt.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 96, 128)
    outs = [m(x) for m in (plain, ckpt)]
    for m, out in zip((plain, ckpt), outs):
        sum((f * torch.linspace(0, 1, f.shape[-1])).sum() for f in out).backward()
    assert_features_close(outs[1], outs[0], rtol=1e-6)
    for (n, a), b in zip(plain.named_parameters(), ckpt.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6, msg=n)


def test_bf16_autocast_close_to_fp32():
    model = randomize_(tiny(), std=0.1)
    x = torch.randn(1, 3, 128, 128)
    with torch.no_grad():
        ref = model(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(x)
    for a, r in zip(low, ref):
        err = (a.float() - r).abs().max() / r.abs().max()
        assert err < 5e-2, err


def test_torch_compile_static_shape():
    # aot_eager traces the model exactly like inductor (dynamo + AOT autograd) but skips C++ codegen, which takes
    # minutes on a 2-core CPU runner.
    model = randomize_(HieraDet(embed_dim=8, num_heads=1, stages=(1, 1, 1, 1), global_blocks=(2,),
                                window_spec=(8, 4, 4, 2), pos_global_size=7)).eval()
    x = torch.randn(1, 3, 64, 64)
    compiled = torch.compile(model, backend="aot_eager")
    with torch.no_grad():
        assert_features_close(compiled(x), model(x), rtol=1e-5)
