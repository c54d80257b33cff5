"""``benchmark.py posemb``: winpos relpos vs materialized relpos (detectron2's way), one ViTDet-B global block at
1024^2 (64x64 tokens, 12 heads x 64), forward and forward+backward, same outputs; attention without relpos as the
floor. winpos's path depends on autograd: forward-only (inference) builds the bias a block of queries at a time as
SDPA's float mask; forward+backward uses the augmented-QK identity (no N x N tensor kept for backward)."""
from __future__ import annotations

import torch

from winpos.attention import PositionTerms, dense_attention, reference_attention
from winpos.bench.timing import interleaved_medians, peak_rss_mib, print_table


def _no_relpos(q, k, v, window=None, pos=None):
    return reference_attention(q, k, v, window=window)


METHODS = {"winpos": reference_attention, "materialized": dense_attention, "no relpos (floor)": _no_relpos}


def _inputs(grid, heads, head_dim, grad, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, grid, grid, heads, head_dim, generator=g, requires_grad=grad) for _ in range(3))
    rel = tuple(torch.randn(2 * grid - 1, head_dim, generator=g).mul_(0.1).requires_grad_(grad) for _ in range(2))
    return q, k, v, PositionTerms(rel_pos=rel)


def _call(method, grid, heads, head_dim, backward):
    q, k, v, pos = _inputs(grid, heads, head_dim, backward)
    fn = METHODS[method]

    def run():
        out = fn(q, k, v, window=None, pos=pos)
        if backward:
            out.sum().backward()
        return out

    return run


def run(grid=64, heads=12, head_dim=64, repeats=5, warmup=1, memory=True) -> dict:
    """Time both methods at a ``grid x grid`` token grid (forward, then forward+backward); ``memory``: also their
    peak RSS growth, each in a spawned process."""
    results = {"shape": {"grid": grid, "heads": heads, "head_dim": head_dim}, "threads": torch.get_num_threads(),
               "repeats": repeats, "warmup": warmup}
    with torch.no_grad():
        q, k, v, pos = _inputs(grid, heads, head_dim, False)
        a = reference_attention(q, k, v, pos=pos)
        b = dense_attention(q, k, v, pos=pos)
        results["max_abs_diff"] = float((a - b).abs().max())
    rows = []
    for backward in (False, True):
        mode = "fwd+bwd" if backward else "fwd"
        fns = {m: _call(m, grid, heads, head_dim, backward) for m in METHODS}
        with torch.set_grad_enabled(backward):
            t = interleaved_medians(fns, repeats=repeats, warmup=warmup, desc=f"timing {mode}")
        mem = {m: peak_rss_mib(_call, m, grid, heads, head_dim, backward) if memory else None for m in METHODS}
        for m in METHODS:
            rows.append({"mode": mode, "method": m, "median_ms": t[m] * 1e3, "peak_rss_mib": mem[m],
                         "speedup_vs_materialized": t["materialized"] / t[m],
                         "memory_ratio": mem["materialized"] / max(mem[m], 1e-3) if memory else None})
    results["rows"] = rows
    print(f"relpos, one global block: {grid}x{grid} tokens, {heads} heads x {head_dim}, {results['threads']} threads, "
          f"fp32, median of {repeats} after {warmup} warm-up; max |winpos - materialized| = "
          f"{results['max_abs_diff']:.2e}")
    print_table("winpos relpos (fwd: query-block mask, fwd+bwd: augmented-QK) vs materialized", rows,
                ["mode", "method", "median_ms", "peak_rss_mib", "speedup_vs_materialized", "memory_ratio"])
    return results
