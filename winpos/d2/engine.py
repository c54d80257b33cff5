"""Training and evaluation entry points behind ``tools/train_net.py`` (flag-compatible with detectron2's
``tools/lazyconfig_train_net.py``).

What it adds to detectron2's script: strict overrides (``winpos.d2.config``), ``train.device="auto"`` (CUDA when
present, else CPU, and DDP over gloo on CPU), AMP on any device with bf16 or fp16 (``WinposTrainer``), gradient
clipping, atomic checkpoints with exact resume (model, optimizer, scheduler, RNG states, and the data stream via
``build_resumable_train_loader(start_iter=...)``), ``metrics.json`` / TensorBoard trimmed to the resumed
iteration so they read like one uninterrupted run, ``--dataset NAME=JSON:IMAGE_ROOT`` registration in every
process, and ``train.init_checkpoint`` in any format the winpos importers read (its load report is logged).

``--eval-only`` needs weights (``train.init_checkpoint``) unless ``--random-weights`` asks for the untrained
model; it locks ``output_dir`` and writes into ``output_dir/inference`` only when that holds no evaluation yet, or
with ``--force`` (a finished run's own evaluation is not replaced by another checkpoint's by accident).
``output_dir/config.yaml`` is written (atomically) when training starts from scratch, after the model, its weights
and the data loader were built: an evaluation or a start that fails keeps the file of the run that is already
there. A resume is compared with that file first (``winpos.d2.run_dir.check_resume``): a change of what defines
the run is refused, a longer schedule or another accumulation is said and recorded.

A run is finished when its final evaluation is written (``final_results.json``, tied to the run's config and
weights by digests): ``--resume`` of a run that trained to ``max_iter`` but was stopped before or during that
evaluation runs it, and a finished run returns the recorded results (an edited file is refused).

The processes are started by ``winpos.d2.launch.launch_main`` (detectron2's ``launch``, or SLURM's / torchrun's
placement): a refusal or failure there is one ``error:`` line from the parent, as with one process.
"""
from __future__ import annotations

import copy
import inspect
import logging
import os

import torch
from detectron2.config import instantiate
from detectron2.engine import create_ddp_model, default_argument_parser, hooks
from detectron2.evaluation import inference_on_dataset, print_csv_format
from detectron2.utils import comm
from detectron2.utils.events import EventStorage
from omegaconf import OmegaConf

from winpos.d2.best import KeepBest, check_keep_best
from winpos.d2.checkpoint import CaptureRNG, RNGState, WinposCheckpointer, load_init_checkpoint
from winpos.d2.config import load_config
from winpos.d2.data import register_coco
from winpos.d2.freeze import freeze_parameters
from winpos.d2.hooks import FinalEvalHook, ResumableWriter, StopWhenAsked, trim_metrics
from winpos.d2.run_dir import (EVAL_FILES, check_resume, claim_run_dir, keep_earlier_config, lock_run_dir,
                               read_final_results, write_final_results)
from winpos.d2.startup import check_schedule, plan_of, start_up_block
from winpos.d2.train_loop import WinposTrainer, eval_autocast
from winpos.errors import WinposError
from winpos.utils.output_folders import claim_output_dir, finish_output_dir, refuse_links
from winpos.utils.outputs import atomic_write

__all__ = ["build_parser", "setup", "check_weights", "save_config",
           "resolve_device", "build_model", "build_train_loader", "do_test", "do_train",
           "main", "trim_metrics", "register_cli_datasets", "build_optimizer", "EventStorage"]

logger = logging.getLogger(__name__)


def build_parser(epilog: str | None = None):
    """detectron2's ``default_argument_parser`` plus ``--dataset NAME=JSON:IMAGE_ROOT`` (repeatable)."""
    parser = default_argument_parser(epilog)
    parser.add_argument("--random-weights", action="store_true",
                        help="with --eval-only: evaluate the untrained model on purpose (no train.init_checkpoint)")
    parser.add_argument("--dataset", action="append", default=[], metavar="NAME=JSON:IMAGE_ROOT",
                        help="register a COCO-format dataset under NAME before the config is used (repeatable); "
                             "bad annotations are skipped and counted")
    parser.add_argument("--force", action="store_true",
                        help="replace the run already in train.output_dir (its checkpoints, metrics and config are "
                             "removed first), or with --eval-only the evaluation in train.output_dir/inference; "
                             "without it such a folder is refused unless --resume")
    return parser


def register_cli_datasets(specs) -> None:
    """Register ``NAME=JSON:IMAGE_ROOT`` strings; a malformed spec or missing file raises ValueError."""
    for spec in specs or ():
        name, eq, rest = spec.partition("=")
        json_file, colon, image_root = rest.rpartition(":") if eq else ("", "", "")
        if not (name and json_file and colon and image_root):
            raise WinposError(f"--dataset {spec!r} must look like NAME=path/to/instances.json:path/to/images")
        report = register_coco(name, json_file, image_root, on_error="skip")
        if not report.dataset.get("images") or not report.dataset.get("annotations"):
            what = "images" if not report.dataset.get("images") else "annotations"
            if report.ok:  # nothing was dropped: the json itself has none
                n = len(report.dataset.get("images") or ())
                raise WinposError(f"--dataset {spec}: {json_file} lists {n} images and no {what}; a dataset to train "
                                  "or evaluate on needs annotated objects: pass a json with annotations")
            raise WinposError(f"--dataset {spec}: no usable {what} remain after dropping the bad entries "
                              f"({report.summary()}); fix the json or the image folder")
        if not report.ok:
            logger.warning(f"dataset {name}: {report.summary()}")


def resolve_device(cfg) -> str:
    """``train.device``: ``"auto"`` -> ``"cuda"`` if available else ``"cpu"``; CUDA without a GPU is an error."""
    device = str(OmegaConf.select(cfg, "train.device", default="auto") or "auto")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise WinposError(f"train.device={device!r} but this machine has no usable GPU; set train.device=auto "
                          "(or cpu) to run on the CPU")
    return device


def setup(args):
    """Load the config with ``args.opts``, resolve the device, register ``args.dataset``, check that an
    ``--eval-only`` run has weights, and set up logging (detectron2's and winpos's) and the per-rank seed, as
    detectron2's ``default_setup`` does but without writing ``config.yaml`` (``save_config`` does, later)."""
    register_cli_datasets(getattr(args, "dataset", None))
    cfg = load_config(args.config_file, args.opts)
    from winpos.d2.own_data import check_dataset_content, check_num_classes

    which = ("test",) if getattr(args, "eval_only", False) else ("train", "test")
    check_num_classes(cfg, which)  # before any work
    check_dataset_content(cfg, which)  # RLE masks: bitmask; a mask model on data without masks: refused
    cfg.train.device = resolve_device(cfg)
    check_weights(cfg, eval_only=getattr(args, "eval_only", False),
                  random_weights=getattr(args, "random_weights", False), overrides=args.opts)
    _default_setup(cfg, args)
    return cfg


def check_weights(cfg, eval_only: bool, random_weights: bool = False, overrides=()) -> None:
    """An evaluation without weights measures an untrained model: refuse it unless ``random_weights``. With
    ``random_weights`` the config's own ``train.init_checkpoint`` (a COCO config's pretrained trunk) is cleared, so
    nothing is loaded and the saved config says so; one given in ``overrides`` as well is refused."""
    checkpoint = OmegaConf.select(cfg, "train.init_checkpoint", default="")
    if eval_only and not checkpoint and not random_weights:
        raise WinposError("--eval-only without weights: set train.init_checkpoint=PATH (e.g. output_dir/"
                          "model_final.pth), or pass --random-weights to evaluate the untrained model on purpose")
    if random_weights and checkpoint:
        if any(str(o).lstrip("+").startswith("train.init_checkpoint=") for o in overrides or ()):
            raise WinposError(f"--random-weights and train.init_checkpoint={checkpoint} were both given; drop one")
        logger.info(f"--random-weights: the config's train.init_checkpoint ({checkpoint}) is not loaded")
        cfg.train.init_checkpoint = ""


def seed_process(cfg) -> int | None:
    """Seed this process's global RNGs (torch, numpy, Python ``random``) with ``train.seed + rank``; returns the seed
    used. ``train.seed: None`` draws a fresh seed (detectron2's choice: pid, time and urandom), logged by detectron2.

    The training loop draws from these global streams (the RPN's and ROI heads' sampling of proposals uses
    ``torch.randperm`` without a generator), and a new process starts them from entropy, so without this two runs
    of one config differ from the first iteration on. The data stream has its own seeded generators.
    """
    from detectron2.utils.env import seed_all_rng

    seed = OmegaConf.select(cfg, "train.seed", default=0)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise WinposError(f"train.seed={seed!r} is not an integer; set an int >= 0 (e.g. train.seed=0), or None for a "
                          "fresh draw")
    if seed is not None and seed < 0:
        raise WinposError(f"train.seed={seed} is negative; every rank and the data stream are seeded with seed + "
                          "rank: set a seed >= 0 (e.g. train.seed=0), another one for another random draw")
    seeded = None if seed is None else seed + comm.get_rank()
    seed_all_rng(seeded)
    return seeded


def _default_setup(cfg, args) -> None:
    from detectron2.utils.collect_env import collect_env_info
    from detectron2.utils.logger import setup_logger

    output_dir = OmegaConf.select(cfg, "train.output_dir", default=None)
    seed_process(cfg)  # first, so that a bad train.seed is refused before the run folder is claimed
    if comm.is_main_process() and output_dir:
        if getattr(args, "eval_only", False):  # beside a run, never over its evaluation unless --force
            lock_run_dir(output_dir)
            claim_output_dir(os.path.join(output_dir, "inference"), planned=EVAL_FILES,
                             force=getattr(args, "force", False), flag="--eval-only output")
        else:  # before log.txt: a folder holding another run, or in use by one, is refused untouched
            claim_run_dir(output_dir, resume=getattr(args, "resume", False), force=getattr(args, "force", False))
            from winpos.d2.own_data import record_datasets

            record_datasets(cfg, output_dir, resume=getattr(args, "resume", False))  # a resume on other data: refused
    rank = comm.get_rank()
    if output_dir:  # detectron2 appends to these itself: never through a link (into the file it points to)
        refuse_links(output_dir, ["log.txt" if rank == 0 else f"log.txt.rank{rank}", "metrics.json"])
    setup_logger(output_dir, distributed_rank=rank, name="fvcore")
    d2_logger = setup_logger(output_dir, distributed_rank=rank)
    setup_logger(output_dir, distributed_rank=rank, name="winpos")
    d2_logger.info(f"Rank of current process: {rank}. World size: {comm.get_world_size()}")
    _log_to_files_only(d2_logger, "Environment info:\n" + collect_env_info())  # the file keeps it, not the terminal
    d2_logger.info("Command line arguments: " + str(args))
    if not getattr(args, "eval_only", False):
        torch.backends.cudnn.benchmark = bool(OmegaConf.select(cfg, "train.cudnn_benchmark", default=False))


def _log_to_files_only(log, message: str) -> None:
    """Write ``message`` at INFO to the log's file handlers (``output_dir/log.txt``), not to the console
    (detectron2's file handler is a StreamHandler on the file: every handler not on stdout / stderr)."""
    import sys

    record = log.makeRecord(log.name, logging.INFO, __file__, 0, message, None, None)
    for handler in log.handlers:
        if getattr(handler, "stream", None) not in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            handler.handle(record)


def save_config(cfg, resume: bool = False) -> str | None:
    """Write ``output_dir/config.yaml`` atomically (main process), except on a resume that finds one there (a
    resume that changed the run's length or accumulation rewrites it before, ``check_resume``).
    Returns the path written, or None."""
    output_dir = OmegaConf.select(cfg, "train.output_dir", default=None)
    if not output_dir or not comm.is_main_process():
        return None
    path = os.path.join(output_dir, "config.yaml")
    if resume and os.path.isfile(path):
        logger.info(f"resuming: kept {path} of the run")
        return None
    import tempfile

    from detectron2.config import LazyConfig

    with tempfile.TemporaryDirectory(dir=output_dir, prefix=".config-") as tmp:
        staged = os.path.join(tmp, "config.yaml")
        LazyConfig.save(cfg, staged)  # output-policy: a private temporary folder; atomic_write below publishes it
        if not os.path.isfile(staged):  # LazyConfig.save fell back to a pickle: the config is not yaml-able
            logger.warning("the config could not be saved as yaml; config.yaml is not written")
            return None
        with open(staged, "rb") as f:
            data = f.read()
    atomic_write(path, lambda f: f.write(data), "wb")
    logger.info(f"Full config saved to {path}")
    return path


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
    plan = plan_of(cfg, comm.get_world_size())
    if plan.accum > 1:  # micro-batches, train.grad_accum_steps of them per step (cfg keeps the total)
        loader_cfg = copy.deepcopy(loader_cfg)
        loader_cfg.total_batch_size = plan.micro_total
        if "start_iter" in loader_cfg:
            loader_cfg.start_iter = start_iter * plan.accum
    return instantiate(loader_cfg)


def _training_images(loader) -> int | None:
    """Images in the training set behind ``loader``: known for winpos' resumable loader (a map-style dataset),
    None for detectron2's iterable ones."""
    try:
        return len(loader.dataset)
    except TypeError:
        return None


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
    with eval_autocast(cfg, model):
        results = inference_on_dataset(model, loader, evaluator)
    if comm.is_main_process() and results:
        print_csv_format(results)
    return results


def build_optimizer(cfg, model):
    """``cfg.optimizer`` instantiated for ``model``. The model goes into a copy of the node, so ``cfg`` stays plain
    data (``config.yaml`` does not pickle the model)."""
    opt_cfg = copy.deepcopy(cfg.optimizer)
    opt_cfg.params.model = model
    return instantiate(opt_cfg)


def do_train(cfg, resume: bool = False, extra_hooks=(), force: bool = False) -> dict:
    """Train ``cfg.model`` as configured; returns the last evaluation results (or {}). ``extra_hooks``: detectron2
    hooks registered first (their ``after_train`` runs before the final evaluation). ``train.output_dir`` is
    claimed first (``winpos.d2.run_dir``): locked, and refused when it holds another run unless ``resume`` / ``force``.
    A ``resume`` is checked against the run's ``config.yaml`` (refused, or said and recorded), and a resume of a run
    already at ``train.max_iter`` finishes it: it returns the recorded final evaluation, or runs it when it is
    missing (the run was stopped before or while writing it).
    """
    plan = plan_of(cfg, comm.get_world_size())  # refuses a batch the processes and accumulation cannot make
    check_schedule(cfg)
    keep_metric = check_keep_best(cfg)  # refused before any work when nothing periodic would be compared
    if comm.is_main_process():
        logger.info(start_up_block(cfg, comm.get_world_size(), cfg.train.device))
        claim_run_dir(cfg.train.output_dir, resume=resume, force=force)
    # Seeded here, not only in setup, so that a caller that skips setup (a library call, the reproduction's runs)
    # still gets the same run twice; a resume then restores the streams saved in its checkpoint (RNGState).
    seed_process(cfg)
    output_dir = cfg.train.output_dir
    eval_after_train = bool(cfg.train.get("eval_after_train", True))
    resuming = resume and os.path.isfile(os.path.join(output_dir, "last_checkpoint"))  # as has_checkpoint()
    changes = check_resume(cfg, output_dir) if resuming else []  # before anything is loaded into the model
    model = build_model(cfg)
    freeze_parameters(model, cfg.train.get("freeze", None))  # before the optimizer: frozen weights get no state
    optimizer = build_optimizer(cfg, model)
    model = _ddp(model, cfg)
    amp = cfg.train.get("amp", {})
    trainer = WinposTrainer(model, None, optimizer, amp=amp.get("enabled", False),
                            precision=amp.get("precision", "bf16"), clip_grad=cfg.train.get("clip_grad", None),
                            grad_accum_steps=plan.accum)
    rng = RNGState()
    checkpointer = WinposCheckpointer(model, output_dir, trainer=trainer, rng=rng)
    results = {}
    keep_best = KeepBest(model, output_dir, keep_metric, resume=resuming) \
        if keep_metric and comm.is_main_process() else None

    def test_and_keep():
        nonlocal results
        results = do_test(cfg, model)
        if keep_best is not None and results:  # after a periodic evaluation, or the one after the last iteration
            keep_best(results, min(trainer.iter + 1, cfg.train.max_iter))
        return results

    trainer.register_hooks([
        StopWhenAsked(),  # first: a preempted job stops before any hook has begun the next step
        *extra_hooks,
        hooks.IterationTimer(),
        hooks.LRScheduler(scheduler=instantiate(cfg.lr_multiplier)),
        CaptureRNG(rng, cfg.train.checkpointer.period, cfg.train.max_iter),  # every rank's, for the checkpoint
        hooks.PeriodicCheckpointer(checkpointer, **cfg.train.checkpointer) if comm.is_main_process() else None,
        FinalEvalHook(cfg.train.eval_period, test_and_keep, eval_after_train=eval_after_train),
        ResumableWriter(output_dir, cfg.train.max_iter, cfg.train.log_period) if comm.is_main_process() else None,
    ])
    if resuming:
        checkpointer.resume_or_load(cfg.train.init_checkpoint, resume=True)
        start_iter = trainer.iter + 1
    else:
        load_init_checkpoint(checkpointer, cfg.train.init_checkpoint)
        start_iter = 0
    if changes and comm.is_main_process():
        kept = keep_earlier_config(output_dir, start_iter)
        save_config(cfg)
        said = ", ".join(f"{k}={here!r} (the run had {saved!r})" for k, here, saved in changes)
        logger.warning(f"resuming with {said}"
                       f" from iteration {start_iter}: config.yaml now says so; the earlier one is kept as {kept}")
    if start_iter >= cfg.train.max_iter:
        if not (resuming and eval_after_train):
            logger.info(f"checkpoint is at iteration {start_iter}, train.max_iter={cfg.train.max_iter}: nothing to "
                        "do")
            return results
        checkpoint = checkpointer.get_checkpoint_file()
        recorded = read_final_results(output_dir, checkpoint)
        if recorded is not None:
            logger.info(f"the run is finished: its final evaluation is read from {output_dir}/final_results.json")
            return recorded
        logger.info(f"the run trained to iteration {start_iter} but its final evaluation was not written: "
                    f"evaluating {os.path.basename(checkpoint)} now")
        results = do_test(cfg, model)
        if comm.is_main_process() and results:
            write_final_results(output_dir, results, checkpoint, start_iter)
        return results
    trainer.data_loader = build_train_loader(cfg, start_iter)
    images = _training_images(trainer.data_loader)
    if images and comm.is_main_process():  # known once the data is loaded: the plan printed at the start could not
        epochs = cfg.train.max_iter * plan.total / images
        logger.info(f"training set: {images} images; {cfg.train.max_iter} iterations x {plan.total} images = "
                    f"{epochs:.1f} epochs" + (" (a small set seen many times: see train.freeze in docs/recipes.md, "
                                              "'Small data')" if epochs > 50 else ""))
    save_config(cfg, resume=start_iter > 0)
    trainer.train(start_iter, cfg.train.max_iter)
    if comm.is_main_process() and eval_after_train and results:
        write_final_results(output_dir, results, checkpointer.get_checkpoint_file(), cfg.train.max_iter)
    return results


def main(args):
    """Entry of every process: eval-only or training, per ``args`` (from ``build_parser``)."""
    cfg = setup(args)
    if args.eval_only:
        model = build_model(cfg)
        model = _ddp(model, cfg)
        load_init_checkpoint(WinposCheckpointer(model), cfg.train.init_checkpoint)
        results = do_test(cfg, model)
        if comm.is_main_process() and cfg.train.output_dir:
            finish_output_dir(os.path.join(cfg.train.output_dir, "inference"))  # --force: earlier files not rewritten
        return results
    return do_train(cfg, resume=args.resume, force=getattr(args, "force", False))


if __name__ == "__main__":  # a library module: name the command instead of exiting 0 having done nothing
    print("error: winpos.d2.engine is a library module, not a command; run winpos-train (--help says how)",
          file=__import__("sys").stderr)
    raise SystemExit(2)
