"""Training and evaluation entry points behind ``tools/train_net.py`` (flag-compatible with detectron2's
``tools/lazyconfig_train_net.py``).

What it adds to detectron2's script: strict overrides (``winpos.d2.config``), ``train.device="auto"`` (CUDA when
present, else CPU, and DDP over gloo on CPU), AMP on any device with bf16 or fp16 (``WinposTrainer``), gradient
clipping, atomic checkpoints with exact resume (model, optimizer, scheduler, RNG states, and the data stream via
``build_resumable_train_loader(start_iter=...)``), ``metrics.json`` / TensorBoard trimmed to the resumed
iteration so they read like one uninterrupted run, ``--dataset NAME=JSON:IMAGE_ROOT`` registration in every
process, and ``train.init_checkpoint`` in any format the winpos importers read.
"""
from __future__ import annotations

import inspect
import json
import logging
import os

import torch
from detectron2.config import instantiate
from detectron2.engine import create_ddp_model, default_argument_parser, default_setup, hooks, launch
from detectron2.evaluation import inference_on_dataset, print_csv_format
from detectron2.utils import comm
from detectron2.utils.events import CommonMetricPrinter, JSONWriter, TensorboardXWriter
from omegaconf import OmegaConf

from winpos.d2.checkpoint import RNGState, WinposCheckpointer, load_init_checkpoint
from winpos.d2.config import load_config
from winpos.d2.data import register_coco
from winpos.d2.train_loop import WinposTrainer

__all__ = ["build_parser", "setup", "resolve_device", "build_model", "build_train_loader", "do_test", "do_train",
           "main", "launch_main", "trim_metrics", "register_cli_datasets"]

logger = logging.getLogger("winpos")


def build_parser(epilog: str | None = None):
    """detectron2's ``default_argument_parser`` plus ``--dataset NAME=JSON:IMAGE_ROOT`` (repeatable)."""
    parser = default_argument_parser(epilog)
    parser.add_argument("--dataset", action="append", default=[], metavar="NAME=JSON:IMAGE_ROOT",
                        help="register a COCO-format dataset under NAME before the config is used (repeatable); "
                             "bad annotations are skipped and counted")
    return parser


def register_cli_datasets(specs) -> None:
    """Register ``NAME=JSON:IMAGE_ROOT`` strings; a malformed spec or missing file raises ValueError."""
    for spec in specs or ():
        name, eq, rest = spec.partition("=")
        json_file, colon, image_root = rest.rpartition(":") if eq else ("", "", "")
        if not (name and json_file and colon and image_root):
            raise ValueError(f"--dataset {spec!r} must look like NAME=path/to/instances.json:path/to/images")
        report = register_coco(name, json_file, image_root, on_error="skip")
        if not report.ok:
            logger.warning(f"dataset {name}: {report.summary()}")


def resolve_device(cfg) -> str:
    """``train.device``: ``"auto"`` -> ``"cuda"`` if available else ``"cpu"``; CUDA without a GPU is an error."""
    device = str(OmegaConf.select(cfg, "train.device", default="auto") or "auto")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"train.device={device!r} but this machine has no usable GPU; set train.device=auto "
                         "(or cpu) to run on the CPU")
    return device


def setup(args):
    """Load the config with ``args.opts``, resolve the device, register ``args.dataset``, run detectron2's
    ``default_setup`` (logging, ``config.yaml``, per-rank seed)."""
    register_cli_datasets(getattr(args, "dataset", None))
    cfg = load_config(args.config_file, args.opts)
    cfg.train.device = resolve_device(cfg)
    default_setup(cfg, args)
    return cfg


def build_model(cfg):
    model = instantiate(cfg.model)
    model.to(cfg.train.device)
    logger.info(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters")
    return model


def _ddp(model, cfg):
    ddp_cfg = dict(OmegaConf.to_container(cfg.train.get("ddp", {}), resolve=True))
    if cfg.train.device == "cpu":
        ddp_cfg["device_ids"] = None  # a CPU module takes no device ids
        if ddp_cfg.pop("fp16_compression", False):
            logger.info("train.ddp.fp16_compression ignored on CPU (gloo)")
    return create_ddp_model(model, **ddp_cfg)


def build_train_loader(cfg, start_iter: int = 0):
    """Instantiate ``dataloader.train``, passing ``start_iter`` when its target accepts it (winpos' resumable
    loader does); other loaders restart their stream on resume, which is logged."""
    loader_cfg = cfg.dataloader.train
    target = loader_cfg._target_
    if isinstance(target, str):
        from pydoc import locate

        target = locate(target)
    if "start_iter" in inspect.signature(target).parameters:
        loader_cfg.start_iter = start_iter
    elif start_iter:
        logger.warning(f"{target} takes no start_iter: the data stream restarts at resume (use "
                       "winpos.d2.data.build_resumable_train_loader for an exact resume)")
    return instantiate(loader_cfg)


def _evaluator_cfg(cfg):
    ev = cfg.dataloader.evaluator
    if "output_dir" not in ev or ev.output_dir is None:
        ev.output_dir = os.path.join(cfg.train.output_dir, "inference")
    return ev


def do_test(cfg, model, progress: bool = False) -> dict:
    """Run ``dataloader.test`` through the model and ``dataloader.evaluator`` (COCO AP); returns the results."""
    if "evaluator" not in cfg.dataloader:
        return {}
    loader = instantiate(cfg.dataloader.test)
    evaluator = instantiate(_evaluator_cfg(cfg))
    if progress and comm.is_main_process():
        from tqdm import tqdm

        loader = tqdm(loader, desc="inference", total=len(loader))
    amp = bool(OmegaConf.select(cfg, "train.amp.eval", default=False))
    device_type = cfg.train.device.split(":")[0]
    dtype = torch.float16 if OmegaConf.select(cfg, "train.amp.precision", default="bf16") == "fp16" else torch.bfloat16
    with torch.autocast(device_type, dtype=dtype, enabled=amp):
        results = inference_on_dataset(model, loader, evaluator)
    if comm.is_main_process() and results:
        print_csv_format(results)
    return results


def trim_metrics(path: str, start_iter: int) -> int:
    """Drop lines of ``metrics.json`` with ``iteration >= start_iter`` (written after the checkpoint a run
    resumes from); returns how many were dropped. Rewritten atomically."""
    if not os.path.isfile(path):
        return 0
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    keep = []
    for line in lines:
        try:
            it = json.loads(line).get("iteration", -1)
        except json.JSONDecodeError:
            continue  # a line cut off when the run was killed
        if it < start_iter:
            keep.append(line if line.endswith("\n") else line + "\n")
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.writelines(keep)
    os.replace(tmp, path)
    return len(lines) - len(keep)


class ResumableWriter(hooks.PeriodicWriter):
    """detectron2's console / metrics.json / TensorBoard writers, created when training starts so a resumed
    run first trims what the killed run wrote after its last checkpoint."""

    def __init__(self, output_dir: str, max_iter: int, period: int = 20):
        super().__init__([], period)
        self._output_dir, self._max_iter = output_dir, max_iter

    def before_train(self):
        start = self.trainer.start_iter
        metrics = os.path.join(self._output_dir, "metrics.json")
        if start > 0 and trim_metrics(metrics, start):
            logger.info(f"trimmed metrics.json to iterations < {start} (resumed run)")
        tb = {"purge_step": start} if start > 0 else {}
        self._writers = [CommonMetricPrinter(self._max_iter), JSONWriter(metrics),
                         TensorboardXWriter(self._output_dir, **tb)]


def do_train(cfg, resume: bool = False) -> dict:
    """Train ``cfg.model`` as configured; returns the last evaluation results (or {})."""
    model = build_model(cfg)
    cfg.optimizer.params.model = model
    optimizer = instantiate(cfg.optimizer)
    model = _ddp(model, cfg)
    amp = cfg.train.get("amp", {})
    trainer = WinposTrainer(model, None, optimizer, amp=amp.get("enabled", False),
                            precision=amp.get("precision", "bf16"), clip_grad=cfg.train.get("clip_grad", None))
    output_dir = cfg.train.output_dir
    checkpointer = WinposCheckpointer(model, output_dir, trainer=trainer, rng=RNGState())
    results = {}

    def test_and_keep():
        nonlocal results
        results = do_test(cfg, model)
        return results

    trainer.register_hooks([
        hooks.IterationTimer(),
        hooks.LRScheduler(scheduler=instantiate(cfg.lr_multiplier)),
        hooks.PeriodicCheckpointer(checkpointer, **cfg.train.checkpointer) if comm.is_main_process() else None,
        hooks.EvalHook(cfg.train.eval_period, test_and_keep,
                       eval_after_train=bool(cfg.train.get("eval_after_train", True))),
        ResumableWriter(output_dir, cfg.train.max_iter, cfg.train.log_period) if comm.is_main_process() else None,
    ])
    if resume and checkpointer.has_checkpoint():
        checkpointer.resume_or_load(cfg.train.init_checkpoint, resume=True)
        start_iter = trainer.iter + 1
    else:
        load_init_checkpoint(checkpointer, cfg.train.init_checkpoint)
        start_iter = 0
    if start_iter >= cfg.train.max_iter:
        logger.info(f"checkpoint is at iteration {start_iter}, train.max_iter={cfg.train.max_iter}: nothing to do")
        return results
    trainer.data_loader = build_train_loader(cfg, start_iter)
    trainer.train(start_iter, cfg.train.max_iter)
    return results


def main(args):
    """Entry of every process: eval-only or training, per ``args`` (from ``build_parser``)."""
    cfg = setup(args)
    if args.eval_only:
        model = build_model(cfg)
        model = _ddp(model, cfg)
        load_init_checkpoint(WinposCheckpointer(model), cfg.train.init_checkpoint)
        return do_test(cfg, model)
    return do_train(cfg, resume=args.resume)


def launch_main(args, main_func=main):
    """Run ``main_func(args)`` in ``args.num_gpus`` processes per machine (gloo on CPU) via detectron2's launch."""
    if args.num_gpus < 1:
        raise ValueError(f"--num-gpus={args.num_gpus}: need at least 1 process per machine")
    if torch.cuda.is_available() and args.num_gpus > torch.cuda.device_count():
        raise ValueError(f"--num-gpus={args.num_gpus} but only {torch.cuda.device_count()} GPUs are visible")
    return launch(main_func, args.num_gpus, num_machines=args.num_machines, machine_rank=args.machine_rank,
                  dist_url=args.dist_url, args=(args,))
