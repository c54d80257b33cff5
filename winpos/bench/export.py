"""``benchmark.py export``: exported models against eager, in numbers.

Two parts, one run:

- ``errors``: every recipe of each backbone preset exported to each format at each size (``export_and_check``:
  ONNX run in onnxruntime, the ``.pt2`` program, the TorchScript module, each on a new random input) and, for each
  shapes detector config given, the whole detector (ONNX and TorchScript through detectron2's ``TracingAdapter``,
  random weights): the max absolute error against eager per family x recipe x format x size.
- ``latency``: one forward at batch 1 on the CPU, eager PyTorch (as a user runs it: no gradient, the default
  attention and fused paths) and the ONNX graph in onnxruntime (intra-op threads = ``--threads``), called
  round-robin after warm-up; medians, their ratio and the range of the per-round ratios.
"""
from __future__ import annotations

import statistics

import torch

from winpos.bench.timing import interleaved_times, print_table, round_ratios

__all__ = ["errors", "latency", "pivot", "run"]


def _example(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return lambda size: torch.randn(1, 3, *size, generator=generator)


def _rows(model: str, recipe: str, result) -> list[dict]:
    dynamic = any(a.size is None for a in result.artifacts)
    return [{"model": model, "recipe": recipe, "format": c.format + (" (dynamic)" if dynamic and c.format == "pt2" else ""),
             "size": f"{c.size[0]}x{c.size[1]}", "max_error": c.max_error, "tolerance": result.tolerance}
            for c in result.checks]


def errors(presets, recipes, sizes, configs=()) -> list[dict]:
    """One row per (model, recipe, format, size): the max |error| of the export against eager."""
    from winpos.backbones.export import EXPORT_RECIPES, FORMATS, build_backbone, export_and_check

    rows = []
    for preset in presets:
        for recipe in recipes or EXPORT_RECIPES:
            model = build_backbone(preset, recipe)
            rows += _rows(preset, recipe, export_and_check(model, preset, sizes, FORMATS, example=_example(),
                                                           stride=getattr(model, "patch_size", 32)))
    for config in configs:
        from pathlib import Path

        from winpos.d2.export import DETECTOR_FORMATS, build_detector, export_detector

        _, model = build_detector(config, None, random_weights=True)
        rows += _rows(Path(config).stem, "(config)", export_detector(model, Path(config).stem, sizes, DETECTOR_FORMATS))
    return rows


def latency(presets, recipes, size: int, repeats: int, warmup: int, threads: int) -> list[dict]:
    """Eager vs onnxruntime seconds per forward, measured side by side."""
    from winpos.backbones.export import build_backbone, export_mode, onnx_bytes, require_onnxruntime

    ort = require_onnxruntime()
    rows = []
    for preset in presets:
        for recipe in recipes:
            model = build_backbone(preset, recipe)
            x = _example()((size, size))
            with export_mode():
                data = onnx_bytes(model, x)
            options = ort.SessionOptions()
            options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
            session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
            feed = {session.get_inputs()[0].name: x.numpy()}

            def eager():
                with torch.no_grad():
                    model(x)

            times = interleaved_times({"eager": eager, "onnxruntime": lambda: session.run(None, feed)},
                                      repeats=repeats, warmup=warmup, desc=f"{preset} {recipe}")
            ratios = round_ratios(times["eager"], times["onnxruntime"])
            rows.append({"model": preset, "recipe": recipe, "size": f"{size}x{size}",
                         "eager_s": statistics.median(times["eager"]),
                         "onnxruntime_s": statistics.median(times["onnxruntime"]),
                         "eager / onnxruntime": statistics.median(times["eager"]) / statistics.median(
                             times["onnxruntime"]), "per-round range": (min(ratios), max(ratios))})
    return rows


def pivot(rows) -> tuple[list[dict], list[str]]:
    """The error rows as one line per model and recipe, a column per format and size (what docs/export.md shows);
    a cell of the one dynamic .pt2 program says so."""
    cols, table = [], {}
    for r in rows:
        fmt, dynamic = r["format"].split()[0], r["format"].endswith("(dynamic)")
        col = f"{fmt} {r['size']}"
        if col not in cols:
            cols.append(col)
        table.setdefault((r["model"], r["recipe"]), {"model": r["model"], "recipe": r["recipe"],
                                                     "tolerance": r["tolerance"]})[col] = \
            f"{r['max_error']:.2g} (dynamic)" if dynamic else r["max_error"]
    return list(table.values()), ["model", "recipe", *cols, "tolerance"]


def run(presets, recipes, sizes, configs, latency_presets, latency_recipes, latency_size, repeats, warmup,
        threads, parts=("errors", "latency")) -> dict:
    result = {"threads": threads, "torch": torch.__version__}
    if "errors" in parts:
        rows = errors(presets, recipes, sizes, configs)
        print_table("Export: max |error| against eager (float32, CPU)", *pivot(rows))
        result["errors"] = rows
    if "latency" in parts:
        import onnxruntime

        rows = latency(latency_presets, latency_recipes, latency_size, repeats, warmup, threads)
        print_table(f"Latency, batch 1, CPU, {threads} threads (torch {torch.__version__}, onnxruntime "
                    f"{onnxruntime.__version__}; medians of {repeats} round-robin calls)", rows,
                    ["model", "recipe", "size", "eager_s", "onnxruntime_s", "eager / onnxruntime",
                     "per-round range"])
        result["latency"] = rows
    return result
