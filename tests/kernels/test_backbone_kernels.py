"""Whole backbones through the fused kernels against the same models on the PyTorch reference: every attention of a
tiny four-stage HieraDet (8x8 windows, pooled stage transitions, 4x4 windows that share programs, a padded grid,
a global block) and of a tiny ViTDet (7x7 windows on a padded grid, a global block), with each block term: forward
output and the gradients of the input and of every parameter.

The kernel tests check one attention call at a time; this checks how the backbone calls them (qkv views, pooled
queries, padding, the kernels' own windowing instead of the reference's partition of x), in fp32: each tensor
within 1e-5 of its largest value (parameter gradients reach 1e3 here; fp32 reordering gives up to 4e-6 of it, a
wrong window or mask gives errors of order one).
"""
import pytest
import torch

from tests.helpers import randomize_
from winpos.backbones import create
from winpos.backbones.hieradet import HieraDet
from winpos.backbones.vitdet import ViTDet


def _tiny(term: str) -> HieraDet:
    # embed 32, two heads of 16 throughout; at 136x120 the stage grids are 34x30 (padded to 40x32 for 8x8
    # windows), 17x15 (4x4 windows: padded to 20x16, 20 windows, packed four per program), 9x8 with a global block
    # and 5x4 (2x2 windows): every path of the kernels' dispatch at least once.
    torch.manual_seed(0)
    model = HieraDet(img_size=(136, 120), embed_dim=32, num_heads=2, stages=(1, 2, 2, 1), head_mul=2.0,
                     window_spec=(8, 4, 4, 2), global_blocks=(4,), pos_embed="abswin", pos_global_size=7,
                     window_pos=term, global_pos=term, pad_mode="mask")
    return randomize_(model).eval()


def _close(got, want, what):
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * want.abs().max().item(), msg=lambda m: f"{what}: {m}")


def _tiny_vitdet(term: str) -> ViTDet:
    # 17x15 patches, 7x7 windows on the grid padded to 21x21 (masked), one global block
    torch.manual_seed(0)
    model = ViTDet(img_size=(272, 240), embed_dim=32, depth=3, num_heads=2, window_size=7, global_blocks=(1,),
                   pos_embed="abswin", pos_global_size=7, window_pos=term, global_pos=term, pad_mode="mask")
    return randomize_(model).eval()


def _features(out) -> list:
    return list(out.values()) if isinstance(out, dict) else list(out) if isinstance(out, (list, tuple)) else [out]


@pytest.mark.parametrize("family", ["hieradet", "vitdet"])
@pytest.mark.parametrize("term", ["none", "rope", "relpos", "lookhere"])
def test_backbone_on_the_kernels_matches_the_reference(family, term, device, monkeypatch):
    model = (_tiny(term) if family == "hieradet" else _tiny_vitdet(term)).to(device)
    x = torch.randn(1, 3, *((136, 120) if family == "hieradet" else (272, 240)), device=device)
    _backends_agree(model, x, 4 if family == "hieradet" else 1, device, monkeypatch)


# the RoPE-pretrained families' presets (their RoPE conventions, SwiGLU, LayerScale, masked key bias) at the tiny
# ViTDet's size
ROPE_FAMILIES = [("vitdet_dinov3_s", "original"), ("vitdet_eva02_t", "original"), ("vitdet_ropevit_s", "mixed")]


@pytest.mark.parametrize("preset,recipe", ROPE_FAMILIES)
def test_rope_family_presets_on_the_kernels_match_the_reference(preset, recipe, device, monkeypatch):
    torch.manual_seed(0)
    model = create(preset, recipe=recipe, img_size=(272, 240), embed_dim=32, depth=3, num_heads=2, window_size=7,
                   global_blocks=(1,), pad_mode="mask", qkv_bias=True)
    _backends_agree(randomize_(model).eval().to(device), torch.randn(1, 3, 272, 240, device=device), 1, device,
                    monkeypatch)


def _backends_agree(model, x, n_features, device, monkeypatch):
    """Features, the image's gradient and every parameter's gradient on the Triton kernels equal the reference's."""
    runs = {}
    for backend in ("reference", "triton"):
        monkeypatch.setenv("WINPOS_ATTENTION_BACKEND", backend)
        model.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_()
        feats = _features(model(xi))
        loss = sum((f * torch.linspace(-1, 1, f.numel(), device=device).reshape(f.shape)).sum()
                   for f in feats)
        loss.backward()
        runs[backend] = ([f.detach() for f in feats], xi.grad,
                         {n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    (f_ref, gx_ref, gp_ref), (f_tri, gx_tri, gp_tri) = runs["reference"], runs["triton"]
    assert len(f_ref) == len(f_tri) == n_features
    for i, (a, b) in enumerate(zip(f_tri, f_ref)):
        _close(a, b, f"stage {i + 1} features")
    _close(gx_tri, gx_ref, "grad of the image")
    assert gp_ref.keys() == gp_tri.keys() and len(gp_ref) > 20
    for name in gp_ref:
        _close(gp_tri[name], gp_ref[name], f"grad of {name}")


def test_the_tiny_model_reaches_every_kernel_path(device, monkeypatch):
    """The comparison above covers what it claims: window, pooled, packed, padded and global launches."""
    from winpos.kernels import _jit

    seen = set()
    launch = _jit.launch

    def record(kernel, grid, **kw):
        seen.add((kw["PACK"] > 1, kw["POOL"] > 1, bool(kw["PAD_MASK"]), kw["n_win"] == 1))
        return launch(kernel, grid, **kw)

    monkeypatch.setattr(_jit, "launch", record)
    monkeypatch.setenv("WINPOS_ATTENTION_BACKEND", "triton")
    model = _tiny("lookhere").to(device)
    with torch.no_grad():
        model(torch.randn(1, 3, 136, 120, device=device))
    assert any(pack for pack, *_ in seen), seen
    assert any(pool for _, pool, *_ in seen), seen
    assert any(pad for _, _, pad, _ in seen), seen
    assert any(whole_grid for *_, whole_grid in seen), seen
