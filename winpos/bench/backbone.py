"""``benchmark.py backbone``: winpos backbones vs the implementations people use today, side by side.

Peers (``winpos.bench.peers``): detectron2's ``ViT`` (relpos in every block, as shipped, and without relpos),
segment-anything's ViT-B image encoder (its trunk: the neck is left out, as the detector's own pyramid replaces
it), sam2's Hiera-B+ and timm's HieraDet-B+ (``sam2_hiera_base_plus``). Batch 1, forward only, fp32 (and bf16
autocast with ``bf16``). winpos ``original`` rows are loaded from a peer's weights and their outputs compared.

Per row: median seconds after warm-up (all rows called round-robin), speedup over its peer (ratio of medians, and
the range of the per-round ratios: how far this machine's noise moves it), fvcore GFLOPs and
the fraction of the measured matmul throughput they reach, peak memory of one forward (RSS growth in a spawned
process on CPU, max allocated on CUDA), and with ``profile`` the top ops of each winpos row next to its peer's.

With ``compile`` every row is also timed compiled (``torch.compile``, inductor; winpos rows with
``fullgraph=True``, the peers as they trace), as the row ``"<name> (compiled)"`` against its compiled peer; the
compile happens in an untimed first call and its output is compared with the eager row's.
"""
from __future__ import annotations

import statistics

import torch

from winpos.bench.flops import count_gflops, matmul_gflops_per_s
from winpos.bench.peers import REFERENCE, ROWS, build_model, rows_for
from winpos.bench.profile import linear_ceiling, side_by_side, top_ops
from winpos.bench.timing import (cuda_peak_mib, interleaved_medians, interleaved_times, peak_rss_mib, print_table,
                                 progress, round_ratios)


def _output(model, x):
    out = model(x)
    if isinstance(out, dict):
        out = next(iter(out.values()))
    if isinstance(out, (list, tuple)):
        out = out[-1]
    return out


def _input(img_size, device="cpu"):
    return torch.randn(1, 3, img_size, img_size, generator=torch.Generator().manual_seed(0)).to(device)


def _forward_fn(model, x, bf16=False):
    """One forward of ``model(x)`` without grad (under bf16 autocast if asked), finished when it returns."""
    device_type = x.device.type

    def run():
        with torch.no_grad(), torch.autocast(device_type, dtype=torch.bfloat16, enabled=bf16):
            out = _output(model, x)
        if device_type == "cuda":
            torch.cuda.synchronize()
        return out

    return run


COMPILED = " (compiled)"


def compiled_model(name: str, model):
    """``torch.compile`` of row ``name``'s model: one graph (``fullgraph``) for winpos, the peers as they trace."""
    return torch.compile(model, fullgraph=name.startswith("winpos"))


def _base(name: str) -> str:
    return name[:-len(COMPILED)] if name.endswith(COMPILED) else name


def _peer(name: str):
    """The row ``name`` is timed against: its peer, compiled when ``name`` is."""
    peer = ROWS[_base(name)].peer
    return peer + COMPILED if peer and name.endswith(COMPILED) else peer


def forward_closure(name: str, img_size: int):
    """Module-level builder for ``peak_rss_mib``: the CPU forward of row ``name``, model built in the child (a
    compiled row is compiled and called once first, so its peak is a forward's, not the compiler's)."""
    model = build_model(_base(name), img_size)
    if name.endswith(COMPILED):
        fn = _forward_fn(compiled_model(name, model), _input(img_size))
        fn()
        return fn
    return _forward_fn(model, _input(img_size))


def _max_rel(a, b) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def run(img_size=1024, which="all", repeats=3, bf16=False, flops=True, memory=True, profile=0, device="cpu",
        warmup=1, rows=None, compile=False) -> dict:
    """Time every row of ``which`` (``"all"``, ``"vitdet"``, ``"hiera"``) at ``img_size``; print the tables and
    return every number. ``profile``: show the top-``profile`` ops of each winpos row and its peer (0: off).
    ``rows``: only the rows whose name contains one of these strings, with their peers (``peers.rows_for``).
    ``compile``: also every row compiled (see the module docstring)."""
    cuda = torch.device(device).type == "cuda"
    torch.manual_seed(0)
    names = rows_for(which, rows)
    built: dict = {}
    bar = progress(len(names), "building models")
    for name in names:
        build_model(name, img_size, built)
        bar.update()
    bar.close()
    models = {name: built[name].to(device) for name in names}
    x = _input(img_size, device)
    fns = {name: _forward_fn(m, x) for name, m in models.items()}
    eager_names = names
    if compile:
        to_compile = [n for n in eager_names if ROWS[n].compiles]
        names = names + [n + COMPILED for n in to_compile]
        bar = progress(len(to_compile), "compiling")
        for name in to_compile:
            fns[name + COMPILED] = _forward_fn(compiled_model(name, models[name]), x)
            fns[name + COMPILED]()  # the compile, untimed even with --warmup 0
            bar.update()
        bar.close()
    mem_key = "peak_cuda_alloc_mib" if cuda else "peak_rss_mib"
    results = {"img_size": img_size, "device": str(device), "threads": torch.get_num_threads(), "repeats": repeats,
               "warmup": warmup, "rows_filter": list(rows or []), "memory_column": mem_key if memory else None,
               "compiled": bool(compile), "rows": []}

    checks = [{"model": n, "source": ROWS[n].source, "max_rel_err": _max_rel(fns[n](), fns[ROWS[n].source]())}
              for n in eager_names if ROWS[n].source in models]
    checks += [{"model": n + COMPILED, "source": n + " (eager)", "max_rel_err": _max_rel(fns[n + COMPILED](), fns[n]())}
               for n in eager_names if compile and ROWS[n].compiles]
    results["output_checks"] = checks
    rounds = interleaved_times(fns, repeats=repeats, warmup=warmup, desc="timing fp32")
    times = {name: statistics.median(ts) for name, ts in rounds.items()}

    mem = {}
    if memory:
        bar = progress(len(names), "peak memory")
        for name in names:
            mem[name] = cuda_peak_mib(fns[name]) if cuda else peak_rss_mib(forward_closure, name, img_size)
            bar.update()
        bar.close()
    peak = matmul_gflops_per_s(device=device)
    results["matmul_gflops_per_s"] = peak
    gflops = {}
    for name in names:
        peer = _peer(name)
        # Traced with grad enabled: under no_grad winpos' abs embeddings return a cached grid, which the tracer
        # would have to freeze into the graph. A compiled row does the eager row's flops.
        if flops and _base(name) not in gflops:
            gflops[_base(name)] = count_gflops(models[_base(name)], x)
        gf = gflops.get(_base(name))
        results["rows"].append({
            "model": name, "peer": peer, "median_s": times[name],
            "speedup_vs_peer": times[peer] / times[name] if peer in times else None,
            "speedup_range": _range(round_ratios(rounds[peer], rounds[name])) if peer in rounds else None,
            "round_s": rounds[name],
            "speedup_vs_eager": times[_base(name)] / times[name] if name.endswith(COMPILED) else None,
            "gflops": gf, "fraction_of_matmul_peak": gf / times[name] / peak if gf is not None else None,
            mem_key: mem.get(name),
        })

    timed, names = names, eager_names  # bf16 and profiles: eager rows
    if bf16:
        bf_fns = {name: _forward_fn(m, x, bf16=True) for name, m in models.items()}
        bf_times = interleaved_medians(bf_fns, repeats=repeats, warmup=warmup, desc="timing bf16")
        results["bf16"] = [{
            "model": name, "median_s": bf_times[name], "speedup_vs_fp32": times[name] / bf_times[name],
            "speedup_vs_peer": bf_times[ROWS[name].peer] / bf_times[name] if ROWS[name].peer in bf_times else None,
            "max_rel_err_vs_fp32": _max_rel(bf_fns[name](), fns[name]()),
        } for name in names]

    if profile:
        mine = [n for n in names if n.startswith("winpos")]
        profiled = list(dict.fromkeys(mine + [ROWS[n].peer for n in mine if ROWS[n].peer in fns]))
        results["profile"] = {n: top_ops(fns[n], top=profile, cuda=cuda) for n in profiled}
        results["linear_ceiling"] = []
        for n in profiled:
            c = linear_ceiling(models[n], x)
            results["linear_ceiling"].append({
                "model": n, "median_s": times[n], "linear_s": c["linear_s"], "linear_share": c["linear_s"] / times[n],
                "linear_gflops_per_s": c["gflops_per_s"], "linear_fraction_of_peak": c["gflops_per_s"] / peak,
                "shapes": c["shapes"]})

    _report(results, timed, bf16, profile)
    return results


def _range(ratios: list[float]) -> list[float]:
    """``[min, max]`` of the per-round speedups (printed as ``min-max`` next to the ratio of medians)."""
    return [min(ratios), max(ratios)]


def _report(results, names, bf16, profile):
    mem_key = results["memory_column"]
    print(f"backbone forward, {results['img_size']}x{results['img_size']}, batch 1, fp32, {results['device']}, "
          f"{results['threads']} threads, median of {results['repeats']} after {results['warmup']} warm-up; "
          f"matmul peak {results['matmul_gflops_per_s']:.1f} GFLOP/s")
    if results["output_checks"]:
        print_table("output checks (a model loaded from its source's weights; max |a - b| / max |b|)",
                    results["output_checks"], ["model", "source", "max_rel_err"])
    refs = "; ".join(f"{fam} reference: {ref}" for fam, ref in REFERENCE.items() if ref in names)
    print_table(f"backbones (speedup = peer time / this row's time{'; ' + refs if refs else ''})", results["rows"],
                ["model", "peer", "median_s", "speedup_vs_peer", "speedup_range", "gflops", "fraction_of_matmul_peak"]
                + (["speedup_vs_eager"] if results["compiled"] else [])
                + ([mem_key] if mem_key else []))
    if bf16:
        print_table("bf16 autocast", results["bf16"],
                    ["model", "median_s", "speedup_vs_fp32", "speedup_vs_peer", "max_rel_err_vs_fp32"])
    if profile:
        print_table("linear layers alone at the shapes of one forward (linear_s: their summed time; a forward cannot "
                    "beat it; fraction of peak: their GFLOP/s over the square-matmul peak)", results["linear_ceiling"],
                    ["model", "median_s", "linear_s", "linear_share", "linear_gflops_per_s",
                     "linear_fraction_of_peak"])
        prof = results["profile"]
        for name in [n for n in names if n.startswith("winpos") and not n.endswith(COMPILED)]:
            peer = ROWS[name].peer
            if peer not in prof:
                continue
            clock = prof[name]["clock"]
            print_table(f"profile, {clock} self time, top {profile} ops: {name} ({prof[name]['total_ms']:.1f} ms) "
                        f"vs {peer} ({prof[peer]['total_ms']:.1f} ms)",
                        side_by_side(prof[name], prof[peer]), ["op", "ms", "share", "peer_ms", "peer_share"])
