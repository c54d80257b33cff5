"""The dtype matrix: every backbone family x recipe under bf16 and fp16 autocast against float32, forward and
backward, at a size other than the pretraining grid (so every position term is resized or re-tiled).

What must hold for mixed-precision training to be safe:
- outputs and every parameter gradient are finite and close to float32's, with an error that scales with the
  dtype's rounding (fp16 keeps 3 more mantissa bits than bf16, so its error is the smaller one);
- parameters and their gradients stay float32 (autocast casts per op; nothing is stored in low precision);
- the position terms are computed from float32 parameters: abs / abs-win resizing runs in float32 even under
  autocast (bicubic resize is not implemented for bf16 on every device, and rounds badly where it is), so the
  embedding added to the tokens is the float32 one rounded once;
- the patch embedding's convolution runs in float32: in bf16 it made the LookHere HieraDet's gradients 6x worse
  than any other case (9.5e-2 against 1.6e-2; neither its attention nor its bias was the cause).
"""
import pytest
import torch

from tests.helpers import randomize
from winpos.backbones import create
from winpos.backbones.hieradet import RECIPES as HIERA_RECIPES
from winpos.backbones.vitdet import RECIPES as VIT_RECIPES

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# (preset, recipe, constructor overrides, input size): small models, inputs off the pretraining grid
CASES = [("vitdet_toy", r, dict(img_size=128, embed_dim=32, num_heads=2, depth=2, global_blocks=(1,)), (1, 3, 160, 192))
         for r in VIT_RECIPES] + \
        [("hieradet_toy", r, dict(embed_dim=16, num_heads=1, stages=(1, 1, 2, 1), global_blocks=(3,),
                                  window_spec=(4, 4, 2, 2), pos_global_size=7), (1, 3, 128, 160))
         for r in HIERA_RECIPES] + \
        [(preset, "original", dict(img_size=128, embed_dim=32, num_heads=2, depth=2, global_blocks=(1,)),
          (1, 3, 160, 192)) for preset in ("vitdet_eva02_t", "vitdet_dinov3_t", "vitdet_ropevit_s")] + \
        [("vitdet_sam3_toy", "original", dict(img_size=140, embed_dim=32, num_heads=2, depth=2, global_blocks=(1,)),
          (1, 3, 168, 196))]  # RoPE-era layouts: their pretrained RoPE conventions, EVA-02's abs embedding too
# relative L2 error bound per dtype: a few units of its rounding (bf16 2^-8, fp16 2^-11) times the depth's growth
BOUND = {"bf16": 4e-2, "fp16": 6e-3}
# all gradients together: measured up to 1.6e-2 (bf16) and 1.3e-2 (fp16). With the patch embedding's convolution
# in bf16 (before winpos.backbones.common.patch_projection kept it float32) the LookHere HieraDet read 9.5e-2: this
# bound fails then.
GRAD_WHOLE = {"bf16": 4e-2, "fp16": 3e-2}
GRAD_BOUND = {"bf16": 0.2, "fp16": 0.12}  # one parameter's gradient (see the test)


def _model(preset, recipe, overrides):
    torch.manual_seed(0)
    return randomize(create(preset, recipe=recipe, **overrides)).train()


def _flat(out):
    return torch.cat([o.float().flatten() for o in (out if isinstance(out, (list, tuple)) else [out])])


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _forward_backward(model, x, dtype=None):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(3)  # the same drop-path draws in every pass (the EVA-02 preset trains with drop path 0.1)
    with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        out = _flat(model(x))
    weights = torch.linspace(-1, 1, out.numel())  # a loss that weighs every output differently
    (out.float() * weights).sum().backward()
    return out.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("preset,recipe,overrides,shape", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_autocast_forward_backward_close_to_fp32(preset, recipe, overrides, shape, dtype):
    model = _model(preset, recipe, overrides)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    ref_out, ref_grads = _forward_backward(model, x)
    out, grads = _forward_backward(model, x, DTYPES[dtype])
    assert out.dtype in (DTYPES[dtype], torch.float32)
    assert torch.isfinite(out).all()
    err = _rel(out, ref_out)
    print(f"{preset} {recipe} {dtype}: output relative L2 error {err:.2e}")
    assert err < BOUND[dtype], err
    assert grads.keys() == ref_grads.keys() and len(grads) == len(list(model.parameters()))
    for n, g in grads.items():
        assert g.dtype == torch.float32, n  # parameters and their gradients stay float32
        assert torch.isfinite(g).all(), n
    names = sorted(grads)
    whole = _rel(torch.cat([grads[n].flatten() for n in names]), torch.cat([ref_grads[n].flatten() for n in names]))
    worst = max((_rel(grads[n], ref_grads[n]), n) for n in names if ref_grads[n].norm() > 0)
    print(f"{preset} {recipe} {dtype}: gradient relative L2 error {whole:.2e}, worst parameter {worst[0]:.2e} "
          f"({worst[1]})")
    assert whole < GRAD_WHOLE[dtype], whole
    # One parameter's gradient is a sum over every token (the patch embedding's over 1280 positions of the first
    # HieraDet stage), so its relative error grows with the tokens: measured up to 8.0e-2 in bf16 and 4.9e-2 in
    # fp16 here. A dropped, doubled or sign-flipped gradient would read 1 or more.
    assert worst[0] < GRAD_BOUND[dtype], worst
    assert all(p.dtype == torch.float32 for p in model.parameters())


@pytest.mark.parametrize("preset,recipe,overrides,shape", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_fp16_error_below_bf16_error(preset, recipe, overrides, shape):
    """fp16's 10-bit mantissa against bf16's 7: a term computed in the wrong dtype (or a resize that rounds in low
    precision) would make the two errors alike."""
    model = _model(preset, recipe, overrides).eval()
    x = torch.randn(shape, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = _flat(model(x))
        errs = {}
        for name, dtype in DTYPES.items():
            with torch.autocast("cpu", dtype=dtype):
                errs[name] = _rel(_flat(model(x)), ref)
    assert errs["fp16"] < errs["bf16"] / 2, errs


WITH_EMBEDDING = [c for c in CASES if _model(*c[:3]).pos_embed is not None]


@pytest.mark.parametrize("preset,recipe,overrides,shape", WITH_EMBEDDING, ids=[f"{c[0]}-{c[1]}" for c in WITH_EMBEDDING])
def test_position_embedding_resized_in_fp32_under_autocast(preset, recipe, overrides, shape):
    """The embedding the tokens receive under bf16 autocast is the float32 one (resized or tiled in float32)."""
    model = _model(preset, recipe, overrides).eval()
    pos = model.pos_embed
    stride = model.patch_embed.proj.stride[0]
    grid = (shape[2] // stride, shape[3] // stride)
    with torch.no_grad():
        ref = pos(grid)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = pos(grid)
    assert ref.dtype == torch.float32
    assert low.dtype == torch.float32, low.dtype
    torch.testing.assert_close(low, ref, rtol=0, atol=0)


@pytest.mark.parametrize("preset,recipe,overrides,shape", [CASES[0], CASES[4]], ids=["vitdet", "hieradet"])
def test_patch_embedding_runs_in_fp32_under_autocast(preset, recipe, overrides, shape):
    """The stem convolution is float32 under autocast (winpos.backbones.common.patch_projection), and exactly the
    float32 stem: the tokens it makes are bit-identical with and without autocast."""
    model = _model(preset, recipe, overrides).eval()
    x = torch.randn(shape, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = model.patch_embed(x)
        for dtype in DTYPES.values():
            with torch.autocast("cpu", dtype=dtype):
                low = model.patch_embed(x)
            assert low.dtype == torch.float32
            torch.testing.assert_close(low, ref, rtol=0, atol=0)
