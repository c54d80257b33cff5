"""Checkpoints for training: atomic periodic saves, safe loads, exact RNG resume, and ``train.init_checkpoint``
from any format winpos can import.

- ``WinposCheckpointer`` (a ``DetectionCheckpointer``) writes ``model_XXXXXXX.pth`` and then ``last_checkpoint``
  through ``winpos.utils.outputs.atomic_write``, so ``last_checkpoint`` only ever names complete files and an
  interrupted save leaves no partial file (temp files of a killed process, possible only on systems without
  ``O_TMPFILE``, are removed when the next checkpointer opens the folder). Every file is read with
  ``winpos.checkpoints.io.load_checkpoint_object`` (``torch.load(weights_only=True)``, safetensors, or a
  restricted unpickler for detectron2 ``.pkl`` files): no code in a checkpoint is ever executed.
- ``RNGState`` is a checkpointable holding the torch / CUDA / numpy / Python RNG states of every process
  (``CaptureRNG`` gathers them at each checkpoint iteration), so a resumed run, on one process or several, draws
  the same random numbers (drop path, RPN/ROI sampling) as the uninterrupted one.
- ``load_init_checkpoint`` loads a detector checkpoint (winpos or detectron2 names) through detectron2's loader,
  and anything else (MAE, detectron2 ViTDet zoo, SAM, Hiera, SAM2, timm) into the backbone through
  ``winpos.checkpoints.vitdet`` / ``winpos.checkpoints.hiera``, loading the detector parts that match by name.
  A missing file, a file with NaN/inf weights, or one that fits nothing is refused with a ``WinposError``.
"""
from __future__ import annotations

import logging
import os
import random
from urllib.parse import parse_qs, urlparse

import numpy as np
import torch
from detectron2.checkpoint import DetectionCheckpointer
from detectron2.engine import HookBase
from detectron2.utils import comm

from winpos.backbones import HieraDet, ViTDet
from winpos.checkpoints.io import check_finite_state_dict, load_checkpoint_object, unwrap_state_dict
from winpos.errors import MissingInputError, WinposError
from winpos.utils.outputs import atomic_write, remove_stale_temps

__all__ = ["WinposCheckpointer", "RNGState", "CaptureRNG", "checkpoint_flags", "load_init_checkpoint"]

logger = logging.getLogger(__name__)


QUERY_FLAGS = ("matching_heuristics", "allow_loss", "allow_other_settings")


def checkpoint_flags(path: str) -> tuple[str, dict[str, bool]]:
    """``"file.pth?matching_heuristics=True&allow_loss=True"`` -> ``("file.pth", {flag: bool})`` for the flags of
    ``QUERY_FLAGS`` (absent: False); any other query key, or a value other than true / false, is refused."""
    parsed = urlparse(path)
    flags = dict.fromkeys(QUERY_FLAGS, False)
    if not parsed.query:
        return path, flags
    query = parse_qs(parsed.query, keep_blank_values=True)
    unknown = set(query) - set(QUERY_FLAGS)
    if unknown:
        raise WinposError(f"unsupported query {sorted(unknown)} in checkpoint path {path!r}; only "
                          f"{' and '.join(f'?{f}=True' for f in QUERY_FLAGS)} are understood")
    for key, values in query.items():
        if values[-1].lower() not in ("true", "false"):
            raise WinposError(f"{key}={values[-1]!r} in checkpoint path {path!r} is neither True nor False")
        flags[key] = values[-1].lower() == "true"
    return parsed._replace(query="").geturl(), flags


def _normalize(obj, path) -> dict:
    """Put a loaded file into detectron2's checkpoint layout ``{"model": sd, ...}``."""
    if not isinstance(obj, dict):
        raise WinposError(f"checkpoint {path} holds a {type(obj).__name__}, not a dict; save a state_dict")
    if "__author__" in obj and isinstance(obj.get("model"), dict):  # detectron2 model zoo
        return {"model": obj["model"], "__author__": obj["__author__"], "matching_heuristics": True}
    if isinstance(obj.get("blobs"), dict):  # Caffe2 / Detectron1
        blobs = {k: v for k, v in obj["blobs"].items() if not k.endswith("_momentum")}
        return {"model": blobs, "__author__": "Caffe2", "matching_heuristics": True}
    if isinstance(obj.get("model_state"), dict):  # pycls
        return {"model": obj["model_state"], "__author__": "pycls", "matching_heuristics": True}
    if isinstance(obj.get("model"), dict):  # winpos / detectron2 training checkpoint
        return dict(obj)
    return {"model": unwrap_state_dict(obj, source=f"checkpoint {path}")}


class WinposCheckpointer(DetectionCheckpointer):
    """``DetectionCheckpointer`` with atomic saves and safe loads (see module docstring)."""

    def __init__(self, model, save_dir: str = "", **kwargs):
        super().__init__(model, save_dir, **kwargs)
        if self.save_dir and self.save_to_disk and os.path.isdir(self.save_dir):
            for p in remove_stale_temps(self.save_dir):
                self.logger.info(f"removed {p}, left by an interrupted save")

    def save(self, name: str, **kwargs) -> None:
        if not self.save_dir or not self.save_to_disk:
            return
        data = {"model": self.model.state_dict()}
        for key, obj in self.checkpointables.items():
            data[key] = obj.state_dict()
        data.update(kwargs)
        basename = f"{name}.pth"
        save_file = os.path.join(self.save_dir, basename)
        self.logger.info(f"Saving checkpoint to {save_file}")
        atomic_write(save_file, lambda f: torch.save(data, f), "wb")
        self.tag_last_checkpoint(basename)

    def tag_last_checkpoint(self, last_filename_basename: str) -> None:
        atomic_write(os.path.join(self.save_dir, "last_checkpoint"), lambda f: f.write(last_filename_basename), "w")

    def get_checkpoint_file(self) -> str:
        tag = os.path.join(self.save_dir, "last_checkpoint")
        if os.path.isfile(tag):
            with open(tag) as f:
                named = f.read().strip()
            if not named:
                raise WinposError(f"{tag} is empty, so it names no checkpoint to resume from; write the name of one "
                                  f"(e.g. model_final.pth) into it, or delete it to start over")
        path = super().get_checkpoint_file()
        if path and not os.path.isfile(path):
            raise WinposError(f"{os.path.join(self.save_dir, 'last_checkpoint')} names {path}, which does not exist; "
                              "restore the file, or delete last_checkpoint to start over")
        return path

    def _load_file(self, filename: str) -> dict:
        return _normalize(load_checkpoint_object(filename), filename)


def _own_rng_state() -> dict:
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"name": np_state[0], "keys": torch.from_numpy(np_state[1].astype(np.int64)),
                  "pos": int(np_state[2]), "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_own_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


class RNGState:
    """Checkpointable RNG states (torch CPU, CUDA, numpy, Python ``random``) of every process of the run.

    Saved as ``{"ranks": [state of rank 0, state of rank 1, ...]}``: ``capture`` (called on every rank at the same
    iteration, by ``CaptureRNG``) gathers them; without it only this process's state is saved. On load rank ``r``
    restores its own state. A checkpoint of another process count (or one written before the states of all ranks
    were saved, which holds rank 0's only) restores rank 0's state where it can; every other rank derives a stream
    from it and its rank, which is deterministic but not the uninterrupted run's, and this is logged.
    """

    def __init__(self):
        self._gathered = None

    def capture(self) -> None:
        """Gather every rank's current state (a collective call: every rank must call it at the same point)."""
        own = _own_rng_state()
        self._gathered = comm.all_gather(own) if comm.get_world_size() > 1 else [own]

    def state_dict(self) -> dict:
        return {"ranks": self._gathered if self._gathered is not None else [_own_rng_state()]}

    def load_state_dict(self, state: dict) -> None:
        ranks = state["ranks"] if "ranks" in state else [state]  # an older checkpoint: rank 0's state only
        rank, world = comm.get_rank(), comm.get_world_size()
        if len(ranks) == world:
            _set_own_rng_state(ranks[rank])
            return
        _set_own_rng_state(ranks[0])
        if rank == 0:
            logger.warning(f"the checkpoint holds the RNG states of {len(ranks)} process(es) and this run has {world}: "
                           "rank 0 continues from the saved state, the other ranks derive new streams, so the resumed "
                           "run is deterministic but not the uninterrupted one")
        if rank > 0:
            derived = int(torch.randint(0, 2**31 - 1, (1,))) + 1_000_003 * rank
            torch.manual_seed(derived)
            np.random.seed(derived % 2**32)
            random.seed(derived)


class CaptureRNG(HookBase):
    """Registered on every rank before ``PeriodicCheckpointer`` (which runs on rank 0 only): at each iteration
    that writes a checkpoint (every ``period``, and the last), gathers every rank's RNG state into ``rng``."""

    def __init__(self, rng: RNGState, period: int, max_iter: int):
        self.rng, self.period, self.max_iter = rng, int(period), int(max_iter)

    def after_step(self):
        it = self.trainer.iter
        if (it + 1) % self.period == 0 or it >= self.max_iter - 1:
            self.rng.capture()


def _winpos_net(model) -> tuple[str, torch.nn.Module]:
    nets = [(n, m) for n, m in model.named_modules() if isinstance(m, (ViTDet, HieraDet))]
    if len(nets) != 1:
        raise WinposError(f"expected exactly one winpos backbone in the model to load a backbone checkpoint into, "
                          f"found {len(nets)}: {[n for n, _ in nets]}")
    return nets[0]


def _check_recorded_settings(model, local: str, obj, allowed: bool) -> str:
    """Refuse weights whose recorded build (winpos-convert's entries in the file, else the run's ``config.yaml``
    beside it) differs from the model's backbone in a setting that carries no tensor (RoPE base / pairing / axis
    order / coordinates / fraction, LookHere directions and slopes, LayerNorm eps): such weights load by name and
    shape and then compute what they were never trained for. ``allowed`` (``?allow_other_settings=True``) loads
    them anyway; the returned clause (empty when nothing differs) goes into the load report."""
    from winpos.checkpoints.recorded import RecordedBuild, compare_with_record, recorded_build
    from winpos.diagnostics.extract import run_backbone_beside

    build = recorded_build(local, obj)
    if build is None:
        run = run_backbone_beside(local)
        if run is None:
            return ""
        preset, recipe, kwargs, config = run
        build = RecordedBuild(preset, recipe, kwargs, f"the run's {config}")
    nets = [m for m in model.modules() if isinstance(m, (ViTDet, HieraDet))]
    if len(nets) != 1:  # another backbone (a peer's): nothing of winpos's to compare; the load reports what fits
        return ""
    node = "model.backbone.bottom_up" if isinstance(nets[0], HieraDet) else "model.backbone.net"
    status, said = compare_with_record(nets[0], build, allowed, lambda said: (
        f"checkpoint {local} was trained for settings that carry no tensor and that this model does not have: "
        f"{said}. The weights would load by name and shape and then compute what they were not trained for. Build "
        f"the backbone as {build.where} records, {build.create_line()} (in a config: {node}.net, {node}.recipe and "
        f"those arguments), or, to finetune with this config's settings on purpose, give the path as "
        f"{local}?allow_other_settings=True"))
    if status == "allowed":
        return f"; loaded into this config's settings on purpose (?allow_other_settings=True): {said}"
    return f"; {said}" if status == "not compared" else ""  # a record this winpos cannot rebuild: loaded, and said


def load_init_checkpoint(checkpointer: DetectionCheckpointer, path: str, min_match: float = 0.9) -> str:
    """Load ``train.init_checkpoint`` into ``checkpointer.model``; returns a one-paragraph report (also logged).

    A file whose tensors mostly (``min_match``) carry the model's own names and shapes goes through detectron2's
    loader (missing / unexpected keys logged; ``?matching_heuristics=True`` is honoured there).
    Anything else is a backbone (or foreign detector) checkpoint: it is converted by the winpos importer of the
    model's backbone, and the tensors whose names and shapes match the model outside the backbone (e.g. the
    pyramid and heads of a detectron2 ViTDet zoo model) are loaded as they are.
    A partial conversion (trunk weights of the source with no place in the backbone, such as DINOv3's storage
    tokens, or trunk weights of the backbone the source lacks, which would train from their initialization) is
    refused as ``winpos-convert`` refuses it, unless the path ends in ``?allow_loss=True``. Weights whose recorded
    build (winpos-convert's entries in the file, else the run's ``config.yaml`` beside it) differs from the model's
    backbone in a setting without tensors (RoPE base, pairing, axis order, coordinates or fraction; LookHere
    directions and slopes; LayerNorm eps) are refused naming each difference, unless the path ends in
    ``?allow_other_settings=True`` (the report then lists them).
    Raises WinposError (a ValueError; ``MissingInputError``, also a FileNotFoundError, for a missing file) when the
    file does not exist, holds NaN/inf weights, converts partially, or nothing in it fits the model.
    """
    if not path:
        return "no init_checkpoint: training from scratch"
    model = checkpointer.model
    model = getattr(model, "module", model)  # DDP
    local, flags = checkpoint_flags(path)
    heuristics = flags["matching_heuristics"]
    if not os.path.isfile(local) and not os.path.isdir(local):  # a folder: a Hugging Face model folder (io reads it)
        try:
            local = checkpointer.path_manager.get_local_path(local)
        except Exception as e:  # noqa: BLE001 - iopath raises its own errors for unknown schemes
            raise MissingInputError(f"checkpoint {path!r} does not exist ({type(e).__name__}); check the path given "
                                    "as --checkpoint or train.init_checkpoint") from e
        if not os.path.isfile(local):
            raise MissingInputError(f"checkpoint {path!r} does not exist (cwd is {os.getcwd()}); check the path given "
                                    "as --checkpoint or train.init_checkpoint")
    obj = load_checkpoint_object(local)
    checkpoint = _normalize(obj, local)
    sd = checkpoint["model"]
    check_finite_state_dict(sd, f"checkpoint {path}")
    settings = _check_recorded_settings(model, local, obj, flags["allow_other_settings"])
    own = model.state_dict()
    fits = {k for k, v in sd.items() if isinstance(v, torch.Tensor) and k in own and tuple(v.shape) == own[k].shape}
    if sd and len(fits) >= min_match * len(sd):
        reshaped = {k: (tuple(v.shape), tuple(own[k].shape)) for k, v in sd.items()  # before detectron2 drops them
                    if isinstance(v, torch.Tensor) and k in own and tuple(v.shape) != tuple(own[k].shape)}
        if heuristics:
            checkpoint["matching_heuristics"] = True
        incompatible = checkpointer._load_model(checkpoint)
        if incompatible is not None:
            checkpointer._log_incompatible_keys(incompatible)
        msg = f"loaded {path} as a detector checkpoint ({len(fits)}/{len(own)} model tensors by name)" + settings
        if reshaped:  # e.g. the class layers of a detector finetuned to another class count: expected there
            shown = "; ".join(f"{k} {a} -> {b}" for k, (a, b) in list(reshaped.items())[:8])
            more = f"; and {len(reshaped) - 8} more" if len(reshaped) > 8 else ""
            msg += (f"; {len(reshaped)} tensor(s) have another shape in this model and keep their initialisation "
                    f"(expected for the class layers when the class count changes): {shown}{more}")
        logger.info(msg)
        return msg
    from winpos.checkpoints import load_external

    prefix, net = _winpos_net(model)
    net_sd = {k[len(prefix) + 1:]: v for k, v in sd.items() if k.startswith(prefix + ".")}
    source_sd = net_sd if net_sd and len(net_sd) >= 0.5 * len(sd) else sd
    net_state, report = load_external(source_sd, net)  # the one importer: detect(), then the format's converter
    if report.lost and not flags["allow_loss"]:
        from winpos.checkpoints.convert import check_no_loss

        check_no_loss(report, accept=f"give the path as {local}?allow_loss=True (in a key=value override, quoted: "
                                     f"'train.init_checkpoint=\"{local}?allow_loss=True\"')")  # winpos-convert's
    net.load_state_dict(net_state, strict=False)
    loaded = len(report.matched) + len(report.converted) + len(report.reshaped)
    outside = {k: sd[k] for k in fits if not k.startswith(prefix + ".")}
    if outside:
        model.load_state_dict(outside, strict=False)
    if loaded == 0:
        raise WinposError(f"{path} matched no parameter of the model's backbone ({type(net).__name__}) nor the "
                          "detector; check that it is a checkpoint of this architecture and size")
    msg = (f"loaded {path} into the backbone via the winpos importer ({report.source}): {loaded} backbone tensors, "
           f"plus {len(outside)} detector tensors by name{settings}\n{report.summary()}")
    logger.info(msg)
    return msg
