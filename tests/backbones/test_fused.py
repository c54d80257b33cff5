"""The fused CPU inference path (``winpos.backbones.fused``) against the plain PyTorch ops it replaces (the
independent reference: ``nn.Linear``, ``nn.GELU`` and ``+``), and the backbones with it on against themselves with
it off and against sam2 bit for bit with it off."""
import pytest
import torch
import torch.nn as nn

from tests.conftest import require
from tests.helpers import randomize_
from winpos.backbones import create, fused
from winpos.backbones.fused import fused_enabled, fused_linear, linear_add, linear_gelu, residual_add


@pytest.fixture
def mlp():
    torch.manual_seed(0)
    return nn.Linear(24, 96), nn.GELU(), nn.Linear(96, 24)


def test_onednn_fused_linear_is_available_here():
    # The CPU wheels this project installs ship oneDNN; without it every fused test below would only test fallbacks.
    assert fused._AVAILABLE, "torch.ops.mkldnn._linear_pointwise is missing: this torch build has no oneDNN"


def test_fused_steps_equal_the_plain_ops(mlp):
    fc1, act, fc2 = mlp
    x, res = torch.randn(2, 5, 7, 24), torch.randn(2, 5, 7, 24)
    with torch.no_grad():
        assert fused_enabled(x, fc1)
        h = linear_gelu(x, fc1, act)
        torch.testing.assert_close(h, act(fc1(x)), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(linear_add(h, fc2, res), res + fc2(h), rtol=1e-6, atol=1e-6)


def test_fused_path_is_taken_only_without_gradients_or_autocast(mlp, monkeypatch):
    fc1, act, _ = mlp
    x = torch.randn(3, 24)
    calls = []
    op = torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(fused, "_fused_op", lambda: (calls.append(1), op)[1])
    with torch.no_grad():
        linear_gelu(x, fc1, act)
    assert len(calls) == 1
    out = linear_gelu(x, fc1, act)  # gradients recorded for the weights: plain ops, differentiable
    out.sum().backward()
    assert fc1.weight.grad is not None and len(calls) == 1
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert linear_gelu(x, fc1, act).dtype == torch.bfloat16 and len(calls) == 1
    with torch.no_grad(), fused_linear(False):
        linear_gelu(x, fc1, act)
    assert len(calls) == 1
    with torch.no_grad():
        linear_gelu(x.double(), fc1.double(), act)  # fp64: oneDNN has no fp64 linear
    assert len(calls) == 1
    tanh = nn.GELU(approximate="tanh")
    with torch.no_grad():
        torch.testing.assert_close(linear_gelu(x.double(), fc1, tanh), tanh(fc1(x.double())))
    assert len(calls) == 1


def test_residual_add_never_writes_the_shortcut():
    shortcut, branch = torch.randn(2, 4, 4, 8), torch.randn(2, 4, 4, 8)
    keep, expected = shortcut.clone(), shortcut + branch
    with torch.no_grad():
        out = residual_add(shortcut, branch)
    assert torch.equal(out, expected) and torch.equal(shortcut, keep)
    assert out.data_ptr() == branch.data_ptr()  # accumulated in place into the fresh branch
    crop = torch.randn(2, 5, 5, 8)[:, :4, :4]  # a cropped attention output: not contiguous, out of place
    with torch.no_grad():
        assert torch.equal(residual_add(shortcut, crop), shortcut + crop)
    branch = torch.randn(2, 4, 4, 8, requires_grad=True)
    out = residual_add(shortcut, branch)
    out.sum().backward()
    assert torch.equal(branch.grad, torch.ones_like(branch))


@pytest.mark.parametrize("preset,recipe", [("hieradet_toy", "original"), ("hieradet_toy", "lookhere"),
                                           ("vitdet_toy", "original"), ("vitdet_toy", "rope")])
def test_backbones_fused_equal_unfused(preset, recipe):
    torch.manual_seed(0)
    net = randomize_(create(preset, recipe=recipe, img_size=128)).eval()
    x = torch.randn(2, 3, 128, 96)
    with torch.no_grad():
        got = net(x)
        with fused_linear(False):
            expected = net(x)
    got, expected = (got, expected) if isinstance(got, (list, tuple)) else ([got], [expected])
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5 * e.abs().max().item())


def test_hieradet_unfused_is_bit_exact_to_sam2():
    hieradet = require("sam2.modeling.backbones.hieradet")
    from winpos.backbones.hieradet import HieraDet
    from winpos.checkpoints.hiera import load_hiera_checkpoint

    torch.manual_seed(0)
    ref = hieradet.Hiera(embed_dim=16, num_heads=1, stages=(1, 1, 2, 1), global_att_blocks=(3,),
                         window_spec=(8, 4, 14, 7), window_pos_embed_bkg_spatial_size=(7, 7)).eval()
    randomize_(ref)
    ours = HieraDet(embed_dim=16, num_heads=1, stages=(1, 1, 2, 1), global_blocks=(3,), window_spec=(8, 4, 14, 7),
                    pos_global_size=7, img_size=512).eval()
    load_hiera_checkpoint(ours, ref.state_dict())
    x = torch.randn(1, 3, 512, 512)
    with torch.no_grad(), fused_linear(False):
        for a, b in zip(ref(x), ours(x)):
            assert torch.equal(a, b)
