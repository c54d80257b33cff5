"""Float16 export of the bare backbones (``winpos-export backbone --precision float16``, ``Fp16Graph``).

What a float16 deployment needs and what is checked here:
- every Linear and Conv2d weight is float16 in the file (half the bytes), every LayerNormalization node computes
  in float32 (TensorRT's float16 LayerNorm overflows once an activation passes 256: its square passes 65504),
  and the input and outputs are float32;
- every artifact, run in its runtime, is within twice the float16 graph's own eager error of the float32 eager
  model (the export adds no error beyond float16's rounding), for every recipe of both families and the RoPE-era
  layouts; a dropped position term would be O(1) off;
- a model float16 cannot hold (activations beyond 65504) is refused in one line, nothing written.
"""

import pytest
import torch

from tests.bad_inputs_helpers import assert_one_line_error, tool
from tests.conftest import require
from winpos.backbones.export import (EXPORT_RECIPES, Fp16Graph, build_backbone, export_and_check, export_mode,
                                     fp16_tolerance, onnx_bytes)
from winpos.errors import WinposError

SMALL_VIT = dict(img_size=64, embed_dim=32, num_heads=2, depth=2, global_blocks=(1,))
CASES = [("vitdet_toy", r, {}) for r in EXPORT_RECIPES] + [("hieradet_toy", r, {}) for r in EXPORT_RECIPES] + \
        [(p, "original", SMALL_VIT) for p in ("vitdet_eva02_t", "vitdet_dinov3_t")]


def _example(seed=0):
    g = torch.Generator().manual_seed(seed)
    return lambda s: torch.randn(1, 3, *s, generator=g)


@pytest.mark.parametrize("preset,recipe,overrides", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_fp16_onnx_matches_fp32_eager_within_fp16_rounding(preset, recipe, overrides):
    require("onnxruntime")
    torch.manual_seed(0)
    model = build_backbone(preset, recipe, **overrides)
    graph = Fp16Graph(model).eval()
    sizes = [(64, 64), (64, 96)]
    tol, eager = fp16_tolerance(model, graph, _example(), sizes)
    assert 1e-5 < eager < 1e-2, eager  # float16 rounding is there, and small
    result = export_and_check(model, "m", sizes, ["onnx"], example=_example(1), stride=model.patch_size
                              if hasattr(model, "patch_size") else 32, tolerance=tol, exported={"onnx": graph})
    print(f"{preset} {recipe}: eager float16 error {eager:.2e}; onnx " +
          ", ".join(f"{c.max_error:.2e}" for c in result.checks))
    assert result.ok, result.table()


def test_fp16_pt2_and_torchscript_match_too():
    torch.manual_seed(0)
    model = build_backbone("hieradet_toy", "rope")
    graph = Fp16Graph(model).eval()
    tol, _ = fp16_tolerance(model, graph, _example(), [(64, 64)])
    result = export_and_check(model, "m", [(64, 64)], ["pt2", "torchscript"], example=_example(1), stride=32,
                              tolerance=tol, exported={"pt2": graph, "torchscript": graph})
    assert result.ok and len(result.checks) == 2, result.table()


def test_fp16_onnx_stores_float16_weights_and_float32_layernorm():
    onnx = require("onnx")
    torch.manual_seed(0)
    model = build_backbone("vitdet_toy", "rope")
    x = torch.randn(1, 3, 64, 64)
    with export_mode():
        fp32 = onnx.load_from_string(onnx_bytes(model, x))
        fp16 = onnx.load_from_string(onnx_bytes(Fp16Graph(model).eval(), x))
    fp16 = onnx.shape_inference.infer_shapes(fp16)
    types = {v.name: v.type.tensor_type.elem_type for v in [*fp16.graph.value_info, *fp16.graph.input,
                                                             *fp16.graph.output]}
    types.update({t.name: t.data_type for t in fp16.graph.initializer})
    F32, F16 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16
    norms = [n for n in fp16.graph.node if n.op_type == "LayerNormalization"]
    assert len(norms) >= 4  # two per block
    for n in norms:
        assert all(types.get(i) == F32 for i in n.input if i), (n.name, [types.get(i) for i in n.input])
    for op in ("MatMul", "Gemm", "Conv"):
        for n in (n for n in fp16.graph.node if n.op_type == op):
            weights = [i for i in n.input if i in {t.name for t in fp16.graph.initializer}]
            assert all(types[w] == F16 for w in weights), n.name
    assert [types[v.name] for v in [*fp16.graph.input, *fp16.graph.output]] == [F32, F32]
    big16 = sum(t.data_type == F16 and len(t.dims) >= 2 for t in fp16.graph.initializer)
    assert big16 >= 2 * 4 + 1  # qkv, proj, fc1, fc2 per block + the patch embedding
    count = {F16: 0, F32: 0}
    for t in fp16.graph.initializer:
        if t.data_type in count:
            count[t.data_type] += int(torch.tensor(list(t.dims), dtype=torch.long).prod())
    assert count[F16] > 0.9 * (count[F16] + count[F32]), count  # the weights: all but the embeddings and norms
    assert fp16.ByteSize() < 0.75 * fp32.ByteSize()  # the rest of the file is the graph itself


def test_a_model_fp16_cannot_hold_is_refused():
    torch.manual_seed(0)
    model = build_backbone("vitdet_toy", "none")
    with torch.no_grad():
        model.blocks[0].mlp.fc1.weight.mul_(1e5)  # MLP activations beyond float16's 65504
    with pytest.raises(WinposError, match="float16 does not hold this model; export it with --precision float32"):
        fp16_tolerance(model, Fp16Graph(model).eval(), _example(), [(64, 64)])


def test_the_cli_refuses_such_weights_in_one_line_and_writes_nothing(tmp_path):
    torch.manual_seed(0)
    model = build_backbone("vitdet_toy", "none")
    with torch.no_grad():
        model.blocks[0].mlp.fc1.weight.mul_(1e5)
    torch.save(model.state_dict(), tmp_path / "big.pth")
    r = tool("export.py", "backbone", "vitdet_toy", "--recipe", "none", "--weights", tmp_path / "big.pth",
             "--precision", "float16", "--sizes", "64", "--formats", "onnx", "--out", tmp_path / "o")
    assert_one_line_error(r, "float16 does not hold this model", "--precision float32")
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_the_cli_writes_fp16_files_and_says_so(tmp_path, capsys):
    from winpos.cli.export import main

    assert main(["backbone", "hieradet_toy", "--recipe", "lookhere", "--precision", "float16", "--sizes", "64",
                 "--formats", "onnx", "--out", str(tmp_path / "out")]) == 0
    text = capsys.readouterr().out
    assert "float16: Linear and Conv2d in float16" in text and "2 x the float16 graph's own eager error" in text
    files = sorted(p.name for p in (tmp_path / "out").iterdir() if not p.name.startswith("."))
    assert files == ["hieradet_toy_lookhere_fp16_64x64.onnx", "hieradet_toy_lookhere_fp16_export.json"]
    import json

    meta = json.loads((tmp_path / "out" / "hieradet_toy_lookhere_fp16_export.json").read_text())
    assert meta["precision"] == "float16" and 0 < meta["float16_eager_error"] < meta["tolerance"]


def test_an_unknown_precision_is_one_line(tmp_path):
    r = tool("export.py", "backbone", "vitdet_toy", "--precision", "bf16", "--out", str(tmp_path / "o"))
    assert_one_line_error(r, "invalid choice: 'bf16'")
    assert not (tmp_path / "o").exists()


def test_a_nan_in_any_output_fails_the_check():
    """The max over outputs must not skip a nan (Python's max keeps whichever of nan and a number comes first)."""
    from winpos.backbones.export import _max_error

    good, bad = torch.zeros(2), torch.tensor([0.0, float("nan")])
    for outs in ([good, bad], [bad, good]):
        assert _max_error(outs, [good, good]) == float("inf")
    assert _max_error([good, good + 0.5], [good, good]) == 0.5


def test_a_float16_detector_export_is_refused_in_one_line(tmp_path):
    r = tool("export.py", "detector", "--config-file", "shapes/mask_rcnn_vitdet_toy_rope.py", "--random-weights",
             "--precision", "float16", "--out", tmp_path / "o")
    assert_one_line_error(r, "exports float32 only", "winpos-export backbone ... --precision float16")
    assert not (tmp_path / "o").exists()
