"""Export of the bare backbones, checked in the runtime that loads it: ``torch.onnx.export`` (the TorchScript-based
exporter, ``dynamo=False``, opset 17) run in onnxruntime equals the eager model.

Before the fix every one of these graphs was written and then refused by onnxruntime ('Integer division by zero'
where a window grid's padded size traced to 0 windows, 'Incompatible dimensions' where the abs-win tile count did,
wrong numbers where RoPE rotated into views of an output the trace lost). The oracle is the eager model itself, in
float32 on the CPU; the tolerance is absolute, ``ONNX_ATOL`` (measured: at most 7.4e-6 for ViTDet-B, 2.2e-6 for the
toy presets, on outputs of magnitude about 6).
"""
import io
import warnings

import numpy as np
import pytest
import torch

from tests.conftest import require
from winpos.backbones import create

ONNX_ATOL = 5e-5


def onnx_outputs(model: torch.nn.Module, x: torch.Tensor) -> list[np.ndarray]:
    """``model`` exported by ``torch.onnx.export(dynamo=False, opset_version=17)`` and run in onnxruntime on ``x``."""
    ort = require("onnxruntime")
    buf = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's warnings about Python values in the graph
        torch.onnx.export(model, (x,), buf, dynamo=False, opset_version=17)
    session = ort.InferenceSession(buf.getvalue(), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})


def max_error(model: torch.nn.Module, x: torch.Tensor) -> float:
    outs = onnx_outputs(model, x)
    with torch.no_grad():
        ref = model(x)
    refs = list(ref) if isinstance(ref, (list, tuple)) else [ref]
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        assert o.shape == tuple(r.shape)
    return max(float(np.abs(o - r.numpy()).max()) for o, r in zip(outs, refs))


@pytest.mark.parametrize("preset, recipe", [("vitdet_b", "rope"), ("vitdet_b", "original"),
                                            ("hieradet_toy", "paper")])
def test_bare_backbone_onnx_runs_in_onnxruntime_and_matches_eager(preset, recipe):
    """The issue's probe: the bare backbone at 64 and 96 px, exported, loaded and run in onnxruntime."""
    torch.manual_seed(0)
    model = create(preset, recipe=recipe).eval()
    for px in (64, 96):
        x = torch.randn(1, 3, px, px)
        assert max_error(model, x) < ONNX_ATOL, (preset, recipe, px)


@pytest.mark.parametrize("eager_first", [False, True])
def test_onnx_is_right_whatever_the_grid_caches_hold(eager_first):
    """Per-grid values (abs-win tiles, RoPE tables) are computed in the graph while tracing, not read from the cache:
    exporting before or after an eager call at another grid, on a grid the windows do not tile, gives the same
    right graph."""
    torch.manual_seed(0)
    model = create("vitdet_toy", recipe="rope").eval()
    if eager_first:
        with torch.no_grad():
            model(torch.randn(1, 3, 96, 64))
    assert max_error(model, torch.randn(1, 3, 64, 96)) < ONNX_ATOL


def test_ceil_div_traces_to_the_right_padding():
    """``-(-4 // 14)`` traced to 0 in an ONNX graph; ``padded_size`` on a traced size pads 4 tokens to 14."""
    from winpos.windows import pad_to_window

    class Pad(torch.nn.Module):
        def forward(self, x):
            return pad_to_window(x, 14)[0]

    out = onnx_outputs(Pad(), torch.randn(1, 4, 5, 8))[0]
    assert out.shape == (1, 14, 14, 8)


# ------------------------------------------------------------------------------------------ winpos-export
from winpos.backbones.export import EXPORT_RECIPES, build_backbone, export_and_check, run_artifact  # noqa: E402
from winpos.errors import WinposError  # noqa: E402


def _example(seed=0):
    generator = torch.Generator().manual_seed(seed)
    return lambda size: torch.randn(1, 3, *size, generator=generator)


@pytest.mark.parametrize("preset", ["vitdet_toy", "hieradet_toy"])
@pytest.mark.parametrize("recipe", EXPORT_RECIPES)
def test_every_recipe_exports_to_onnx_and_matches_eager(preset, recipe):
    """Both families, all six recipes, on a grid the windows do not tile (64x96 px), checked in onnxruntime."""
    result = export_and_check(build_backbone(preset, recipe), "m", [(64, 96)], ("onnx",), example=_example(),
                              stride=16)
    assert [c.size for c in result.checks] == [(64, 96)]
    assert result.ok and result.checks[0].max_error < ONNX_ATOL, result.table()


def test_pt2_is_dynamic_only_where_the_model_allows_it():
    """Without a position term one program takes every size; RoPE's grid arithmetic pins a program to its grid, so
    it is exported once per size (and the check runs each at its own size)."""
    sizes = [(64, 64), (64, 96)]
    plain = export_and_check(build_backbone("vitdet_toy", "none"), "m", sizes, ("pt2",), example=_example(),
                             stride=16)
    assert [a.size for a in plain.artifacts] == [None] and len(plain.checks) == 2 and plain.ok
    rope = export_and_check(build_backbone("vitdet_toy", "rope"), "m", sizes, ("pt2",), example=_example(),
                            stride=16)
    assert [a.size for a in rope.artifacts] == sizes and rope.ok, rope.table()


def test_an_artifact_refuses_a_size_it_was_not_exported_at():
    """A traced graph at another size could run and be wrong (LookHere at 96x64 from a 64x96 trace: error 0.06);
    every fixed-size artifact refuses it, naming the fix."""
    result = export_and_check(build_backbone("vitdet_toy", "lookhere"), "m", [(64, 96)], ("onnx", "torchscript"),
                              example=_example(), stride=16)
    for artifact in result.artifacts:
        with pytest.raises(WinposError, match=r"exported for 64x96 inputs and cannot take 96x64.*--sizes 96x64"):
            run_artifact(artifact, torch.randn(1, 3, 96, 64))


def test_an_op_without_an_onnx_form_is_one_line_naming_the_fix():
    """timm's antialiased bicubic (pos_antialias=True) has no ONNX form at opset 17."""
    model = build_backbone("vitdet_toy", "paper", pos_antialias=True)
    with pytest.raises(WinposError, match=r"cannot be exported to ONNX: .*_upsample_bicubic2d_aa.*--formats") as e:
        export_and_check(model, "m", [(64, 64)], ("onnx",), example=_example(), stride=16)
    assert "\n" not in str(e.value)


def test_the_benchmark_mode_measures_errors_and_latency_side_by_side():
    """``benchmark.py export``: the error table's rows (format x size, the dynamic .pt2 named) and one latency row
    with both runtimes timed in the same rounds (no speed asserted)."""
    from winpos.bench.export import errors, latency

    rows = errors(["vitdet_toy"], ["none"], [(64, 64), (64, 96)])
    assert [(r["format"], r["size"]) for r in rows] == [
        (f, s) for f in ("onnx", "pt2 (dynamic)", "torchscript") for s in ("64x64", "64x96")]
    assert all(r["max_error"] <= r["tolerance"] for r in rows)
    (row,) = latency(["vitdet_toy"], ["rope"], 64, repeats=2, warmup=0, threads=1)
    assert row["eager_s"] > 0 and row["onnxruntime_s"] > 0 and len(row["per-round range"]) == 2
