"""Values checked where they are used: LookHere slopes in float32 (the dtype of the bias), the authors' LookHere
files (slopes and weights), and what the flex backend cannot do, each refused in one line before torch runs."""
import pytest
import torch

from tests.checkpoints.test_lookhere_import import SMALL, official_weights
from winpos.errors import WinposError

CONFIG = {"global_slope": 2, "layer_slopes": [1.5, 0.5], "head_directions": "corners-triangles-none"}


def _lookhere_net(global_slope):
    from winpos.backbones import create

    lh = {"variant": "45", "layout": "spread", "global_slope": global_slope, "slope_units": "official"}
    pos = {"kind": "lookhere", "lookhere": lh}
    return create("vitdet_toy", recipe="lookhere", img_size=64, window_pos=pos, global_pos=pos).eval()


def test_lookhere_slope_finite_in_float64_but_not_in_float32_is_refused():
    with pytest.raises(WinposError, match=r"global_slope=1e\+39 gives head slopes up to .* beyond float32"):
        _lookhere_net(1e39)  # before: slopes inf, every output value NaN
    net = _lookhere_net(1e30)  # large but representable: finite outputs
    with torch.no_grad():
        assert torch.isfinite(net(torch.randn(1, 3, 64, 64))).all()


def test_set_global_slope_is_checked_in_float32_too():
    from winpos.posemb.lookhere import LookHere

    lh = LookHere(12, layer_index=0, num_layers=4, global_slope=2.0, slope_units="official")
    before = lh.slopes.clone()
    with pytest.raises(WinposError, match="beyond float32"):
        lh.set_global_slope(1e39)
    assert torch.equal(lh.slopes, before) and lh.global_slope == 2.0  # unchanged by the refused call


def test_lookhere_file_with_a_float32_overflowing_slope_is_refused():
    from winpos.checkpoints import load_external

    obj = {"weights": official_weights(dim=96, depth=4, classes=10), "config": dict(CONFIG, global_slope=1e39)}
    with pytest.raises(WinposError, match=r"config has global_slope=1e\+39, which overflows float32"):
        load_external(obj, "vitdet_b", recipe="lookhere", **SMALL)


@pytest.mark.parametrize("weights", [{}, {"blocks.0.attn.qkv.weight": [[1.0]], "x": "abc"}])
def test_lookhere_file_whose_weights_hold_no_tensors_says_so(weights):
    from winpos.checkpoints import load_external

    with pytest.raises(WinposError, match=r"'weights' holds no tensors"):  # before: blamed the target's depth
        load_external({"weights": weights, "config": dict(CONFIG)}, "vitdet_b", recipe="lookhere", **SMALL)


def _qkv(dtype=torch.float32, grad=False):
    return [torch.randn(1, 8, 8, 2, 16, dtype=dtype, requires_grad=grad) for _ in range(3)]


def test_flex_refuses_float64_in_one_line_before_torch():
    from winpos.attention import attention

    with pytest.raises(WinposError, match=r"backend='flex' takes float32, float16 or bfloat16 q/k/v, got "
                                          r"torch.float64"):
        with torch.no_grad():
            attention(*_qkv(torch.float64), window=4, backend="flex")


def test_flex_on_cpu_refuses_trainable_relpos_tables():
    from winpos.attention import PositionTerms, attention

    tables = (torch.zeros(7, 16, requires_grad=True), torch.zeros(7, 16, requires_grad=True))
    with pytest.raises(WinposError, match="inference only.*the relpos tables need gradients"):
        attention(*_qkv(), window=4, pos=PositionTerms(rel_pos=tables), backend="flex")
