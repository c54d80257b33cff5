"""``benchmark.py backbone``: winpos backbones vs the implementations people use today, side by side.

Peers: detectron2's ``ViT`` (relpos in every block, as shipped, and without relpos), sam2's Hiera-B+, timm's Hiera
and segment-anything's image encoder. All models get the same random weights where they share a structure
(winpos ``original`` is loaded from the detectron2 model and its output compared), batch 1, fp32 or bf16 autocast.
"""
from __future__ import annotations

from functools import partial

import torch
import torch.nn as nn

from winpos.bench.flops import count_gflops, matmul_gflops_per_s
from winpos.bench.timing import interleaved_medians, print_table


def detectron2_vit_b(img_size=1024, use_rel_pos=True):
    from detectron2.modeling.backbone.vit import ViT

    return ViT(img_size=img_size, patch_size=16, embed_dim=768, depth=12, num_heads=12, drop_path_rate=0.0,
               window_size=14, mlp_ratio=4, qkv_bias=True, norm_layer=partial(nn.LayerNorm, eps=1e-6),
               window_block_indexes=[0, 1, 3, 4, 6, 7, 9, 10], residual_block_indexes=[], use_rel_pos=use_rel_pos,
               out_feature="last_feat")


def sam2_hiera_bplus():
    from sam2.modeling.backbones.hieradet import Hiera

    return Hiera(embed_dim=112, num_heads=2)


def sam_vit_b_encoder(img_size=1024):
    from segment_anything.modeling.image_encoder import ImageEncoderViT

    return ImageEncoderViT(img_size=img_size, patch_size=16, embed_dim=768, depth=12, num_heads=12, mlp_ratio=4,
                           out_chans=256, qkv_bias=True, norm_layer=partial(nn.LayerNorm, eps=1e-6),
                           use_rel_pos=True, rel_pos_zero_init=True, window_size=14, global_attn_indexes=(2, 5, 8, 11))


def _randomize(model: nn.Module, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g) * 0.02
            p.copy_(noise + 1.0 if (p.dim() == 1 and "norm" in name and name.endswith("weight")) else noise)
    return model.eval()


def build_models(img_size: int, which: str) -> dict[str, nn.Module]:
    from winpos.backbones import create
    from winpos.checkpoints.vitdet import load_vitdet_weights

    models: dict[str, nn.Module] = {}
    if which in ("all", "vitdet"):
        d2 = _randomize(detectron2_vit_b(img_size))
        models["detectron2 ViT-B (relpos everywhere)"] = d2
        models["detectron2 ViT-B (no relpos)"] = _randomize(detectron2_vit_b(img_size, use_rel_pos=False))
        original = create("vitdet_b", recipe="original", img_size=img_size, drop_path_rate=0.0).eval()
        load_vitdet_weights(original, d2.state_dict(), source="detectron2")
        models["winpos ViTDet-B original"] = original
        for recipe in ("paper", "rope", "lookhere"):
            models[f"winpos ViTDet-B {recipe}"] = create("vitdet_b", recipe=recipe, img_size=img_size,
                                                         drop_path_rate=0.0).eval()
        models["winpos ViTDet-B abswin, no block term"] = create(
            "vitdet_b", recipe="paper", img_size=img_size, drop_path_rate=0.0, global_pos="none").eval()
    if which in ("all", "hiera"):
        sam2 = _randomize(sam2_hiera_bplus())
        models["sam2 Hiera-B+"] = sam2
        mine = create("hieradet_bplus", recipe="original", img_size=img_size).eval()
        from winpos.checkpoints.hiera import load_hiera_checkpoint

        load_hiera_checkpoint(mine, {"model": {"image_encoder.trunk." + k: v for k, v in sam2.state_dict().items()}})
        models["winpos HieraDet-B+ original"] = mine
        models["winpos HieraDet-B+ paper"] = create("hieradet_bplus", recipe="paper", img_size=img_size).eval()
    return models


def _output(model, x):
    out = model(x)
    if isinstance(out, dict):
        out = next(iter(out.values()))
    if isinstance(out, (list, tuple)):
        out = out[-1]
    return out


def run(img_size=1024, which="all", repeats=3, bf16=False, flops=True) -> dict:
    torch.manual_seed(0)
    x = torch.randn(1, 3, img_size, img_size)
    models = build_models(img_size, which)
    results = {"img_size": img_size, "threads": torch.get_num_threads(), "repeats": repeats, "rows": []}
    with torch.no_grad():
        checks = {}
        if "winpos ViTDet-B original" in models:
            a = _output(models["winpos ViTDet-B original"], x)
            b = _output(models["detectron2 ViT-B (relpos everywhere)"], x)
            checks["vitdet_original_vs_detectron2_max_rel"] = float((a - b).abs().max() / b.abs().max())
        if "winpos HieraDet-B+ original" in models:
            a = _output(models["winpos HieraDet-B+ original"], x)
            b = _output(models["sam2 Hiera-B+"], x)
            checks["hieradet_original_vs_sam2_max_rel"] = float((a - b).abs().max() / b.abs().max())
        results["output_checks"] = checks
        fns = {name: partial(_output, m, x) for name, m in models.items()}
        times = interleaved_medians(fns, repeats=repeats, warmup=1)
        if bf16:
            def bf16_call(m):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    return _output(m, x)
            bf_names = [n for n in models if n.startswith("winpos")]
            bf_times = interleaved_medians({n: partial(bf16_call, models[n]) for n in bf_names}, repeats=repeats, warmup=1)
            for n in bf_names:
                ref, low = _output(models[n], x), bf16_call(models[n]).float()
                results.setdefault("bf16", {})[n] = {
                    "median_s": bf_times[n], "speedup_vs_fp32": times[n] / bf_times[n],
                    "max_rel_err": float((ref - low).abs().max() / ref.abs().max()),
                }
    peak = matmul_gflops_per_s()
    results["matmul_gflops_per_s"] = peak
    base = {"vitdet": times.get("detectron2 ViT-B (relpos everywhere)"), "hiera": times.get("sam2 Hiera-B+")}
    for name, t in times.items():
        family = "hiera" if "Hiera" in name else "vitdet"
        gf = count_gflops(models[name], x) if flops else float("nan")
        results["rows"].append({
            "model": name, "median_s": t, "speedup_vs_peer": base[family] / t if base[family] else float("nan"),
            "gflops": gf, "fraction_of_matmul_peak": gf / t / peak if flops else float("nan"),
        })
    print(f"backbone forward, {img_size}x{img_size}, batch 1, fp32, {results['threads']} threads, median of {repeats}; "
          f"matmul peak {peak:.1f} GFLOP/s")
    print("output checks:", {k: f"{v:.2e}" for k, v in checks.items()})
    print_table("backbones (peer = detectron2 ViT-B for ViTDet rows, sam2 Hiera-B+ for Hiera rows)", results["rows"],
                ["model", "median_s", "speedup_vs_peer", "gflops", "fraction_of_matmul_peak"])
    if bf16:
        rows = [{"model": n, **v} for n, v in results["bf16"].items()]
        print_table("bf16 autocast vs fp32", rows, ["model", "median_s", "speedup_vs_fp32", "max_rel_err"])
    return results
