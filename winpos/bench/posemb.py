"""``benchmark.py posemb``: winpos relpos vs materialized relpos (detectron2's way), one ViTDet-B global block at
1024^2 (64x64 tokens, 12 heads x 64), forward and forward+backward, same outputs; attention without relpos as the
floor. winpos's path depends on autograd: forward-only (inference) builds the bias a block of queries at a time as
SDPA's float mask; forward+backward uses ``winpos.attention.relpos_train`` (query blocks, backward by
recomputation: no N x N tensor kept for backward).

``benchmark.py flex`` (``run_flex``): the same block with relpos and with LookHere at 1024^2 and 1536^2, winpos's
path vs FlexAttention (the ``flex`` backend: the terms as a compiled ``score_mod``) vs a materialized bias."""
from __future__ import annotations

import os
import statistics

import torch

from winpos.attention import PositionTerms, dense_attention, reference_attention
from winpos.bench.timing import interleaved_medians, peak_rss_mib, print_table, round_ratios


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
    print_table("winpos relpos (fwd: query-block mask, fwd+bwd: query blocks, backward recomputed) vs materialized",
                rows,
                ["mode", "method", "median_ms", "peak_rss_mib", "speedup_vs_materialized", "memory_ratio"])
    return results


# ------------------------------------------------------------------ benchmark.py flex: FlexAttention as a peer
FLEX_TERMS = ("relpos", "lookhere")
FLEX_METHODS = ("winpos", "flex (compiled score_mod)", "materialized")


def _flex_inputs(grid, heads, head_dim, term, grad, device, seed=0):
    from winpos.posemb.lookhere import LookHere

    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, grid, grid, heads, head_dim, generator=g).to(device).requires_grad_(grad)
               for _ in range(3))
    if term == "relpos":
        rel = tuple(torch.randn(2 * grid - 1, head_dim, generator=g).mul_(0.1).to(device).requires_grad_(grad)
                    for _ in range(2))
        return q, k, v, PositionTerms(rel_pos=rel)
    lookhere = LookHere(heads, variant="45", layout="spread", layer_index=11, num_layers=12).to(device)
    return q, k, v, PositionTerms(lookhere=lookhere)


def _flex_method(method):
    from winpos.attention import attention
    from winpos.attention.flex import flex_attention

    return {"winpos": lambda q, k, v, pos: attention(q, k, v, pos=pos),
            "flex (compiled score_mod)": lambda q, k, v, pos: flex_attention(q, k, v, pos=pos),
            "materialized": lambda q, k, v, pos: dense_attention(q, k, v, pos=pos)}[method]


# Peak of a materialized (heads, N, N) fp32 bias call, in bias-sized tensors: measured 3.0-3.1x for ViTDet-B's
# global block at 1024^2 and 1536^2, forward and forward+backward (bias, logits and probabilities live together).
MATERIALIZED_PEAK_TENSORS = 3.1


def available_bytes() -> int:
    """Memory the kernel says can still be allocated (``MemAvailable``); the physical size where that is unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def flex_unmeasured(method, backward, device, grid=64, heads=12) -> str | None:
    """Why a row is not measured, or None: FlexAttention has no CPU backward in PyTorch, and a materialized CPU bias
    that would not fit in the memory left (times 1.25 for the rest of the process) would end the whole run."""
    cpu = torch.device(device).type == "cpu"
    if method.startswith("flex") and backward and cpu:
        return "not measured: PyTorch's FlexAttention has no CPU backward"
    if method == "materialized" and cpu:
        need = MATERIALIZED_PEAK_TENSORS * heads * grid ** 4 * 4
        avail = available_bytes()
        if need * 1.25 > avail:
            return (f"not measured: a materialized bias needs about {need / 2**30:.1f} GiB here, "
                    f"{avail / 2**30:.1f} GiB is available")
    return None


def flex_closure(method, term, grid, heads, head_dim, backward, device="cpu", compile_backend=None, warm=False):
    """One call of ``method`` on one global block with ``term``; module level, so a spawned process can build it
    for its peak memory. ``warm``: call it once first (FlexAttention compiles on its first call of a shape)."""
    if compile_backend is not None:
        from winpos.attention import flex

        flex.COMPILE_BACKEND = compile_backend
    q, k, v, pos = _flex_inputs(grid, heads, head_dim, term, backward, device)
    fn = _flex_method(method)
    cuda = torch.device(device).type == "cuda"

    def run():
        with torch.set_grad_enabled(backward):
            out = fn(q, k, v, pos)
            if backward:
                out.sum().backward()
        if cuda:
            torch.cuda.synchronize()
        return out

    if warm:
        run()
    return run


def run_flex(sizes=(1024, 1536), terms=FLEX_TERMS, heads=12, head_dim=64, repeats=5, warmup=1, memory=True,
             device="cpu", compile_backend="inductor") -> dict:
    """winpos's path vs FlexAttention (relpos / LookHere as a compiled ``score_mod``, LookHere's fields of view as
    its block mask) vs a materialized bias, one ViTDet-B global block per image size in ``sizes`` (tokens = size /
    16 per side), forward and forward+backward, interleaved round-robin; medians, per-round ranges and peak memory.
    ``compile_backend``: FlexAttention's torch.compile backend (``"aot_eager"`` only to check the harness quickly:
    it runs FlexAttention unfused)."""
    from winpos.attention import flex
    from winpos.bench.timing import cuda_peak_mib, interleaved_times

    flex.COMPILE_BACKEND = compile_backend
    cuda = torch.device(device).type == "cuda"
    mem_key = "peak_cuda_alloc_mib" if cuda else "peak_rss_mib"
    results = {"device": str(device), "threads": torch.get_num_threads(), "heads": heads, "head_dim": head_dim,
               "repeats": repeats, "warmup": warmup, "compile_backend": compile_backend, "memory_column": mem_key,
               "checks": [], "rows": []}
    for size in sizes:
        grid = size // 16
        for term in terms:
            with torch.no_grad():
                q, k, v, pos = _flex_inputs(grid, heads, head_dim, term, False, device)
                outs = {m: _flex_method(m)(q, k, v, pos) for m in FLEX_METHODS
                        if flex_unmeasured(m, False, device, grid, heads) is None}
            for m in [m for m in FLEX_METHODS[1:] if m in outs]:
                results["checks"].append({"size": size, "term": term, "method": m,
                                          "max_abs_diff_vs_winpos": float((outs[m] - outs["winpos"]).abs().max())})
            del outs
            for backward in (False, True):
                mode = "fwd+bwd" if backward else "fwd"
                skipped = {m: flex_unmeasured(m, backward, device, grid, heads) for m in FLEX_METHODS}
                methods = [m for m in FLEX_METHODS if skipped[m] is None]
                fns = {m: flex_closure(m, term, grid, heads, head_dim, backward, device, warm=m.startswith("flex"))
                       for m in methods}
                rounds = interleaved_times(fns, repeats=repeats, warmup=warmup,
                                           desc=f"{size}px {term} {mode}")
                del fns
                mem = {}
                for m in methods if memory else ():
                    mem[m] = (cuda_peak_mib(flex_closure(m, term, grid, heads, head_dim, backward, device, warm=True))
                              if cuda else peak_rss_mib(flex_closure, m, term, grid, heads, head_dim, backward,
                                                        device, compile_backend, True))
                for m in FLEX_METHODS:
                    ts = rounds.get(m)
                    flex_ts = rounds.get(FLEX_METHODS[1])
                    row = {"size": size, "tokens": f"{grid}x{grid}", "term": term, "mode": mode, "method": m,
                           "median_ms": statistics.median(ts) * 1e3 if ts else None,
                           "range_ms": [min(ts) * 1e3, max(ts) * 1e3] if ts else None,
                           "vs_flex_range": ([min(r), max(r)] if ts and flex_ts and
                                             (r := round_ratios(flex_ts, ts)) else None),
                           mem_key: mem.get(m),
                           "note": skipped[m]}
                    row["winpos_speedup"] = (statistics.median(ts) / statistics.median(rounds["winpos"])
                                             if ts else None)
                    results["rows"].append(row)
    print(f"one ViTDet-B global block ({heads} heads x {head_dim}), {device}, {results['threads']} threads, fp32, "
          f"median of {repeats} after {warmup} warm-up (FlexAttention compiled with {compile_backend}, compile "
          "excluded)")
    print_table("output checks (no grad; max |method - winpos|)", results["checks"],
                ["size", "term", "method", "max_abs_diff_vs_winpos"])
    print_table("winpos vs FlexAttention vs materialized bias (winpos speed-up = this row's time / winpos's; "
                "vs flex = per-round flex time / this row's)", results["rows"],
                ["size", "tokens", "term", "mode", "method", "median_ms", "range_ms", "winpos_speedup",
                 "vs_flex_range", mem_key, "note"])
    return results
