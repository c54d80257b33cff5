"""The authors' LookHere checkpoints (``{"weights": ..., "config": ...}``, a DeiT-III-style ViT-B/16) into ViTDet.

The files are made here with the authors' key layout and configs. Oracle: a forward pass of their architecture
written here with plain torch ops (LayerNorm eps 1e-5, LayerScale, their bias from the transcription in
``tests/posemb/test_lookhere_official.py``), without the cls token, which ViTDet does not have.
"""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.posemb.test_lookhere_official import OFFICIAL, official_bias
from winpos.backbones import create
from winpos.checkpoints import load_external
from winpos.checkpoints.lookhere import (
    convert_lookhere_checkpoint,
    load_lookhere_checkpoint,
    read_lookhere_config,
    vitdet_overrides,
)

ROOT = Path(__file__).resolve().parents[2]
SMALL = dict(embed_dim=96, depth=4, global_blocks=(1, 3))  # 12 heads of 8 channels: fast, same layout


def official_weights(dim=768, depth=12, classes=1000, seed=0):
    """Names and shapes of the authors' LookHere ViT-B/16: timm PatchEmbed, cls token, DeiT-III blocks with
    LayerScale ``gamma``, final norm and an Mlp classifier head; no pos_embed (their LookHere deletes it)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, std=0.05, mean=0.0):
        return torch.randn(*shape, generator=g) * std + mean

    sd = {"patch_embed.proj.weight": r(dim, 3, 16, 16, std=0.02), "patch_embed.proj.bias": r(dim),
          "cls_token": r(1, 1, dim)}
    for i in range(depth):
        p = f"blocks.{i}."
        sd.update({
            p + "norm1.weight": r(dim, std=0.1, mean=1.0), p + "norm1.bias": r(dim),
            p + "attn.qkv.weight": r(3 * dim, dim, std=dim ** -0.5), p + "attn.qkv.bias": r(3 * dim),
            p + "attn.proj.weight": r(dim, dim, std=dim ** -0.5), p + "attn.proj.bias": r(dim),
            p + "ls1.gamma": r(dim, std=0.1, mean=0.5),
            p + "norm2.weight": r(dim, std=0.1, mean=1.0), p + "norm2.bias": r(dim),
            p + "mlp.fc1.weight": r(4 * dim, dim, std=dim ** -0.5), p + "mlp.fc1.bias": r(4 * dim),
            p + "mlp.fc2.weight": r(dim, 4 * dim, std=(4 * dim) ** -0.5), p + "mlp.fc2.bias": r(dim),
            p + "ls2.gamma": r(dim, std=0.1, mean=0.5),
        })
    sd.update({"norm.weight": r(dim, mean=1.0), "norm.bias": r(dim),
               "head.fc1.weight": r(4 * dim, dim), "head.fc1.bias": r(4 * dim),
               "head.fc2.weight": r(classes, 4 * dim), "head.fc2.bias": r(classes)})
    return sd


def official_file(variant="90", **sizes):
    return {"weights": official_weights(**sizes), "config": dict(OFFICIAL[variant])}


def reference_forward(obj, image, heads=12):
    """The authors' ViT on ``image`` minus its cls token: patch tokens out, as ``(B, C, h, w)``."""
    sd, cfg = obj["weights"], obj["config"]
    depth = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks."))
    x = F.conv2d(image, sd["patch_embed.proj.weight"], sd["patch_embed.proj.bias"], stride=16)
    B, C, h, w = x.shape
    x = x.flatten(2).transpose(1, 2)
    bias = official_bias(cfg, (h, w), depth, heads, rounded=False).float()
    for i in range(depth):
        p = f"blocks.{i}."
        y = F.layer_norm(x, (C,), sd[p + "norm1.weight"], sd[p + "norm1.bias"], eps=1e-5)
        q, k, v = F.linear(y, sd[p + "attn.qkv.weight"], sd[p + "attn.qkv.bias"]).reshape(
            B, h * w, 3, heads, C // heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias[i])
        x = x + sd[p + "ls1.gamma"] * F.linear(a.transpose(1, 2).reshape(B, h * w, C), sd[p + "attn.proj.weight"],
                                               sd[p + "attn.proj.bias"])
        y = F.layer_norm(x, (C,), sd[p + "norm2.weight"], sd[p + "norm2.bias"], eps=1e-5)
        y = F.linear(F.gelu(F.linear(y, sd[p + "mlp.fc1.weight"], sd[p + "mlp.fc1.bias"])), sd[p + "mlp.fc2.weight"],
                     sd[p + "mlp.fc2.bias"])
        x = x + sd[p + "ls2.gamma"] * y
    return x.transpose(1, 2).reshape(B, C, h, w)


@pytest.mark.parametrize("variant", ["180", "90", "45"])
def test_imported_model_runs_the_authors_forward_at_224(variant):
    obj = official_file(variant, dim=96, depth=4)
    model, report = load_lookhere_checkpoint(obj, "vitdet_b", **SMALL)
    assert not report.missing and len(report.matched) == 2 + 4 * 14
    assert {k for k, _ in report.unexpected} == {"cls_token", "norm.weight", "norm.bias", "head.fc1.weight",
                                                 "head.fc1.bias", "head.fc2.weight", "head.fc2.bias", "config"}
    lh = model.blocks[3].attn.lookhere
    assert lh.shorthand == OFFICIAL[variant]["head_directions"] and lh.global_slope == 2.0 and lh.variant == variant
    image = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        ours = model.eval()(image)
        theirs = reference_forward(obj, image)
    assert ours.shape == (2, 96, 14, 14)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    # The imported weights matter: the same model with LayerNorm eps 1e-6 or without LayerScale is refused.
    for bad in (dict(norm_eps=1e-6), dict(layer_scale_init=None)):
        wrong = create("vitdet_b", "lookhere", **{**vitdet_overrides(read_lookhere_config(obj)), **bad}, **SMALL)
        with pytest.raises(ValueError, match="does not match the LookHere checkpoint.*vitdet_overrides"):
            convert_lookhere_checkpoint(obj, wrong)


def test_config_is_read_from_the_file_not_the_recipe():
    """The LH-180 file gives LH-180 heads and its own slopes, whatever winpos's recipe defaults are."""
    obj = official_file("180", dim=96, depth=4)
    obj["config"].update(global_slope=1.5, layer_slopes=[1.0, 0.25])
    model, _ = load_lookhere_checkpoint(obj, "vitdet_b", **SMALL)
    image = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(image), reference_forward(obj, image), rtol=1e-4, atol=1e-4)
    # The recipe's LookHere (LH-45, global 2, (1.5, 0.5)) with the right LayerScale and eps: refused as a target.
    recipe = create("vitdet_b", "lookhere", layer_scale_init=1e-4, norm_eps=1e-5, **SMALL)
    with pytest.raises(ValueError, match=r"block 0 without LookHere \{'global_slope': 1.5"):
        convert_lookhere_checkpoint(obj, recipe)


def test_load_external_detects_the_format_and_refuses_what_does_not_fit(tmp_path):
    obj = official_file("45", dim=96, depth=4)
    sd, report = load_external(obj, "vitdet_b", recipe="lookhere", **SMALL)
    assert report.source == "lookhere" and len(sd) == 2 + 4 * 14
    with pytest.raises(ValueError, match="recipe='original' does not fit.*recipe='lookhere'"):
        load_external(obj, "vitdet_b", **SMALL)
    with pytest.raises(ValueError, match=r"overrides \['pos_embed'\] contradict"):
        load_external(obj, "vitdet_b", recipe="lookhere", pos_embed="abswin", **SMALL)
    with pytest.raises(ValueError, match="16 heads instead of the released ViT-B's 12"):
        load_external(obj, "vitdet_b", recipe="lookhere", num_heads=16, **SMALL)
    with pytest.raises(ValueError, match="loads into a ViTDet preset.*not 'hieradet_toy'"):
        load_external(obj, "hieradet_toy", format="lookhere", recipe="lookhere")
    with pytest.raises(ValueError, match="loads into ViTDet, not HieraDet"):
        convert_lookhere_checkpoint(obj, create("hieradet_toy"), recipe="lookhere")
    with pytest.raises(ValueError, match="not in the authors' LookHere layout"):
        load_external({"model": {"w": torch.ones(1)}}, "vitdet_b", format="lookhere", recipe="lookhere")
    bad = official_file("45", dim=96, depth=4)
    bad["config"]["head_directions"] = "halves-zero-none"
    with pytest.raises(ValueError, match="part 'zero'"):
        load_external(bad, "vitdet_b", recipe="lookhere", **SMALL)
    bad["config"] = dict(OFFICIAL["45"], distance="sqrt")
    with pytest.raises(ValueError, match="distance='sqrt'"):
        load_external(bad, "vitdet_b", recipe="lookhere", **SMALL)
    del bad["config"]["layer_slopes"]
    with pytest.raises(ValueError, match=r"lacks \['layer_slopes'\]"):
        load_external(bad, "vitdet_b", recipe="lookhere", **SMALL)
    nan = official_file("45", dim=96, depth=4)  # a NaN weight is refused, as in every other format
    nan["weights"]["blocks.2.attn.qkv.weight"][3, 5] = float("nan")
    with pytest.raises(ValueError, match=r"NaN/inf values in 1 tensors \(blocks.2.attn.qkv.weight\)"):
        load_external(nan, "vitdet_b", recipe="lookhere", **SMALL)


class _WritesFile:
    """Unpickling this calls open(target, "w"), which creates the file: the payload we must never run."""

    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return (open, (self.target, "w"))


@pytest.mark.parametrize("where", ["top", "config"])
def test_hostile_pickle_is_refused_and_not_run(tmp_path, where):
    target = tmp_path / "pwned"
    obj = official_file("90", dim=96, depth=1)
    if where == "top":
        obj["x"] = _WritesFile(target)
    else:
        obj["config"]["head_directions"] = _WritesFile(target)
    path = tmp_path / "LH_90_weights_and_config.pth"
    torch.save(obj, path)
    with pytest.raises(ValueError, match="pickled code/objects that winpos won't execute") as ei:
        load_external(path, "vitdet_b", format="lookhere", recipe="lookhere")
    assert str(path) in str(ei.value) and not target.exists()
    with pytest.raises(ValueError, match="pickled code/objects"):
        load_lookhere_checkpoint(path)
    assert not target.exists()


@pytest.fixture(scope="module")
def vit_b_file(tmp_path_factory):
    obj = official_file("90")
    path = tmp_path_factory.mktemp("lookhere") / "LH_90_weights_and_config.pth"
    torch.save(obj, path)
    return obj, path


def test_vit_b_file_into_vitdet_b_at_224_and_1024(vit_b_file):
    obj, path = vit_b_file
    model, report = load_lookhere_checkpoint(path)  # torch.load(weights_only=True) inside
    assert len(report.matched) == 2 + 12 * 14 and not report.missing
    model.eval()
    image = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        small = model(image)
        torch.testing.assert_close(small, reference_forward(obj, image), rtol=1e-4, atol=1e-4)
        start = time.perf_counter()
        large = model(torch.randn(1, 3, 1024, 1024))
        seconds = time.perf_counter() - start
    assert small.shape == (1, 768, 14, 14) and large.shape == (1, 768, 64, 64)
    assert torch.isfinite(large).all()
    print(f"ViTDet-B with LH-90 weights: 1024 px forward {seconds:.1f} s")


def test_convert_checkpoint_tool(vit_b_file, tmp_path):
    obj, path = vit_b_file
    out = tmp_path / "vitdet_b_lh90.safetensors"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "convert_checkpoint.py"), "--input", str(path),
                          "--output", str(out), "--to", "vitdet_b", "--recipe", "lookhere", "--format", "lookhere"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "head_directions='corners-triangles-none'" in run.stdout and "lookhere -> winpos ViTDet" in run.stdout
    from safetensors.torch import load_file

    model = create("vitdet_b", "lookhere", **vitdet_overrides(read_lookhere_config(obj)))
    result = model.load_state_dict(load_file(str(out)), strict=False)
    assert not result.missing_keys and not result.unexpected_keys
    image = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(image), reference_forward(obj, image), rtol=1e-4, atol=1e-4)
    # the file's settings are in the output's metadata and in the printed line: the model they build is the same
    import json

    from safetensors import safe_open

    with safe_open(str(out), "pt") as f:
        kwargs = json.loads(f.metadata()["winpos_kwargs"])
    assert "layer_slopes" in run.stdout.split("load it with:")[1]
    rebuilt = create("vitdet_b", "lookhere", **kwargs).eval()
    rebuilt.load_state_dict(load_file(str(out)))
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(image), model(image), rtol=0, atol=0)
