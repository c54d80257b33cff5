"""The block-configuration sweep of the fused kernels (``python -m winpos.bench.kernels --sweep``): per shape and
position term, every tile shape x windows per program x warps x stages through the kernels' tuning hook
(``winpos.kernels.launch_config.set_tuned``), timed like the benchmark's rows; the fastest options per kernel
key are the candidate ``TUNED`` table for the GPU that ran it.
"""
from __future__ import annotations

import time

from .kernel_baselines import make_pos, split_qkv
from .kernel_common import VARIANTS, Shape, inputs, new_report, plan, time_fn, write

__all__ = ["SWEEP_BLOCKS", "SWEEP_STAGES", "SWEEP_WARPS", "run_sweep", "sweep_packs", "sweep_shape"]

SWEEP_BLOCKS = ((16, 16), (16, 64), (32, 32), (64, 32), (64, 64), (128, 64))
SWEEP_WARPS = (2, 4, 8)
SWEEP_STAGES = (2, 3)
MAX_PACKED_TILE = 128  # rows or keys of a tile holding several windows


def sweep_packs(blocks: tuple, q_tokens: int, k_tokens: int, windows: int) -> tuple:
    """Windows per program to try with per-window ``blocks``: 1, and when a query and a key window each fit one
    block, every power of two whose tile stays within ``MAX_PACKED_TILE`` and the image's window count."""
    bm, bn = blocks
    packs = [1]
    if q_tokens <= bm and k_tokens <= bn:
        while 2 * packs[-1] * max(bm, bn) <= MAX_PACKED_TILE and 2 * packs[-1] <= windows:
            packs.append(2 * packs[-1])
    return tuple(packs)


def sweep_shape(shape: Shape, variant: str, dtype, device, reps: int, deadline: float) -> dict:
    """The fused kernels of one shape and variant over ``SWEEP_BLOCKS`` x ``sweep_packs`` x ``SWEEP_WARPS`` x
    ``SWEEP_STAGES`` (per-window tiles no larger than twice the window's tokens); returns every timing and the
    fastest options per kernel (``"fwd"`` from the forward, ``"bwd"`` from forward+backward minus the forward) as
    ``TUNED`` entries, each with the ``blocks`` and ``pack`` it was timed with; ``refused``: the configurations
    whose ``shared_estimate`` exceeds ``SHARED_LIMIT`` (not timed: ``set_tuned`` refuses them)."""
    from winpos.kernels import launch_config as A

    cuda = device.type == "cuda"
    qkv = inputs(shape, dtype, device)
    pos = make_pos(shape, variant, device)
    geometry = plan(shape)
    nq, nk = geometry.qwh * geometry.qww, geometry.kwh * geometry.kww
    trials, best, refused = [], {}, []
    try:
        for bm, bn in SWEEP_BLOCKS:
            if bm > 2 * max(nq, 16) or bn > 2 * max(nk, 16):
                continue
            for pack in sweep_packs((bm, bn), nq, nk, geometry.n_wh * geometry.n_ww):
                keys = _keys(shape, pos, geometry, (bm, bn), pack)
                for warps in SWEEP_WARPS:
                    for stages in SWEEP_STAGES:
                        need = max(A.shared_estimate(key, stages) for key in keys.values())
                        if need > A.SHARED_LIMIT:  # set_tuned would refuse it: OutOfResources on the GPU
                            refused.append(dict(blocks=[bm, bn], pack=pack, num_warps=warps, num_stages=stages,
                                                shared_estimate=need))
                            continue
                        if time.time() > deadline:
                            return {"trials": trials, "tuned": best, "refused": refused, "cut_short": True}
                        trial = _trial(shape, pos, geometry, (bm, bn), pack, warps, stages, qkv, cuda, reps)
                        trials.append(trial)
                        if "error" in trial:
                            continue
                        for kernel in ("fwd", "bwd"):
                            key, ms = trial["keys"][kernel], trial[f"{kernel}_ms"]
                            if key not in best or ms < best[key]["ms"]:
                                best[key] = dict(num_warps=warps, num_stages=stages, blocks=[bm, bn], pack=pack,
                                                 ms=ms)
    finally:
        A.set_tuned({})
    return {"trials": trials, "tuned": best, "refused": refused, "cut_short": False}


def _keys(shape: Shape, pos, geometry, blocks: tuple, pack: int) -> dict:
    """The ``TUNED`` keys of the forward and backward launches of one configuration."""
    from winpos.kernels import launch_config as A

    bm, bn = blocks
    args = dict(HAS_ROPE=pos.rope is not None, HAS_REL=pos.rel_pos is not None, HAS_LH=pos.lookhere is not None,
                BLOCK_M=bm * pack, BLOCK_N=bn * pack, PACK=pack,
                BLOCK_D=max(16, 1 << (shape.head_dim - 1).bit_length()),
                REL_ROWS=pos.rel_pos is not None and geometry.kww == bn and pack == 1)  # as _kernel_args sets it
    return {kernel: A.launch_key(args, kernel == "bwd") for kernel in ("fwd", "bwd")}


def _trial(shape: Shape, pos, geometry, blocks: tuple, pack: int, warps: int, stages: int, qkv, cuda: bool,
           reps: int) -> dict:
    """Time one configuration through ``set_tuned`` (forward, and backward as forward+backward minus forward)."""
    from winpos.kernels import launch_config as A
    from winpos.kernels import window_attention

    opts = {"num_warps": warps, "num_stages": stages}
    keys = _keys(shape, pos, geometry, blocks, pack)
    A.set_tuned({keys["fwd"]: opts, keys["bwd"]: opts})
    trial = dict(blocks=list(blocks), pack=pack, **opts)
    fn = lambda x: window_attention(*split_qkv(x, shape.pool), window=shape.window, pos=pos, blocks=blocks, pack=pack)
    try:
        t = time_fn(fn, qkv, cuda, reps)
    except Exception as e:  # a configuration that does not compile (registers, shared memory)
        return dict(trial, error=f"{type(e).__name__}: {e}"[:200])
    return dict(trial, fwd_ms=t["fwd"]["ms"], bwd_ms=t["fwd_bwd"]["ms"] - t["fwd"]["ms"],
                keys={kernel: "|".join(map(str, key)) for kernel, key in keys.items()})


def run_sweep(shapes, dtype, device, reps, budget_s, out_path, variants=VARIANTS):
    """``sweep_shape`` for every shape and variant within ``budget_s``; ``tuned``: per shape and variant, the best
    options of each kernel key (``"fwd|BLOCK_M|BLOCK_N|BLOCK_D|terms"``), the entries for ``set_tuned``."""
    report = dict(new_report(device, dtype), sweeps=[], tuned={})
    start = time.time()
    for shape in shapes:
        for variant in variants:
            label = f"{shape.model}/{shape.block}/{variant}"
            if time.time() - start > budget_s:
                report["skipped"].append(label)
                continue
            result = sweep_shape(shape, variant, dtype, device, reps, start + budget_s)
            report["sweeps"].append(dict(label=label, **result))
            for key, best in result["tuned"].items():
                print(f"{label:45s} {key:32s} best {best}", flush=True)
            report["elapsed_s"] = time.time() - start
            write(report, out_path)
    report["tuned"] = {sweep["label"]: sweep["tuned"] for sweep in report["sweeps"]}
    write(report, out_path)
    return report
