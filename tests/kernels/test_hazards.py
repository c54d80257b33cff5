"""The GPU-only hazards a review of the kernels found, each checked where the CPU can see it: the device guard
around every launch, LookHere's tile classes kept out of compiled graphs, the relpos terms' alignment and int32
extent, sin / cos strides, and no silent double backward. (Shared memory per kernel: ``test_aot_compile.py`` and
``test_kernel_api.py``.)"""
import contextlib
from types import SimpleNamespace

import pytest
import torch

from tests.kernels.helpers import DEVICE
from winpos.attention import PositionTerms
from winpos.kernels import _jit, rope_grid, window_attention
from winpos.kernels import attention_fwd_bwd as F
from winpos.kernels import dispatch
from winpos.posemb.lookhere import LookHere
from winpos.posemb.relpos import RelPosTables

F16 = torch.float16


def _qkv(H=8, W=8, heads=2, D=32, dtype=torch.float32, grad=True):
    q, k, v = (torch.randn(1, H, W, heads, D, device=DEVICE, dtype=dtype).requires_grad_(grad) for _ in range(3))
    return q, k, v


def test_every_launch_runs_under_a_device_guard_for_its_tensors(monkeypatch, device):
    """Triton launches on the current CUDA device: the three attention kernels and the RoPE kernel each launch
    inside ``_jit.on_device`` of their input (tensors on cuda:1 while cuda:0 is current would fault)."""
    guarded, launches = [], []
    real_launch = _jit.launch

    @contextlib.contextmanager
    def guard(t):
        guarded.append(t.device)
        yield

    def launch(kernel, grid, **kwargs):
        launches.append((kernel.__name__, len(guarded)))
        assert guarded, f"{kernel.__name__} launched outside a device guard"
        return real_launch(kernel, grid, **kwargs)

    monkeypatch.setattr(_jit, "on_device", guard)
    monkeypatch.setattr(_jit, "launch", launch)
    q, k, v = _qkv()
    window_attention(q, k, v, window=4).sum().backward()
    cos = torch.rand(16, 8, device=DEVICE)
    x = torch.randn(1, 8, 8, 2, 32, device=DEVICE, requires_grad=True)
    rope_grid(x, cos, cos, 16, "half", (4, 4)).sum().backward()
    assert [name for name, _ in launches] == ["attn_fwd", "attn_bwd_dq", "attn_bwd_dkdv", "rope_grid_kernel",
                                              "rope_grid_kernel"]
    assert {d.type for d in guarded} == {DEVICE}  # each launch guarded by its own tensor's device


def test_the_device_guard_selects_the_tensors_cuda_device():
    on_cuda1 = SimpleNamespace(device=torch.device("cuda", 1))
    guard = _jit.on_device(on_cuda1)
    assert isinstance(guard, torch.cuda.device) and guard.idx == 1  # entered only at launch, on a GPU
    assert isinstance(_jit.on_device(torch.zeros(1)), contextlib.nullcontext)


def test_lookhere_tile_classes_are_never_traced_by_torch_compile(monkeypatch, device):
    """The tile classes take a ``nonzero`` (a host sync) and ``winpos.cache`` does not cache while compiling: they
    must be built eagerly, once per grid, also inside a compiled model (not in every compiled forward)."""
    import winpos.posemb.lookhere as lookhere_module

    real = lookhere_module.fov_tile_classes
    calls = []

    def counted(*args, **kwargs):
        calls.append(torch.compiler.is_compiling())
        return real(*args, **kwargs)

    monkeypatch.setattr(lookhere_module, "fov_tile_classes", counted)
    torch._dynamo.reset()
    lh = LookHere(2, "45", layer_index=1, num_layers=4).to(DEVICE)
    pos = PositionTerms(lookhere=lh)
    q, k, v = _qkv(grad=False)
    fn = torch.compile(lambda q, k, v: window_attention(q, k, v, window=4, pos=pos), backend="eager")
    first, second = fn(q, k, v), fn(q, k, v)
    torch.testing.assert_close(first, second)
    assert calls == [False], f"tile classes built {len(calls)} times, traced: {calls}"
    torch._dynamo.reset()


def test_16_bit_relpos_terms_at_an_odd_element_are_refused(monkeypatch, device):
    """The kernels read 16-bit ``rel_h`` columns as 4-byte words: a view at an odd element offset would fault on a
    GPU (the interpreter reads it happily), so the launch refuses it with the fix."""
    real = dispatch._rel_inputs

    def misaligned(*args):
        rel = real(*args)
        buf = rel.new_empty(rel.numel() + 1)
        buf[1:] = rel.flatten()
        return buf[1:].view(rel.shape)

    monkeypatch.setattr(dispatch, "_rel_inputs", misaligned)
    q, k, v = _qkv(dtype=F16)
    rel_pos = tuple(t.to(DEVICE) for t in RelPosTables(32, 4).tables())
    with pytest.raises(ValueError, match="not a multiple of 4"):
        window_attention(q, k, v, window=4, pos=PositionTerms(rel_pos=rel_pos))


def _plan(grid, rot=0):
    H, W = grid
    return F.Plan(1, 1, H, W, H, W, 1, H, W, H, W, 0, rot, 1, 64, 64, 1)


def test_relpos_terms_beyond_int32_offsets_are_refused():
    """The relpos terms (and their gradient, laid out alike) are addressed with int32 offsets inside a window,
    like q, k and v: a 400x400 global grid of 16 heads with 512 + 512 columns spans 2.6e9 elements. Meta tensors:
    only shapes and strides are read."""
    grid, heads = (400, 400), 16
    q = k = v = torch.empty(1, *grid, heads, 64, device="meta", dtype=F16)
    lse = torch.empty(1, *grid, heads, device="meta")
    rel = torch.empty(1, *grid, heads, 1024, device="meta")
    with pytest.raises(ValueError, match="relpos terms .* spans"):
        F._kernel_args(q, k, v, lse, None, None, None, None, rel, None, None, None, _plan(grid), 0.125)
    small = torch.empty(1, 100, 100, heads, 256, device="meta")  # 128 + 128 columns, 4.1e7 elements: accepted
    q1 = q[:, :100, :100]
    F._kernel_args(q1, q1, q1, lse[:, :100, :100], None, None, None, None, small, None, None, None,
                   _plan((100, 100)), 0.125)


def test_sin_tables_with_other_strides_than_cos_are_refused():
    """The kernels read sin with cos's strides: a per-head cos with a broadcast (head stride 0) sin is refused."""
    q = torch.zeros(1, 4, 4, 2, 32)
    lse = torch.zeros(1, 4, 4, 2)
    cos = torch.rand(2, 16, 8)
    sin = torch.rand(1, 16, 8).expand(2, 16, 8)
    with pytest.raises(ValueError, match="sin_q .* must have cos_q's shape and strides"):
        F._kernel_args(q, q, q, lse, cos, sin, cos, cos, None, None, None, None, _plan((4, 4), rot=16), 0.125)
    F._kernel_args(q, q, q, lse, cos, cos.clone(), cos, cos, None, None, None, None, _plan((4, 4), rot=16), 0.125)


@pytest.mark.parametrize("op", ["attention", "rope"])
def test_double_backward_raises_instead_of_dropping_terms(op, device):
    """The backward kernels have no derivative: differentiating a gradient through them raises (it used to return
    gradients without the second-order terms, silently)."""
    x = torch.randn(1, 8, 8, 2, 32, device=DEVICE, requires_grad=True)
    if op == "attention":
        out = window_attention(x, x * 1.5, x * 0.5, window=4)
    else:
        cos = torch.rand(16, 8, device=DEVICE)
        out = rope_grid(x, cos, cos, 16, "half", (4, 4))
    (g,) = torch.autograd.grad((out * out).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        (g * x).sum().backward()


def test_tuned_options_over_sm90_shared_memory_are_refused_and_not_swept(monkeypatch):
    """227 KB per program on sm_90: ``set_tuned`` refuses options whose ``shared_estimate`` exceeds it (they would
    fail only at launch, OutOfResources), and the sweep lists them as refused instead of timing them."""
    from winpos.bench.kernel_common import Shape
    from winpos.bench.kernel_sweep import sweep_shape
    from winpos.kernels import launch_config as A

    big = ("bwd", 128, 64, 128, ("rope",))
    assert A.shared_estimate(big, 3) > A.SHARED_LIMIT >= A.shared_estimate(big, 1)
    with pytest.raises(ValueError, match="shared memory, over the 232448"):
        A.set_tuned({big: {"num_warps": 8, "num_stages": 3}})
    A.set_tuned({big: {"num_warps": 8, "num_stages": 1}})
    A.set_tuned({})
    monkeypatch.setattr(A, "SHARED_LIMIT", 0)  # every configuration over the limit: nothing may run
    result = sweep_shape(Shape("t", "w4", 1, (8, 8), 2, 32, 4), "none", torch.float32, torch.device(DEVICE), 1,
                         deadline=float("inf"))
    assert result["trials"] == [] and result["refused"] and all(r["shared_estimate"] > 0 for r in result["refused"])
