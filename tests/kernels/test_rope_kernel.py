"""Standalone grid RoPE (Triton kernel and the PyTorch grid version) vs ``winpos.posemb.rope.apply_rope`` applied
to partitioned windows (the reference layout), forward and backward; the backward kernel is the inverse rotation."""
import pytest
import torch

from tests.kernels.helpers import DEVICE, TOL
from winpos.kernels import rope_grid, rotate_on_grid
from winpos.posemb.rope import RoPE, apply_rope
from winpos.windows import window_partition, window_unpartition


def _reference(x, cos, sin, rot_dims, pairing, window):
    """apply_rope on (groups, heads, N, D) windows, mapped back to the grid."""
    H, W = x.shape[1:3]
    if window is None:
        groups = x.flatten(1, 2)
    else:
        groups = window_partition(x, window)
    out = apply_rope(groups.transpose(1, 2), cos, sin, rot_dims, pairing).transpose(1, 2)
    if window is None:
        return out.reshape(x.shape)
    return window_unpartition(out, window, (H, W))


CASES = [
    # (grid, heads, head_dim, window, RoPE kwargs, dtype)
    ((14, 7), 3, 32, 7, dict(kind="mixed", shared_heads=False, pairing="interleaved", fraction=1.0), torch.float32),
    ((6, 8), 2, 80, None, dict(pairing="half", fraction=0.5), torch.float16),
    ((8, 16), 1, 64, 8, dict(pairing="interleaved", fraction=0.25), torch.float32),
    # the RoPE-pretrained families' conventions (winpos.backbones.rope_vits): DINOv3, EVA-02, RoPE-ViT axial
    ((14, 21), 2, 64, 7, dict(base=100.0, pairing="half", fraction=1.0, coords="centered"), torch.float32),
    ((12, 12), 2, 32, None, dict(base=1e4, pairing="interleaved", fraction=1.0, coords="normalized", ref_hw=(16, 16)),
     torch.float32),
    ((7, 14), 3, 64, 7, dict(base=100.0, pairing="interleaved", axis_order="xy", fraction=1.0), torch.float16),
]


@pytest.mark.parametrize("grid,heads,head_dim,window,kwargs,dtype", CASES)
def test_rope_kernel_matches_apply_rope(grid, heads, head_dim, window, kwargs, dtype, device):
    rope = RoPE(head_dim, heads, **kwargs).to(device)
    win = (window, window) if window else grid
    t = rope.tables(win, win)
    cos, sin = t.cos_k.detach(), t.sin_k.detach()
    x = torch.randn(2, *grid, heads, head_dim, device=device).to(dtype).requires_grad_()
    y = rope_grid(x, cos, sin, t.rot_dims, t.pairing, win)
    x_ref = x.detach().double().requires_grad_()
    y_ref = _reference(x_ref, cos, sin, t.rot_dims, t.pairing, window)
    torch.testing.assert_close(y.double(), y_ref, atol=TOL[dtype], rtol=TOL[dtype])
    g = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, x, g)
    (dx_ref,) = torch.autograd.grad(y_ref, x_ref, g.double())
    torch.testing.assert_close(dx.double(), dx_ref, atol=TOL[dtype], rtol=TOL[dtype])
    # The PyTorch grid path used for learnable tables (winpos.posemb.rope's rotate_grid) agrees too.
    torch.testing.assert_close(rotate_on_grid(x, cos, sin, t.rot_dims, t.pairing, win).double(), y_ref,
                               atol=TOL[dtype], rtol=TOL[dtype])


def test_conjugate_kernel_inverts_the_rotation(device):
    """R(-theta) R(theta) x = x: the op the backward uses is the exact transpose of the forward rotation."""
    rope = RoPE(48, 2, kind="mixed", shared_heads=False, fraction=1.0).to(device)
    t = rope.tables((4, 6), (4, 6))
    cos, sin = t.cos_k.detach(), t.sin_k.detach()
    x = torch.randn(1, 8, 12, 2, 48, device=device)
    y = torch.ops.winpos.rope_grid(x, cos, sin, t.rot_dims, True, 4, 6, False)
    assert (y - x).abs().max() > 0.1  # it did rotate
    back = torch.ops.winpos.rope_grid(y, cos, sin, t.rot_dims, True, 4, 6, True)
    torch.testing.assert_close(back, x, atol=1e-5, rtol=1e-5)


def test_learnable_tables_take_the_differentiable_path(device):
    """Tables that require grad are rotated by the PyTorch grid op; frequency gradients match apply_rope's."""
    rope = RoPE(32, 2, kind="mixed", shared_heads=False).to(device)
    x = torch.randn(1, 8, 8, 2, 32, device=device)
    t = rope.tables((4, 4), (4, 4))
    y = rope_grid(x, t.cos_k, t.sin_k, t.rot_dims, t.pairing, (4, 4))
    (g_ours,) = torch.autograd.grad(y.square().sum(), rope.freqs)
    t = rope.tables((4, 4), (4, 4))
    y_ref = _reference(x, t.cos_k, t.sin_k, t.rot_dims, t.pairing, 4)
    (g_ref,) = torch.autograd.grad(y_ref.square().sum(), rope.freqs)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(g_ours, g_ref, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="no gradient for the tables"):
        rope_grid(x, t.cos_k, t.sin_k, t.rot_dims, t.pairing, (4, 4), backend="triton")


def test_rope_grid_rejects_bad_tables(device):
    rope = RoPE(32, 2).to(device)
    t = rope.tables((4, 4), (4, 4))
    x = torch.randn(1, 8, 8, 2, 32, device=device)
    with pytest.raises(ValueError, match="do not fit"):
        rope_grid(x, t.cos_k, t.sin_k, t.rot_dims, t.pairing, (8, 8))
    with pytest.raises(ValueError, match="does not tile"):
        rope_grid(x, t.cos_k, t.sin_k, t.rot_dims, t.pairing, (3, 3))
    with pytest.raises(ValueError, match="pairing"):
        rope_grid(x, t.cos_k, t.sin_k, t.rot_dims, "spiral", (4, 4))


def test_device_constant_matches_fixture(device):
    assert DEVICE == device
