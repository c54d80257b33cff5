"""One run of the reproduction, in its own process: ``python -m winpos.experiments.child SPEC_JSON``.

The torch thread count is set once, from the spec, before any work, and never changed. Progress goes to stdout as
``[progress] ...`` lines (the pool relays them). The result is written atomically to ``<out>/result.json`` last,
sealed with a hash of itself and the run's identity, so a folder with a result is a finished run; then the files
no report reads (intermediate checkpoints, the init copy, and with ``keep_weights`` False the final weights) are
deleted.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

logger = logging.getLogger(__name__)
NO_GLOBAL_WINDOWS = (4, 2, 2, 1)  # stage-0 variant without global blocks (the stage-3 tokens still 4x4 at 64 px)


def progress(line: str) -> None:
    print(f"[progress] {line}", flush=True)


def _progress_hook(every: int):
    from winpos.d2.hooks import ProgressHook

    return ProgressHook(every, progress)


def run_stage0(spec: dict) -> dict:
    """Stage 0 (``winpos.experiments.pretrain``) on the detector's own backbone with the spec's ``encoding`` (default
    the absolute embedding of ``abs_learned``); writes ``backbone.pth`` (the trunk's
    state dict) and returns the history and reliance numbers."""
    import torch

    from winpos.d2.engine import build_model
    from winpos.experiments.pretrain import PretrainSpec, pretrain
    from winpos.experiments.protocol import PRETRAIN_SHAPES, PRETRAIN_SIZE, build_cfg
    from winpos.utils.outputs import atomic_write

    detect = dict(spec, encoding=spec.get("encoding", "abs_learned"), size=PRETRAIN_SIZE, shapes=dict(PRETRAIN_SHAPES), lr=1e-3,
                  iters=0, init="")
    cfg = build_cfg(detect)
    global_blocks = spec.get("global_blocks", True)
    if not global_blocks:  # the variant without global attention: 2x2- and 1x1-token windows in stages 3 and 4
        cfg.model.backbone.bottom_up.window_spec = NO_GLOBAL_WINDOWS
        cfg.model.backbone.bottom_up.global_blocks = ()
    torch.manual_seed(spec["seed"])
    net = build_model(cfg).backbone.bottom_up.net
    if not global_blocks and any(blk.window == 0 for blk in net.blocks):
        raise RuntimeError("the no-global variant still has a global block")
    pspec = PretrainSpec(iters=spec["iters"], mask_ratio=spec["mask_ratio"], seed=spec["seed"],
                         loss_on=spec.get("loss_on", "all"), global_blocks=global_blocks,
                         log_every=max(spec["iters"] // 15, 20))
    out = pretrain(net, pspec, list(cfg.model.pixel_mean), list(cfg.model.pixel_std),
                   image_cache=os.path.join(spec["out"], "images.npy"), progress=lambda i, n, line: progress(line))
    atomic_write(os.path.join(spec["out"], "backbone.pth"), lambda f: torch.save(net.state_dict(), f), "wb")
    os.remove(os.path.join(spec["out"], "images.npy"))  # 49 MB, made again in seconds from its seed
    return out


def evaluate_checkpoint(cfg, checkpoint: str, zero_embedding: bool = False) -> dict:
    """Box / mask AP of ``checkpoint`` on the run's test set; ``zero_embedding`` sets the token embedding to zero
    first (how much the detector relies on it)."""
    import torch

    from winpos.d2.checkpoint import WinposCheckpointer, load_init_checkpoint
    from winpos.d2.engine import build_model
    from winpos.d2.evaluate import evaluate
    from winpos.errors import WinposError

    model = build_model(cfg)
    load_init_checkpoint(WinposCheckpointer(model), checkpoint)
    if zero_embedding:
        zeroed = [p for n, p in model.backbone.bottom_up.net.named_parameters() if n.startswith("pos_embed.")]
        if not zeroed:
            raise WinposError("zero_embedding asks to zero the token embedding, but this model has none")
        with torch.no_grad():
            for param in zeroed:
                param.zero_()
    model.eval()
    return evaluate(cfg, model, os.path.join(cfg.train.output_dir, "inference"), progress=False)


def run_detect(spec: dict) -> dict:
    """Train (resuming in its own folder) and evaluate one detection run, or evaluate its init (``iters`` 0)."""
    import winpos.d2  # noqa: F401 - registrations
    from winpos.d2.engine import do_train
    from winpos.d2.hooks import log_detectron2_to_file
    from winpos.experiments.protocol import PLANTED_START, build_cfg

    log_detectron2_to_file(os.path.join(spec["out"], "d2log.txt"))
    if spec.get("family") == "vitdet":  # the ViTDet half: its init is made before the run (vitdet.make_inits)
        from winpos.experiments.vitdet import build_cfg as build_vitdet_cfg

        return do_train(build_vitdet_cfg(spec), resume=True,
                        extra_hooks=[_progress_hook(max(spec["iters"] // 10, 20))])
    if spec["encoding"] == "abs_planted" and not spec.get("init"):
        spec = dict(spec, init=os.path.join(spec["out"], "init_planted.pth"))
        if not os.path.isfile(spec["init"]):
            from winpos.experiments.checkpoints import planted_start

            planted_start(spec, spec["init"], *PLANTED_START)
    elif spec["init"].endswith("backbone.pth"):  # the stage-0 trunk: a detector init around it
        import torch

        from winpos.experiments.checkpoints import stage0_init

        trunk = torch.load(spec["init"], map_location="cpu", weights_only=True)
        spec = dict(spec, init=os.path.join(spec["out"], "init_stage0.pth"))
        stage0_init(spec, trunk, spec["init"])
    cfg = build_cfg(spec)
    if spec["iters"] == 0:
        return evaluate_checkpoint(cfg, spec["init"], zero_embedding=spec.get("zero_embedding", False))
    return do_train(cfg, resume=True, extra_hooks=[_progress_hook(max(spec["iters"] // 10, 20))])


def split_half_ap(spec: dict) -> dict:
    """Box and mask AP (x100, as detectron2 reports it) of the run's detections on the even-numbered and on the
    odd-numbered images of its test set, and on all of them (``all``: equal to the run's own AP, a check), with
    pycocotools' ``COCOeval`` on the test json the evaluation used: ``{"bbox": [even, odd],
    "segm": [...], "all": {"bbox": ..., "segm": ...}}``. The spread of an AP between two halves measures the
    evaluation noise (the variance of a whole-set AP is about a quarter of that of the difference of its halves).
    Reads the detections the evaluation just wrote."""
    import contextlib
    import io

    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    from winpos.data.shapes import ensure_shapes_dataset, one_class_json
    from winpos.experiments.protocol import build_cfg

    name = build_cfg(spec).dataloader.test.dataset.names
    gt_json = ensure_shapes_dataset(**spec["shapes"])["shapes_val"][0]
    if name == "shapes1_val":  # the one-class view the evaluation used (winpos.d2.data.register_shapes_one_class)
        gt_json = one_class_json(gt_json)
    elif name != "shapes_val":
        raise ValueError(f"split_half_ap reads the embedded shapes sets; this run evaluates on {name!r}")
    dets = json.loads((Path(spec["out"]) / "inference" / "coco_instances_results.json").read_text())
    out = {"bbox": [], "segm": [], "all": {}}
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(gt_json))
        found = gt.loadRes(dets) if dets else None
        ids = sorted(gt.getImgIds())
        for kind in ("bbox", "segm"):
            for part, key in ((ids[0::2], 0), (ids[1::2], 1), (ids, "all")):
                ap = 0.0
                if found is not None:
                    ev = COCOeval(gt, found, kind)
                    ev.params.imgIds = part
                    ev.evaluate()
                    ev.accumulate()
                    ev.summarize()
                    ap = float(ev.stats[0]) * 100
                if key == "all":
                    out["all"][kind] = ap
                else:
                    out[kind].append(ap)
    return out


def code_version() -> str:
    """The git commit of the winpos checkout this module runs from (``+dirty`` with uncommitted changes to tracked
    files), else the installed distribution's version."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD", "--show-toplevel"], capture_output=True,
                              text=True, timeout=20)
        lines = head.stdout.split()
        # a checkout of winpos itself, not an installed copy inside some other repository (a venv in a checkout)
        if head.returncode == 0 and len(lines) == 2 and Path(lines[1]).resolve() == root:
            dirty = subprocess.run(["git", "-C", str(root), "diff", "--quiet", "HEAD", "--", "winpos"],
                                   capture_output=True, timeout=20).returncode != 0
            return lines[0] + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"winpos {version('winpos')}"
    except PackageNotFoundError:
        return "unknown"


def main(spec: dict) -> None:
    import torch

    from winpos.utils.cli import quiet_third_party_warnings
    from winpos.utils.outputs import atomic_write_json

    quiet_third_party_warnings()
    torch.set_num_threads(int(spec.get("threads", 1)))  # fixed for the whole run
    t0 = time.time()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0))
    code = code_version()  # at the start: the modules this process imports are the checkout as it is now
    if spec["kind"] == "stage0":
        out = {"spec": spec, **run_stage0(spec)}
    else:
        results = run_detect(spec)
        out = {"spec": spec, "bbox": {k: float(v) for k, v in results["bbox"].items()},
               "segm": {k: float(v) for k, v in results["segm"].items()}}
        if spec.get("shapes", {}).get("val_seed") is not None:  # an evaluation set of its own: its two halves too
            out["split_half"] = split_half_ap(spec)
        if spec.get("zero_embedding"):  # what was zeroed: the embedding's window structure, kept with the result
            from winpos.experiments.checkpoints import window_structure

            out["window_structure"] = window_structure(spec["init"])
    out["seconds"] = time.time() - t0
    out["threads"] = torch.get_num_threads()
    # do_train (detection) and pretrain (stage 0) seed torch, numpy and random from the spec's seed, so this run is
    # repeatable bit for bit; results without this field predate the seeding and are one random draw each
    out["global_rng_seeded"] = True
    out["started_utc"] = started  # when this run (the attempt that finished it) began, for declared tests
    out["code"] = code  # which winpos made it: a re-made run with other code may round differently
    from winpos.experiments.runs import RESULT, prune, seal

    atomic_write_json(Path(spec["out"]) / RESULT, seal(out, spec))
    prune(spec)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
