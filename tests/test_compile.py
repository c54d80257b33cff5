"""torch.compile: every backbone preset family and recipe traces as one graph (``fullgraph=True``: no break from
the embedding caches, the reference's mask workspace or the backend choice), gives the eager outputs within fp32
tolerance, and is not recompiled by a second call of the same shape.

Compiled with ``aot_eager`` (dynamo and AOT autograd trace everything inductor would compile, without code
generation), on the CPU-sized ``_toy`` presets at small inputs; a compile-counting backend counts the graphs."""
import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from tests.helpers import randomize_
from winpos.backbones import create

RECIPES = ("original", "paper", "rope", "lookhere")
INPUT = {"vitdet_toy": 128, "hieradet_toy": 128}  # px: 8x8 tokens (ViTDet, one padded 14-token window), 32x32 (Hiera)


def _model(preset, recipe):
    torch.manual_seed(0)
    return randomize_(create(preset, recipe, img_size=INPUT[preset]), std=0.05).eval()


def _flat(out):
    return list(out) if isinstance(out, (list, tuple)) else [out]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("preset", ["vitdet_toy", "hieradet_toy"])
def test_inference_compiles_as_one_graph_and_equals_eager(preset, recipe):
    model = _model(preset, recipe)
    x = torch.randn(1, 3, INPUT[preset], INPUT[preset], generator=torch.Generator().manual_seed(1))
    cnt = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, fullgraph=True, backend=cnt)
    with torch.no_grad():
        eager = _flat(model(x))
        first = _flat(compiled(x))
        second = _flat(compiled(x + 0.5))  # new values, same shape
        eager2 = _flat(model(x + 0.5))
    assert cnt.frame_count == 1, f"{cnt.frame_count} graphs: the forward broke or was recompiled"
    for a, b in zip(first + second, eager + eager2):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("preset,recipe", [("vitdet_toy", "original"), ("vitdet_toy", "lookhere"),
                                           ("hieradet_toy", "paper"), ("hieradet_toy", "rope")])
def test_training_step_compiles_as_one_graph_with_eager_gradients(preset, recipe):
    model = _model(preset, recipe).train()
    x = torch.randn(2, 3, INPUT[preset], INPUT[preset], generator=torch.Generator().manual_seed(2))
    cnt = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, fullgraph=True, backend=cnt)
    grads = []
    for fn in (model, compiled, compiled):
        model.zero_grad()
        sum(o.square().mean() for o in _flat(fn(x))).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert cnt.frame_count == 1, f"{cnt.frame_count} graphs: the training forward broke or was recompiled"
    assert any("pos" in n or "rope" in n for n in grads[0]) or recipe == "lookhere"
    for compiled_grads in grads[1:]:
        assert compiled_grads.keys() == grads[0].keys()
        for n, g in grads[0].items():
            torch.testing.assert_close(compiled_grads[n], g, rtol=1e-4, atol=1e-5, msg=n)


def test_a_new_input_size_compiles_once_more_and_the_first_stays_cached():
    model = _model("vitdet_toy", "paper")
    cnt = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, fullgraph=True, backend=cnt, dynamic=False)
    with torch.no_grad():
        for size in (128, 96, 128, 96):
            x = torch.randn(1, 3, size, size)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    assert cnt.frame_count == 2
