"""``benchmark.py train-step``: one training step of a whole backbone per position encoding, side by side.

RoPE's speed claim (Kane, Hassani, Shi: ViT-B trains 8.5% faster with axial RoPE than with relative position bias)
is about *training*: the bias's backward is a memory-bound reduction over the N x N logits, RoPE's an elementwise
rotation. So this times forward, backward and an AdamW step (batch 1, fp32, the sum of the last feature map as
the loss) of ViTDet-B and HieraDet-B+ at 1024 px, every row in one process, called round-robin so the machine's
drift hits all alike. Rows:

* ViTDet-B: winpos ``rope`` (abs-win + axial RoPE in every block), ``original`` (abs + relpos in every block:
  detectron2's recipe), ``paper`` (abs-win, relpos only in the global blocks), ``none`` (abs-win, no block term),
  and detectron2's own ``ViT`` with relpos (the row detectron2 users compare first).
* HieraDet-B+: ``rope``, ``relpos`` (abs-win + relpos in every block), ``paper`` (recursive abs-win, relpos in the
  global blocks), ``none`` (SAM2's ``original``: abs-win, no block term).

Per row: the median seconds of a step, its ratio to the family's ``relpos`` row (``original`` for ViTDet) with the
range of the per-round ratios, and the peak memory of one step (RSS growth of a spawned process).
"""
from __future__ import annotations

import gc
import statistics

import torch

from winpos.bench.timing import interleaved_times, peak_rss_mib, print_table, round_ratios

D2_ROW = "detectron2 ViT (relpos)"
FAMILIES = {
    "vitdet_b": {"rope": dict(recipe="rope"), "original": dict(recipe="original"), "paper": dict(recipe="paper"),
                 "none": dict(recipe="paper", global_pos="none"), D2_ROW: None},
    "hieradet_bplus": {"rope": dict(recipe="rope"), "relpos": dict(recipe="original", window_pos="relpos",
                                                                    global_pos="relpos"),
                       "paper": dict(recipe="paper"), "none": dict(recipe="original")},
}
BASELINE = {"vitdet_b": "original", "hieradet_bplus": "relpos"}


def build(family: str, row: str, img_size: int) -> torch.nn.Module:
    torch.manual_seed(0)
    spec = FAMILIES[family][row]
    if spec is None:
        from winpos.d2.peers import detectron2_vit_b

        return detectron2_vit_b(img_size, use_rel_pos=True).train()
    from winpos.backbones import create

    spec = dict(spec)
    return create(family, recipe=spec.pop("recipe"), img_size=img_size, drop_path_rate=0.0, **spec).train()


def _last(out) -> torch.Tensor:
    if isinstance(out, dict):
        out = list(out.values())
    return out[-1] if isinstance(out, (list, tuple)) else out


def step_fn(family: str, row: str, img_size: int):
    """A closure making one training step (forward, backward, AdamW) of ``row`` on a fixed random image."""
    model = build(family, row, img_size)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
    x = torch.randn(1, 3, img_size, img_size, generator=torch.Generator().manual_seed(0))

    def step():
        opt.zero_grad(set_to_none=True)
        _last(model(x)).float().mean().backward()
        opt.step()

    return step


def run(families=tuple(FAMILIES), img_size: int = 1024, repeats: int = 3, warmup: int = 1, memory: bool = True,
        threads: int | None = None) -> dict:
    if threads:
        torch.set_num_threads(threads)
    results = {"img_size": img_size, "repeats": repeats, "threads": torch.get_num_threads(), "families": {}}
    for family in families:
        rows = list(FAMILIES[family])
        fns = {row: step_fn(family, row, img_size) for row in rows}
        times = interleaved_times(fns, repeats=repeats, warmup=warmup, desc=f"{family} training steps")
        base = BASELINE[family]
        table = []
        for row in rows:
            entry = {"row": row, "median_s": statistics.median(times[row]), "times_s": times[row],
                     "ratio_to_" + base: statistics.median(times[row]) / statistics.median(times[base]),
                     "round_ratio_range": [min(r := round_ratios(times[row], times[base])), max(r)]}
            table.append(entry)
        del fns  # every row's model and optimizer state: gone before the spawned memory runs (at 1024 px the
        gc.collect()  # five ViTDet-B rows hold about 14 GiB, and a spawned step beside them can exhaust 24 GiB)
        if memory:
            for entry in table:
                entry["peak_mib"] = peak_rss_mib(step_fn, family, entry["row"], img_size)
        results["families"][family] = {"baseline": base, "rows": table}
        print_table(f"{family} at {img_size} px, one training step (fwd + bwd + AdamW), fp32 CPU, batch 1, "
                    f"{results['threads']} threads, median of {repeats} round-robin rounds",
                    [{"row": e["row"], "s/step": f"{e['median_s']:.2f}",
                      f"x {base}": f"{e['ratio_to_' + base]:.2f}",
                      "per-round range": "{:.2f}-{:.2f}".format(*e["round_ratio_range"]),
                      "peak MiB": f"{e.get('peak_mib', float('nan')):.0f}"} for e in table],
                    ["row", "s/step", f"x {base}", "per-round range", "peak MiB"])
    return results
