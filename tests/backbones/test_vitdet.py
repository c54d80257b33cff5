"""winpos ``ViTDet``: structure against detectron2's ``ViT`` (names, shapes, parameter counts), the abs-win model
against detectron2 fed the tiled embedding, padding modes, recipes and presets, input validation, activation
checkpointing, bf16 autocast and torch.compile. Weight-loading parity lives in
tests/checkpoints/test_vitdet_import.py."""
import os
import time
from functools import partial

import pytest
from hypothesis import given, settings, strategies as st
import torch
import torch.nn as nn

from tests.conftest import require
from tests.helpers import randomize
from winpos.backbones import ViTDet, create, list_presets
from winpos.backbones.vitdet import RECIPES, SIZES
from winpos.checkpoints.vitdet import load_vitdet_weights

TINY = dict(embed_dim=32, depth=3, num_heads=2, global_blocks=(1,))


def d2_vit(**kw):
    vit = require("detectron2.modeling.backbone.vit")
    args = dict(img_size=1024, embed_dim=32, depth=3, num_heads=2, norm_layer=partial(nn.LayerNorm, eps=1e-6),
                use_rel_pos=True, window_size=14, window_block_indexes=[0, 2])
    return vit.ViT(**{**args, **kw})


@pytest.mark.parametrize("name", ["vitdet_b", "vitdet_l", "vitdet_h"])
def test_original_recipe_matches_detectron2_structure(name, monkeypatch):
    """Every parameter of detectron2's ViT-B/L/H config exists in the preset's original recipe under the same name
    and shape (built on the meta device: no memory, no init time)."""
    s = SIZES[name]
    linspace = torch.linspace  # detectron2 calls .item() on its drop-path schedule, which meta tensors refuse
    monkeypatch.setattr(torch, "linspace", lambda *a, **k: linspace(*a, **{**k, "device": "cpu"}))
    with torch.device("meta"):
        ours = create(name, recipe="original")
        ref = d2_vit(embed_dim=s["embed_dim"], depth=s["depth"], num_heads=s["num_heads"],
                     window_block_indexes=[i for i in range(s["depth"]) if i not in s["global_blocks"]])
    theirs = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    mine = {k.replace("pos_embed.pos_embed", "pos_embed"): tuple(v.shape) for k, v in ours.state_dict().items()}
    assert mine == theirs
    hd = s["embed_dim"] // s["num_heads"]
    g, w = s["global_blocks"][0], 0
    assert ours.blocks[g].attn.rel_pos_h.shape == (127, hd) and ours.blocks[w].attn.rel_pos_h.shape == (27, hd)
    assert ours.blocks[-1].drop_path.p == pytest.approx(s["drop_path_rate"]) and ours.blocks[0].drop_path.p == 0
    sizes = (ours.embed_dim, ours.depth, ours.num_layers, ours.patch_size)
    assert sizes == (s["embed_dim"], s["depth"], s["depth"], 16)


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_vitdet_b_recipe_parameter_counts(recipe):
    """Counts follow from the recipe: relpos tables (27 or 127 rows x 64) and abs (197 x 768) vs abs-win (2 x 14x14
    x 768) embeddings; RoPE (axial) and LookHere add no parameters."""
    with torch.device("meta"):
        base = sum(p.numel() for p in create("vitdet_b", recipe="original").parameters())
        n = sum(p.numel() for p in create("vitdet_b", recipe=recipe).parameters())
    win_rel, glob_rel, abs_n, abswin_n = 8 * 2 * 27 * 64, 4 * 2 * 127 * 64, 197 * 768, 2 * 14 * 14 * 768
    expected = {"original": base, "paper": base - win_rel - abs_n + abswin_n,
                "rope": base - win_rel - glob_rel - abs_n + abswin_n,
                "lookhere": base - win_rel - glob_rel - abs_n}[recipe]
    assert n == expected


def test_vitdet_b_full_size_forward():
    """One real full-size forward at 224 (recipes other than 'paper' run the same code at tiny sizes below)."""
    m = create("vitdet_b", recipe="paper").eval()
    t = time.perf_counter()
    with torch.no_grad():
        y = m(torch.randn(1, 3, 224, 224))
    print(f"vitdet_b/paper 224^2 forward: {time.perf_counter() - t:.2f}s")
    assert y.shape == (1, 768, 14, 14) and torch.isfinite(y).all()


def test_paper_recipe_equals_detectron2_fed_the_tiled_embedding():
    """At 1024 the abs-win model equals detectron2 whose 64x64 embedding is the 14x14 window tiled (independent
    tiling via repeat) and whose window blocks have no relpos."""
    torch.manual_seed(0)
    ours = randomize(ViTDet(img_size=1024, pos_embed="abswin", window_pos="none", global_pos="relpos", **TINY))
    with torch.no_grad():
        ours.pos_embed.global_embed.zero_()
    ref = d2_vit(pretrain_img_size=1024, pretrain_use_cls_token=False).eval()
    sd = {k: v for k, v in ours.state_dict().items() if not k.startswith("pos_embed.")}
    tiled = ours.pos_embed.window_embed[0].repeat(1, 5, 5)[:, :64, :64]  # (C, 64, 64)
    sd["pos_embed"] = tiled.flatten(1).t()[None]
    for i in (0, 2):
        sd[f"blocks.{i}.attn.rel_pos_h"] = torch.zeros(27, 16)
        sd[f"blocks.{i}.attn.rel_pos_w"] = torch.zeros(27, 16)
    ref.load_state_dict(sd)
    x = torch.randn(1, 3, 1024, 1024)
    with torch.no_grad():
        a, b = ref(x)["last_feat"], ours(x)
    print(f"abswin vs tiled detectron2: max abs err {(a - b).abs().max():.3g}")
    torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4 * a.abs().max().item())


@pytest.fixture(scope="module")
def small_pair():
    torch.manual_seed(3)
    ref = randomize(d2_vit(img_size=224, embed_dim=16))
    ours = ViTDet(img_size=224, embed_dim=16, depth=3, num_heads=2, global_blocks=(1,)).eval()
    load_vitdet_weights(ours, ref.state_dict())
    return ref, ours


@settings(max_examples=12)
@given(h=st.integers(1, 20), w=st.integers(1, 20))
def test_any_size_matches_detectron2(small_pair, h, w):
    """Any image whose sides are multiples of 16, from a grid smaller than one window to several padded windows."""
    ref, ours = small_pair
    x = torch.randn(1, 3, 16 * h, 16 * w)
    with torch.no_grad():
        a = ref(x)["last_feat"]
        torch.testing.assert_close(ours(x), a, rtol=1e-4, atol=1e-4 * a.abs().max().item())


def test_pad_mode_mask_differs_only_in_padded_windows():
    torch.manual_seed(0)
    zeros = randomize(ViTDet(img_size=320, embed_dim=32, depth=2, num_heads=2, global_blocks=()))
    masked = ViTDet(img_size=320, embed_dim=32, depth=2, num_heads=2, global_blocks=(), pad_mode="mask").eval()
    masked.load_state_dict(zeros.state_dict())
    with torch.no_grad():
        x = torch.randn(1, 3, 320, 320)  # 20x20 tokens -> padded to 28x28; only window (0, 0) is unpadded
        a, b = zeros(x), masked(x)
        assert torch.equal(a[..., :14, :14], b[..., :14, :14])
        top, bottom = slice(0, 14), slice(14, 20)
        for rows, cols in ((top, bottom), (bottom, top), (bottom, bottom)):
            assert (a[..., rows, cols] - b[..., rows, cols]).abs().amax(dim=1).min() > 1e-4
        x = torch.randn(1, 3, 448, 224)  # windows tile the grid: nothing is padded, so the modes agree
        assert torch.equal(zeros(x), masked(x))


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_recipes_build_expected_terms_and_run(recipe):
    m = create("vitdet_toy", recipe=recipe, img_size=256).eval()
    kinds = {i: b.attn.position.kind for i, b in enumerate(m.blocks)}
    spec = RECIPES[recipe]
    wk = spec["window_pos"] if isinstance(spec["window_pos"], str) else spec["window_pos"]["kind"]
    gk = spec["global_pos"] if isinstance(spec["global_pos"], str) else spec["global_pos"]["kind"]
    assert kinds == {0: wk, 1: gk, 2: wk, 3: gk}
    assert m.pos_embed_kind == spec["pos_embed"] and (m.pos_embed is None) == (spec["pos_embed"] == "none")
    assert [b.window_size for b in m.blocks] == [14, 0, 14, 0]
    with torch.no_grad():
        y = m(torch.randn(2, 3, 256, 320))
    assert y.shape == (2, 96, 16, 20) and torch.isfinite(y).all()
    assert all(any(s in n for s in ("pos_embed", "rel_pos", "rope")) for n in m.no_weight_decay())
    if recipe == "lookhere":
        lh = m.blocks[3].attn.lookhere
        assert (lh.variant, lh.layer_index, lh.num_layers) == ("45", 3, 4)


def test_abswin_recursive_is_periodic_with_the_pretrain_grid():
    m = ViTDet(img_size=1024, pos_embed="abswin_recursive", **TINY)
    with torch.no_grad():
        m.pos_embed.global_embed.normal_()
        e = m.pos_embed((64, 64))[0]
    torch.testing.assert_close(e[14:28, 28:42], e[:14, :14], rtol=0, atol=0)


def test_presets_listed():
    assert {"vitdet_toy", "vitdet_b", "vitdet_l", "vitdet_h"} <= set(list_presets())


def test_bad_inputs_raise_clear_errors():
    m = ViTDet(img_size=224, **TINY)
    with pytest.raises(ValueError, match="multiple of the patch stride 16"):
        m(torch.randn(1, 3, 224, 230))
    with pytest.raises(ValueError, match="nonzero size"):
        m(torch.randn(1, 3, 0, 224))
    with pytest.raises(ValueError, match="3 input channels"):
        m(torch.randn(1, 1, 224, 224))
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        m(torch.randn(3, 224, 224))
    with pytest.raises(ValueError, match="vitdet_b.*vitdet_toy"):
        create("vitdet_xl")
    with pytest.raises(ValueError, match="recipe.*'paper'"):
        create("vitdet_toy", recipe="abswin")
    with pytest.raises(ValueError, match="unknown ViTDet arguments.*'windowsize'"):
        create("vitdet_toy", windowsize=8)
    with pytest.raises(ValueError, match="pos_embed='sincos'.*'abswin'"):
        ViTDet(pos_embed="sincos", **TINY)
    with pytest.raises(ValueError, match="block position encoding='alibi'"):
        ViTDet(window_pos="alibi", **TINY)
    with pytest.raises(ValueError, match="global_blocks.*outside 0..2"):
        ViTDet(**{**TINY, "global_blocks": (1, 3)})
    with pytest.raises(ValueError, match="not divisible by num_heads"):
        ViTDet(**{**TINY, "num_heads": 5})
    with pytest.raises(ValueError, match="window_size=0 has no windows"):
        ViTDet(window_size=0, pos_embed="abswin", **TINY)
    with pytest.raises(ValueError, match="img_size.*multiple of patch_size"):
        ViTDet(img_size=1000, **TINY)


@pytest.mark.parametrize("recipe", ["original", "paper"])
def test_activation_checkpointing_same_outputs_and_grads(recipe):
    torch.manual_seed(0)
    plain = create("vitdet_toy", recipe=recipe, img_size=256, embed_dim=32, num_heads=2).train()
    randomize(plain).train()
    ckpt = create("vitdet_toy", recipe=recipe, img_size=256, embed_dim=32, num_heads=2, use_checkpoint=True).train()
    ckpt.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 256, 240)
    outs, grads = [], []
    for m in (plain, ckpt):
        y = m(x)
        (y.square().mean()).backward()
        outs.append(y.detach())
        grads.append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
    torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=0)
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) == len(list(plain.parameters()))
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], rtol=1e-5, atol=1e-7, msg=n)


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_bf16_autocast_close_to_fp32(recipe):
    torch.manual_seed(0)
    m = randomize(create("vitdet_toy", recipe=recipe, img_size=256, embed_dim=32, num_heads=2))
    x = torch.randn(1, 3, 256, 256)
    with torch.no_grad():
        ref = m(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = m(x)
    rel = ((low.float() - ref).norm() / ref.norm()).item()
    print(f"bf16 {recipe}: relative L2 error {rel:.3g}")
    assert torch.isfinite(low).all() and rel < 3e-2


def test_torch_compile_matches_eager():
    torch.manual_seed(0)
    m = randomize(create("vitdet_toy", recipe="paper", img_size=224, embed_dim=32, num_heads=2, depth=2,
                         global_blocks=(1,)))
    x = torch.randn(1, 3, 224, 256)
    # aot_eager keeps CI under a minute on 2 cores; fullgraph=True proves there is no graph break. Set
    # WINPOS_TEST_COMPILE_BACKEND=inductor to also generate code (about a minute of C++ compilation on CPU).
    compiled = torch.compile(m, backend=os.environ.get("WINPOS_TEST_COMPILE_BACKEND", "aot_eager"), fullgraph=True,
                             dynamic=False)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), m(x), rtol=1e-4, atol=1e-4)


def test_pretrained_weights_survive_create_overrides():
    """create(...) + the detectron2 converter: the documented path from a checkpoint to a model."""
    ref = randomize(d2_vit(img_size=224))
    m = create("vitdet_toy", img_size=224, embed_dim=32, num_heads=2, depth=3, global_blocks=(1,)).eval()
    report = load_vitdet_weights(m, {f"backbone.net.{k}": v for k, v in ref.state_dict().items()})
    assert not report.missing and not report.unexpected
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        a = ref(x)["last_feat"]
        torch.testing.assert_close(m(x), a, rtol=1e-4, atol=1e-4 * a.abs().max().item())
