"""``benchmark.py toy-step``: what one run of the reproduction costs, split into its parts, for runs alone or side
by side (the reproduction runs two at a time on 2 cores).

Each run is a fresh process with one torch thread (as ``winpos.experiments.runs`` starts them) that trains the
reproduction's detector (``configs/shapes/reproduce_hieradet.py``, abs embedding, 64 px, batch 8) from scratch for
``iters`` iterations with ``winpos.d2.engine.do_train`` and then evaluates it once. It reports, per run:

* ``import_s``: process start to torch, detectron2 and winpos imported;
* ``setup_s``: config, datasets (registration and validation), model and optimizer, up to the first iteration;
* ``step_s`` / ``data_s``: the median seconds per training iteration after the first 5 (detectron2's ``time`` and
  ``data_time`` from ``metrics.json``), and ``it_per_s`` = 1 / ``step_s``;
* ``eval_s``: the COCO evaluation of the trained model on the 200 validation images.

The child's code is passed on the command line and uses only ``winpos.d2.config.load_config`` and
``winpos.d2.engine.do_train`` / ``do_test``, so ``--tree`` can point at another checkout (an older commit) and the
same measurement runs against its code: before and after, on one machine, in one invocation.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from winpos.errors import WinposError

_CHILD = r'''
import json, os, sys, time
t0 = float(sys.argv[2])
import torch
torch.set_num_threads(1)
import detectron2, winpos.d2  # noqa: F401
from winpos.d2.config import load_config
from winpos.d2.engine import do_test, do_train
spec = json.loads(sys.argv[1])
t_import = time.time()
cfg = load_config(spec["config"], spec["overrides"])
cfg.train.eval_after_train = False
cfg.train.checkpointer.period = 10 ** 9
t_setup0 = time.time()
do_train(cfg)
t_train = time.time()
rows = [json.loads(l) for l in open(os.path.join(spec["out"], "metrics.json")) if l.strip()]
steps = [r["time"] for r in rows if "time" in r and r.get("iteration", 0) >= 5]
data = [r["data_time"] for r in rows if "data_time" in r and r.get("iteration", 0) >= 5]
t_eval0 = time.time()
from winpos.d2.engine import build_model
from winpos.d2.checkpoint import WinposCheckpointer
model = build_model(cfg)
WinposCheckpointer(model).load(os.path.join(spec["out"], "model_final.pth"))
res = do_test(cfg, model)
t_eval = time.time()
print("TOYSTEP " + json.dumps({"import_s": t_import - t0, "train_wall_s": t_train - t_setup0,
                               "steps": steps, "data": data, "eval_s": t_eval - t_eval0,
                               "box_AP": res["bbox"]["AP"] if res else None}), flush=True)
'''


def overrides(size: int = 64, iters: int = 60, out: str = "") -> list[str]:
    """The reproduction's 64 px stage-1 run as config overrides (abs embedding, one-class shapes, no warm-up
    schedule change), valid for older checkouts too."""
    return [f"train.max_iter={iters}", f"train.output_dir={out}", "train.device=cpu", "train.log_period=1",
            "model.backbone.bottom_up.pos_embed=abs", "model.backbone.bottom_up.window_pos=none",
            "model.backbone.bottom_up.global_pos=none", f"model.backbone.square_pad={size}",
            f"dataloader.train.mapper.image_size={size}", f"dataloader.test.mapper.image_size={size}"]


def run(trees, iters: int = 60) -> list[dict]:
    """One run per entry of ``trees`` (checkouts; repeat one for runs of the same code), all at once, each a
    process with one thread; returns one dict per run, in order."""
    import time

    trees = [Path(t).resolve() for t in trees]
    for tree in trees:
        if not (tree / "configs" / "shapes" / "reproduce_hieradet.py").is_file():
            raise WinposError(f"{tree} holds no configs/shapes/reproduce_hieradet.py; pass a winpos checkout")
    if iters < 10:
        raise WinposError(f"iters={iters} leaves too few steps after the 5 skipped; use >= 10")
    procs = []
    with tempfile.TemporaryDirectory(prefix="toystep-") as tmp:
        for i, tree in enumerate(trees):
            out = os.path.join(tmp, f"run{i}")
            os.makedirs(out)  # an older checkout may write into it before making it
            config = tree / "configs" / "shapes" / "reproduce_hieradet.py"
            spec = {"config": str(config), "overrides": overrides(iters=iters, out=out), "out": out}
            env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(tree),
                       PYTHONWARNINGS="ignore")
            procs.append(subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps(spec), repr(time.time())],
                                          cwd=str(tree), env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
        results = []
        for tree, p in zip(trees, procs):
            text, _ = p.communicate()
            line = next((ln for ln in text.splitlines() if ln.startswith("TOYSTEP ")), None)
            if p.returncode != 0 or line is None:
                tail = "\n".join(text.strip().splitlines()[-5:])
                raise WinposError(f"a toy-step run against {tree} failed (exit {p.returncode}):\n{tail}")
            r = json.loads(line[len("TOYSTEP "):])
            step, data = statistics.median(r["steps"]), statistics.median(r["data"])
            # the training call's wall time less its iterations: config, datasets, model, optimizer, loader
            results.append({"tree": str(tree), "import_s": r["import_s"],
                            "setup_s": max(r["train_wall_s"] - step * iters, 0.0), "step_s": step, "data_s": data,
                            "it_per_s": 1 / step, "eval_s": r["eval_s"], "box_AP": r["box_AP"]})
    return results


def compare(before, after, iters: int = 60, repeats: int = 2, log=print) -> dict:
    """``repeats`` rounds, each running one ``before`` and one ``after`` run at the same time (two processes on two
    cores, as the reproduction runs them), so both see the same machine; medians per side and after/before."""
    rounds = []
    for i in range(repeats):
        pair = run([before, after] if i % 2 == 0 else [after, before], iters)
        b, a = (pair[0], pair[1]) if i % 2 == 0 else (pair[1], pair[0])
        rounds.append({"before": b, "after": a})
        log(f"round {i + 1}/{repeats}: before {b['it_per_s']:.2f} it/s, after {a['it_per_s']:.2f} it/s")
    keys = ("import_s", "setup_s", "step_s", "data_s", "it_per_s", "eval_s")
    med = {side: {k: statistics.median(r[side][k] for r in rounds) for k in keys} for side in ("before", "after")}
    return {"iters": iters, "rounds": rounds, "median": med,
            "ratio_it_per_s": med["after"]["it_per_s"] / med["before"]["it_per_s"]}


def format_compare(result: dict, before: str, after: str) -> str:
    med = result["median"]
    lines = [f"| seconds (median of {len(result['rounds'])} rounds) | before: {before} | after: {after} |",
             "|---|---|---|"]
    names = {"import_s": "imports", "setup_s": "setup (config, data, model) to the first step",
             "step_s": "one training iteration (64 px, batch 8)", "data_s": "  of which data loading",
             "eval_s": "evaluation (200 images, build + load + COCO AP)"}
    for k, name in names.items():
        lines.append(f"| {name} | {med['before'][k]:.3f} | {med['after'][k]:.3f} |")
    lines.append(f"| iterations/s | {med['before']['it_per_s']:.2f} | {med['after']['it_per_s']:.2f} "
                 f"(x{result['ratio_it_per_s']:.2f}) |")
    return "\n".join(lines)
