"""Runs of the reproduction protocol as one-thread subprocesses, ``workers`` at a time (``run_pool``), each
resumable: a run whose ``result.json`` exists is not started again. Once every run has started, a run that ends
hands its core to the runs still going: the pool writes their new thread count into ``<out>/threads``
(``THREADS_FILE``), which ``winpos.d2.engine.ThreadShareHook`` applies in the training loop.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from winpos.errors import WinposError

__all__ = ["THREADS_FILE", "launch", "run_pool"]

THREADS_FILE = "threads"  # in a run's folder: how many torch threads the pool lets it use now


def launch(spec: dict, log) -> dict:
    """Run one spec (``winpos.d2.reproduce.run_one``) in a fresh one-thread process, unless its ``result.json``
    exists; returns the result. A failed run raises with the tail of its log."""
    result = Path(spec["out"]) / "result.json"
    if result.is_file():
        return json.loads(result.read_text())
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    t0 = time.time()
    log(f"start {spec['name']}")
    proc = subprocess.run([sys.executable, "-c", "import json,sys; from winpos.d2.reproduce import run_one; "
                           "run_one(json.loads(sys.argv[1]))", json.dumps(spec)],
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0 or not result.is_file():
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise WinposError(f"run {spec['name']} failed (exit {proc.returncode}); its log: {spec['out']}/log.txt\n{tail}")
    out = json.loads(result.read_text())
    log(f"done  {spec['name']}: box AP {out['bbox']['AP']:.1f}, mask AP {out['segm']['AP']:.1f} "
        f"({(time.time() - t0) / 60:.1f} min)")
    return out


def run_pool(specs, workers, log) -> list[dict]:
    """Run ``specs`` as one-thread subprocesses, ``workers`` at a time; results in spec order. Once every spec has
    started, each run that ends hands its core to the runs still going (``ThreadShareHook``)."""
    if not specs:
        return []
    from threading import Lock

    from winpos.outputs import atomic_write

    lock, state = Lock(), {"unstarted": len(specs), "active": []}  # outs of the runs going now

    def one(spec):
        stale = Path(spec["out"]) / THREADS_FILE  # from an earlier pool: the run starts at one thread
        stale.unlink(missing_ok=True)
        with lock:
            state["unstarted"] -= 1
            state["active"].append(spec["out"])
        try:
            return launch(spec, log)
        finally:
            with lock:
                state["active"].remove(spec["out"])
                if state["unstarted"] == 0 and state["active"]:
                    share = max(1, workers // len(state["active"]))
                    for out in state["active"]:  # a run just started may not have made its folder yet
                        os.makedirs(out, exist_ok=True)
                        atomic_write(os.path.join(out, THREADS_FILE), lambda f: f.write(str(share)), "w")

    with ThreadPoolExecutor(max_workers=workers) as ex:
        return list(ex.map(one, specs))
