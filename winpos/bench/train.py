"""``benchmark.py train``: training throughput of the tiny shapes Mask R-CNN, one config per position encoding.

Each encoding's model, optimizer and ``WinposTrainer`` are built as ``tools/train_net.py`` builds them
(``winpos.d2.engine``). One batch is pulled from the training loader once and fed to every step, so data loading
is *not* measured: the time is the real step (forward with the losses, backward, optimizer step, metrics). Steps
are interleaved round-robin, one iteration of each encoding in turn, so drift hits all alike; the report gives
the median seconds per iteration after warm-up, images/s, and the speedup over abs-win.
"""
from __future__ import annotations

import itertools
import re
import statistics
import time
from pathlib import Path

import torch

from winpos.bench.timing import print_table, progress
from winpos.errors import WinposError

BASELINE = "abswin"


def available_encodings(which: str, config_dir) -> list[str]:
    """Encodings with a ``<config_dir>/mask_rcnn_{which}_toy_{encoding}.py`` file (``configs/shapes`` of a
    checkout), sorted."""
    config_dir = Path(config_dir)
    pattern = re.compile(rf"mask_rcnn_{re.escape(which)}_toy_(\w+)\.py$")
    found = sorted(m.group(1) for p in config_dir.glob("*.py") if (m := pattern.match(p.name)))
    if not found:
        raise WinposError(f"no mask_rcnn_{which}_toy_*.py under {config_dir}; pass the configs/shapes folder of a "
                          "winpos checkout, with which='hieradet' or 'vitdet'")
    return found


def _trainer(path: Path, overrides, device: str, bf16: bool, seed: int):
    from winpos.d2.config import load_config
    from winpos.d2.engine import build_model, build_optimizer
    from winpos.d2.train_loop import WinposTrainer

    cfg = load_config(path, overrides)
    cfg.train.device = device
    torch.manual_seed(seed)
    model = build_model(cfg).train()
    optimizer = build_optimizer(cfg, model)
    trainer = WinposTrainer(model, None, optimizer, amp=bf16, precision="bf16",
                            clip_grad=cfg.train.get("clip_grad", None))
    return cfg, trainer


def _fixed_batch(cfg, cache: dict):
    """The first batch of ``cfg``'s training loader (one per distinct loader config)."""
    from omegaconf import OmegaConf

    from winpos.d2.engine import build_train_loader

    key = OmegaConf.to_yaml(cfg.dataloader.train)
    if key not in cache:
        cache[key] = next(iter(build_train_loader(cfg)))
    return cache[key]


def _step(trainer, storage, i: int, cuda: bool) -> float:
    """One ``trainer.run_step()`` as iteration ``i``; returns its seconds."""
    trainer.iter = storage.iter = i
    with storage:
        t0 = time.perf_counter()
        trainer.run_step()
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0


def run(config_dir, which="hieradet", encodings=None, iters=5, warmup=1, bf16=False, overrides=(), device="cpu",
        seed=0) -> dict:
    """Time ``iters`` training steps per encoding after ``warmup`` (see the module docstring); returns the
    numbers and prints the table. ``config_dir``: the ``configs/shapes`` folder holding
    ``mask_rcnn_{which}_toy_{encoding}.py``; ``overrides``: ``key=value`` config overrides applied to every
    encoding."""
    from winpos.d2.engine import EventStorage

    config_dir = Path(config_dir)
    known = available_encodings(which, config_dir)
    encodings = list(encodings or known)
    unknown = [e for e in encodings if e not in known]
    if unknown:
        raise WinposError(f"no shapes config for encoding(s) {unknown} of {which}; available: {', '.join(known)}")
    if iters < 1:
        raise WinposError(f"iters={iters}: time at least one iteration")
    cuda = torch.device(device).type == "cuda"
    batches: dict = {}
    setups = {}
    for enc in encodings:
        path = config_dir / f"mask_rcnn_{which}_toy_{enc}.py"
        cfg, trainer = _trainer(path, list(overrides), device, bf16, seed)
        batch = _fixed_batch(cfg, batches)
        trainer.data_loader = itertools.repeat(batch)
        setups[enc] = (path, trainer, EventStorage(0), len(batch))

    torch.manual_seed(seed)
    times = {enc: [] for enc in encodings}
    bar = progress((warmup + iters) * len(encodings), "training steps")
    for i in range(warmup + iters):
        for enc, (_, trainer, storage, _) in setups.items():
            dt = _step(trainer, storage, i, cuda)
            if i >= warmup:
                times[enc].append(dt)
            bar.update()
    bar.close()

    med = {enc: statistics.median(ts) for enc, ts in times.items()}
    rows = []
    for enc, (path, trainer, storage, images) in setups.items():
        rows.append({
            "encoding": enc, "config": path.name,
            "params_m": sum(p.numel() for p in trainer.model.parameters()) / 1e6,
            "images_per_iter": images, "median_s_per_iter": med[enc], "images_per_s": images / med[enc],
            f"speedup_vs_{BASELINE}": med[BASELINE] / med[enc] if BASELINE in med else None,
            "last_total_loss": storage.history("total_loss").latest(),
        })
    results = {"which": which, "device": str(device), "threads": torch.get_num_threads(), "iters": iters,
               "warmup": warmup, "bf16": bf16, "seed": seed, "overrides": list(overrides),
               "data_loading_measured": False, "rows": rows}
    precision = "bf16 autocast" if bf16 else "fp32"
    print(f"train step of the shapes Mask R-CNN ({which}_toy), {device}, {precision}, {results['threads']} threads, "
          f"median of {iters} iterations after {warmup} warm-up, round-robin over encodings; one fixed batch pulled "
          "from the training loader once (data loading not measured)")
    print_table(f"training throughput (speedup = {BASELINE} time / this encoding's time)", rows,
                ["encoding", "params_m", "images_per_iter", "median_s_per_iter", "images_per_s",
                 f"speedup_vs_{BASELINE}", "last_total_loss"])
    return results
