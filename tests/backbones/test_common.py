"""The shared ``Attention`` module: a zero-padded window block partitions x before its projections (one copy,
as SAM2 does); that path must equal attention on the whole padded grid with the same weights, for every position
term, with and without pooled queries."""
import pytest
import torch

from winpos.attention import attention
from winpos.backbones.common import Attention


@pytest.mark.parametrize("kind", ["none", "relpos", "rope", "lookhere"])
@pytest.mark.parametrize("q_stride", [1, 2])
def test_window_block_partitions_x_first_and_equals_grid_attention(kind, q_stride):
    torch.manual_seed(0)
    attn = Attention(16, 24, num_heads=2, window_size=4, q_stride=q_stride, position=kind, extent=4).double()
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.3)
    x = torch.randn(2, 8, 12, 16, dtype=torch.float64)
    x[:, 6:] = 0  # zero padding rows, as the backbones pad after norm1
    out = attn(x, valid_hw=(6, 12))
    qkv = attn.qkv(x).reshape(2, 8, 12, 3, 2, 12)
    q, k, v = qkv.unbind(3)
    if q_stride > 1:
        q = torch.nn.functional.max_pool2d(q.flatten(3).permute(0, 3, 1, 2), 2).permute(0, 2, 3, 1)
        q = q.reshape(2, 4, 6, 2, 12)
    ref = attn.proj(attention(q, k, v, window=4, pos=attn.position_terms(), backend="reference").flatten(-2))
    assert out.shape == (2, 8 // q_stride, 12 // q_stride, 24)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("family", ["vitdet", "hieradet"])
def test_patch_embedding_hands_on_a_contiguous_token_grid(family):
    """A permuted NCHW view would pass its channels-first strides to every residual add after it (elementwise ops
    keep the first operand's layout); ViTDet-B at 1024^2 spent 318 ms in add and 195 ms in gelu that way, 56
    and 71 ms with a contiguous grid."""
    if family == "vitdet":
        from winpos.backbones.vitdet import PatchEmbed

        embed, stride = PatchEmbed(16, 3, 32), 16
    else:
        from winpos.backbones.hieradet import PatchEmbed

        embed, stride = PatchEmbed(3, 32), 4
    out = embed(torch.randn(1, 3, 64, 96))
    assert out.shape == (1, 64 // stride, 96 // stride, 32) and out.is_contiguous()


@pytest.mark.parametrize("backend,expect_window", [("reference", None), ("triton", 4)])
def test_window_block_partitions_first_only_for_the_reference_backend(monkeypatch, backend, expect_window):
    """The SDPA path partitions x before the projections; the Triton kernel windows the grid in-kernel, so it gets
    the whole padded grid and the window size."""
    import winpos.backbones.common as C

    calls = []
    monkeypatch.setattr(C, "resolve_backend", lambda name, device: backend)
    monkeypatch.setattr(C, "attention", lambda q, k, v, **kw: calls.append((q.shape, kw["window"])) or q)
    attn = Attention(16, 16, num_heads=2, window_size=4)
    attn(torch.randn(1, 8, 12, 16), valid_hw=(8, 12))
    (shape, window), = calls
    assert window == expect_window
    assert shape == ((6, 4, 4, 2, 8) if backend == "reference" else (1, 8, 12, 2, 8))


# ------------------------------------------------------------------------------ presets: one builder, both families
class _Toy:
    def __init__(self, width=1, pos=None):
        self.width, self.pos = width, pos


def test_build_preset_checks_names_and_overrides_and_copies_the_tables():
    from winpos.backbones.registry import build_preset

    sizes, recipes = {"toy_s": {"width": 2}}, {"r": {"pos": {"kind": ["rope"]}}}
    model = build_preset(_Toy, "Toy", sizes, recipes, "toy_s", "r", {"width": 3})
    assert model.width == 3 and model.pos == {"kind": ["rope"]}
    model.pos["kind"].append("changed")  # the model's copy, not the table
    assert recipes["r"]["pos"] == {"kind": ["rope"]} and sizes["toy_s"] == {"width": 2}
    with pytest.raises(ValueError, match=r"unknown Toy arguments \['depth'\]; valid ones are 'recipe' .* and "
                                         r"\['pos', 'width'\]"):
        build_preset(_Toy, "Toy", sizes, recipes, "toy_s", "r", {"depth": 4})
    with pytest.raises(ValueError, match=r"\['recpie'\] \('recpie': did you mean 'recipe'\?\)"):
        build_preset(_Toy, "Toy", sizes, recipes, "toy_s", "r", {"recpie": "paper"})
    with pytest.raises(ValueError, match=r"'widht': did you mean 'width'\?"):
        build_preset(_Toy, "Toy", sizes, recipes, "toy_s", "r", {"widht": 3})
    with pytest.raises(ValueError, match="Toy size"):
        build_preset(_Toy, "Toy", sizes, recipes, "toy_m", "r")
    with pytest.raises(ValueError, match="Toy recipe"):
        build_preset(_Toy, "Toy", sizes, recipes, "toy_s", "paper")


@pytest.mark.parametrize("family", ["vitdet", "hieradet"])
def test_both_families_register_every_size_through_the_same_builder(family):
    import importlib

    from winpos.backbones import create
    from winpos.backbones.registry import PRESETS, list_presets

    mod = importlib.import_module(f"winpos.backbones.{family}")
    assert set(mod.SIZES) <= set(list_presets())
    for size in mod.SIZES:
        assert PRESETS[size].__name__ == size and PRESETS[size].__module__ == mod.__name__
    with pytest.raises(ValueError, match="unknown (ViTDet|HieraDet) arguments"):
        create(f"{family}_toy", no_such_argument=1)


@pytest.mark.parametrize("preset,recipe", [("vitdet_toy", "original"), ("vitdet_toy", "rope"),
                                           ("hieradet_toy", "paper"), ("hieradet_toy", "rope")])
def test_one_position_rule_for_no_weight_decay_and_the_optimizer(preset, recipe):
    from winpos.backbones import create
    from winpos.backbones.common import is_position_param
    from winpos.d2.optim import is_position_param as optimizer_rule

    model = create(preset, recipe)
    names = {n for n, _ in model.named_parameters()}
    expected = {n for n in names if "pos_embed" in n or "rel_pos" in n or "rope" in n}
    assert expected and model.no_weight_decay() == expected
    assert optimizer_rule is is_position_param  # the optimizer's groups use the same function
    assert not any(is_position_param(n) for n in names - expected)


@pytest.mark.parametrize("preset", ["hieradet_toy", "vitdet_toy"])
@pytest.mark.parametrize("rate", [1.0, 1.5, -0.1, float("nan"), "0.1"])
def test_a_drop_path_rate_outside_0_1_is_refused_naming_the_range(preset, rate):
    from winpos.backbones import create

    with pytest.raises(ValueError, match=r"drop_path_rate=.* must be a number in \[0, 1\)"):
        create(preset, drop_path_rate=rate)
    assert create(preset, drop_path_rate=0.99) is not None  # the edge inside the range builds
