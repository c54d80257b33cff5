"""``benchmark.py mlp``: one transformer MLP with its residual, ``x + fc2(gelu(fc1(x)))``, plain PyTorch ops vs the
fused CPU inference path (``winpos.backbones.fused``), at the token counts and widths of ViTDet-B's and Hiera-B+'s
blocks at 1024^2. The two paths run the same ``Mlp`` module (``fused_linear`` on / off), interleaved round-robin."""
from __future__ import annotations

import statistics

import torch

from winpos.bench.timing import interleaved_times, print_table, round_ratios

# (name, tokens, channels): the MLP is channels -> 4 * channels -> channels, as in every winpos backbone.
SHAPES = (
    ("Hiera-B+ stage 1", 256 * 256, 112),
    ("Hiera-B+ stage 2", 128 * 128, 224),
    ("Hiera-B+ stage 3", 64 * 64, 448),
    ("ViTDet-B global", 64 * 64, 768),
    ("ViTDet-B windows (70x70 padded)", 70 * 70, 768),
)


def run(shapes=SHAPES, divide: int = 1, repeats: int = 7, warmup: int = 1) -> dict:
    """Median ms of the plain and the fused MLP per shape (token counts divided by ``divide``), the speed-up of the
    medians, the per-round range, and the largest output difference between the two paths."""
    from winpos.backbones.common import Mlp
    from winpos.backbones.fused import fused_linear

    rows = []
    for name, tokens, channels in shapes:
        torch.manual_seed(0)
        mlp = Mlp(channels, 4 * channels).eval()
        x = torch.randn(1, max(1, tokens // divide), channels)

        def call(fused, mlp=mlp, x=x):
            with torch.no_grad(), fused_linear(fused):
                return mlp(x, residual=x)

        diff = float((call(True) - call(False)).abs().max())
        rounds = interleaved_times({"plain": lambda: call(False), "fused": lambda: call(True)}, repeats=repeats,
                                   warmup=warmup, desc=name)
        plain, fused = statistics.median(rounds["plain"]), statistics.median(rounds["fused"])
        ratios = round_ratios(rounds["plain"], rounds["fused"])
        rows.append({"shape": name, "tokens": x.shape[1], "channels": channels, "plain_ms": plain * 1e3,
                     "fused_ms": fused * 1e3, "speedup": plain / fused, "speedup_range": [min(ratios), max(ratios)],
                     "max_abs_diff": diff})
    result = {"threads": torch.get_num_threads(), "repeats": repeats, "warmup": warmup, "divide": divide,
              "rows": rows}
    print(f"x + fc2(gelu(fc1(x))), C -> 4C -> C, fp32, CPU, {result['threads']} threads, median of {repeats} after "
          f"{warmup} warm-up; plain ops vs the fused path (winpos.backbones.fused)")
    print_table("MLP with residual: plain vs fused", rows,
                ["shape", "tokens", "channels", "plain_ms", "fused_ms", "speedup", "speedup_range", "max_abs_diff"])
    return result
