"""The training output folder's policy: one run per ``train.output_dir``, never taken over, never shared.

``claim_run_dir(output_dir, resume=..., force=...)`` runs before a training run writes anything there (before its
``log.txt``):

- it takes the folder's lock, ``.winpos-run.lock``: an exclusive ``flock`` held until the process ends (the system
  releases it when the process dies, so a killed run leaves no stale lock). The file names the holder (pid, host,
  start time, command line), so a second run into the folder is refused naming the first;
- a folder that holds another run (``last_checkpoint``, ``model_*.pth``, ``metrics.json`` or ``config.yaml``) is
  refused unless ``resume`` (continue it) or ``force`` (replace it: the earlier run's files are removed first, so
  no old checkpoint, metrics line, log, TensorBoard event or evaluation is left beside the new run; only files
  a run writes: its known names and those listed in the folder's manifest, ``winpos.utils.outputs``).

``lock_run_dir`` takes only the lock, for an evaluation (``--eval-only``) that writes beside a run.

Claiming a folder this process already holds returns at once, so both ``setup`` and ``do_train`` may call it.
"""
from __future__ import annotations

import os
from pathlib import Path

from winpos.errors import WinposError
from winpos.utils.output_folders import adopt_output_dir, clear_outputs, lock_folder, release_output_dir
from winpos.utils.outputs import LOCK_NAME, atomic_write, atomic_write_json

__all__ = ["claim_run_dir", "run_files", "LOCK_NAME", "release_run_dir", "lock_run_dir", "EVAL_FILES", "FINAL_RESULTS"]

FINAL_RESULTS = "final_results.json"  # the final evaluation of a finished run, with its digest (winpos.d2.engine)
_RUN_FILES = ("last_checkpoint", "metrics.json", "config.yaml")  # what marks a run (an evaluation or a start that
_RUN_GLOBS = ("model_*.pth",)                                      # failed leaves only a log.txt)
_FORCE_ALSO = ("log.txt", "log.txt.rank*", "events.out.tfevents.*", "config.until_*.yaml", FINAL_RESULTS)
EVAL_FILES = ("instances_predictions.pth", "coco_instances_results.json", "box_proposals.pkl")  # detectron2's
# COCOEvaluator writes these into output_dir/inference
_held: dict[str, int] = {}  # resolved folder -> lock file descriptor, kept open for the life of the process


def run_files(folder) -> list[Path]:
    """The files that mark an earlier training run in ``folder``: checkpoints, ``metrics.json``, ``config.yaml``."""
    return _files(folder, _RUN_FILES, _RUN_GLOBS)


def _files(folder, names, patterns) -> list[Path]:
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [folder / n for n in names if (folder / n).is_file()]
    for pattern in patterns:
        found += sorted(p for p in folder.glob(pattern) if p.is_file())
    return found


def _lock(folder: Path, flag: str) -> int:
    return lock_folder(folder, f"{flag}={folder} is in use by another training run ({{holder}}); wait for it to end, "
                               "or choose another output_dir")


def claim_run_dir(output_dir, resume: bool = False, force: bool = False,
                  flag: str = "train.output_dir") -> Path:
    """Lock ``output_dir`` for this run and apply the policy above; returns the folder (created if missing).

    Raises WinposError when another process holds the folder, or when it holds another run and neither
    ``resume`` nor ``force`` is set.
    """
    folder = Path(output_dir)
    if folder.exists() and not folder.is_dir():
        raise WinposError(f"{flag}={folder} is a file, not a folder; choose a folder for the run's outputs")
    key = str(folder.resolve())
    if key in _held:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    fd = _lock(folder, flag)  # first, so a run in progress is named as such
    earlier = run_files(folder)
    if earlier and not (resume or force):
        os.close(fd)
        names = ", ".join(sorted({p.name for p in earlier})[:4])
        raise WinposError(f"{flag}={folder} holds another run ({names}); pass --resume to continue it, --force to "
                          "replace it, or choose a new output_dir")
    _held[key] = fd
    if force and not resume:
        for p in earlier + _files(folder, (), _FORCE_ALSO):
            p.unlink(missing_ok=True)
        clear_outputs(folder)
        if (folder / "inference").is_dir():  # the run's evaluations (its own, or an --eval-only's), nothing else
            clear_outputs(folder / "inference", also=EVAL_FILES)
    adopt_output_dir(folder)  # the files this run publishes are listed in its manifest
    return folder


def lock_run_dir(output_dir, flag: str = "train.output_dir") -> Path:
    """Lock ``output_dir`` for this process without the run policy (an evaluation writing beside a run); a folder
    a training run holds is refused naming it."""
    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    key = str(folder.resolve())
    if key not in _held:
        _held[key] = _lock(folder, flag)
    return folder


def release_run_dir(output_dir) -> None:
    """Release this process's lock on ``output_dir`` (the end of the process releases it too)."""
    key = str(Path(output_dir).resolve())
    release_output_dir(output_dir)
    fd = _held.pop(key, None)
    if fd is not None:
        os.close(fd)


# ---------------------------------------------------------------------------------------------------------------
# a resume continues the saved run: what defines it must be the same

RUN_KEYS = ("model", "optimizer", "lr_multiplier", "dataloader.train", "train.seed", "train.amp", "train.clip_grad")
"""Config nodes that define a run: a resume that changes one is refused (the checkpoint's optimizer state, data
stream and RNG states belong to the saved values). ``train.freeze`` too, compared as its prefixes."""
STATED_KEYS = ("train.max_iter", "train.grad_accum_steps")
"""Config keys a resume may change: the run continues to the new length, or makes the same total batch in another
number of micro-batches; the change is logged and ``config.yaml`` rewritten (the earlier one kept)."""
_FREE = ("dataloader.train.start_iter", "dataloader.train.num_workers")  # the loader's position and speed


def _as_saved(cfg) -> dict:
    """``cfg`` as ``config.yaml`` would hold it (saved and read back), so both sides of a comparison match in
    form (tuples as lists, objects as their ``_target_`` nodes)."""
    import tempfile

    from detectron2.config import LazyConfig

    from winpos.d2.safe_config import read_yaml_as_data

    with tempfile.TemporaryDirectory(prefix="winpos-config-") as tmp:
        path = os.path.join(tmp, "config.yaml")
        LazyConfig.save(cfg, path)  # output-policy: a private temporary folder, read back and removed
        return read_yaml_as_data(path)


def _select(tree, key: str):
    node = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


_MISSING = object()


def _frozen(value) -> list:
    """``train.freeze`` as its prefixes; a config saved before the key existed froze nothing."""
    from winpos.d2.freeze import freeze_prefixes

    return list(freeze_prefixes(None if value is _MISSING else value))


def _leaf_diffs(here, saved, key: str) -> list[tuple[str, object, object]]:
    if key in _FREE:
        return []
    if isinstance(here, dict) and isinstance(saved, dict):
        out = []
        for k in list(here) + [k for k in saved if k not in here]:
            out += _leaf_diffs(here.get(k, _MISSING), saved.get(k, _MISSING), f"{key}.{k}")
        return out
    return [] if here == saved else [(key, here, saved)]


def _shown(value):
    return "(absent)" if value is _MISSING else value


def check_resume(cfg, output_dir) -> list[tuple[str, object, object]]:
    """Compare the config of a resume with the run's ``output_dir/config.yaml``. Raises WinposError naming the
    first difference in ``RUN_KEYS`` (and how many more there are); returns the changes of ``STATED_KEYS`` as
    ``[(key, new value, saved value)]``. A run without ``config.yaml`` (stopped before it was written) is not
    compared."""
    path = Path(output_dir) / "config.yaml"
    if not path.is_file():
        return []
    from winpos.d2.safe_config import read_yaml_as_data

    try:
        saved = read_yaml_as_data(path)  # data only: a tag in a copied run folder builds nothing
    except WinposError as e:
        raise WinposError(f"{e}; a resume is checked against it: restore it, or start a new run (--force, or "
                          "another train.output_dir)") from None
    if not isinstance(saved, dict):
        raise WinposError(f"{path} holds {type(saved).__name__}, not a config; a resume is checked against it: "
                          "restore it, or start a new run (--force, or another train.output_dir)")
    here = _as_saved(cfg)
    refused = [d for key in RUN_KEYS for d in _leaf_diffs(_select(here, key), _select(saved, key), key)]
    frozen = [_frozen(_select(tree, "train.freeze")) for tree in (here, saved)]
    if frozen[0] != frozen[1]:  # another optimizer's parameters; compared as prefixes ("trunk" = its module path)
        refused.append(("train.freeze", frozen[0], frozen[1]))
    if refused:
        key, new, old = refused[0]
        more = f" (and {len(refused) - 1} more: {', '.join(k for k, _, _ in refused[1:4])})" if len(refused) > 1 else ""
        raise WinposError(f"--resume: {key}={_shown(new)!r} differs from the run in {output_dir}, whose config.yaml "
                          f"has {key}={_shown(old)!r}{more}; a resume continues that run exactly: drop the override, "
                          "or start a new run (--force, or another train.output_dir)")
    return [(k, _select(here, k), _select(saved, k)) for k in STATED_KEYS if _select(here, k) != _select(saved, k)]


def keep_earlier_config(output_dir, start_iter: int) -> str:
    """Keep ``config.yaml`` as ``config.until_<start_iter>.yaml`` (what ran before a resume that changed the
    run's length or accumulation); returns the new name."""


    name = f"config.until_{start_iter:07d}.yaml"
    data = (Path(output_dir) / "config.yaml").read_bytes()
    atomic_write(Path(output_dir) / name, lambda f: f.write(data), "wb")
    return name


# ---------------------------------------------------------------------------------------------------------------
# a finished run's final evaluation, tied to its config and weights


def _sha256_file(path) -> str:
    from winpos.utils.outputs import sha256_file

    return sha256_file(path)


def _digest(body: dict) -> str:
    import hashlib
    import json

    return hashlib.sha256(json.dumps(body, sort_keys=True, allow_nan=False).encode()).hexdigest()


def _json_safe(obj):
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, float):
        return None if obj != obj or obj in (float("inf"), float("-inf")) else obj
    return obj


def _from_json(obj):
    if isinstance(obj, dict):
        return {k: _from_json(v) for k, v in obj.items()}
    return float("nan") if obj is None else obj  # pycocotools' AP of an empty size range


def write_final_results(output_dir, results: dict, checkpoint, iteration: int) -> Path:
    """Write ``output_dir/final_results.json``: the final evaluation ``results`` of ``checkpoint`` at
    ``iteration``, with the SHA-256 of the checkpoint and of ``config.yaml`` and a digest of the whole, so that
    ``read_final_results`` detects an edited result, config or checkpoint."""


    folder = Path(output_dir)
    config = folder / "config.yaml"
    body = {"iteration": int(iteration), "checkpoint": os.path.basename(checkpoint),
            "checkpoint_sha256": _sha256_file(checkpoint),
            "config_sha256": _sha256_file(config) if config.is_file() else None,
            "results": _json_safe(results)}
    atomic_write_json(folder / FINAL_RESULTS, {**body, "digest": _digest(body)})
    return folder / FINAL_RESULTS


def read_final_results(output_dir, checkpoint) -> dict | None:
    """The results recorded in ``output_dir/final_results.json`` when it is the evaluation of ``checkpoint``, else
    None (no file, or one of another checkpoint: the caller evaluates). Raises WinposError for a file that is
    corrupt or whose digest, config or checkpoint hash does not match (edited after the run wrote it)."""
    import json

    folder = Path(output_dir)
    path = folder / FINAL_RESULTS
    if not path.is_file():
        return None
    fix = (f"delete {path} and run --resume again to evaluate {os.path.basename(checkpoint)} anew")
    try:
        data = json.loads(path.read_text())
        body = {k: data[k] for k in ("iteration", "checkpoint", "checkpoint_sha256", "config_sha256", "results")}
        digest = data["digest"]
    except (ValueError, KeyError, TypeError):
        raise WinposError(f"{path} is corrupt (not a final evaluation written by winpos); {fix}") from None
    if _digest(body) != digest:
        raise WinposError(f"{path} was edited: its content does not match its digest; {fix}")
    if body["checkpoint"] != os.path.basename(checkpoint):
        return None
    config = folder / "config.yaml"
    if body["config_sha256"] != (_sha256_file(config) if config.is_file() else None):
        raise WinposError(f"{config} changed after the run's final evaluation was written ({path}); restore it, or "
                          f"{fix}")
    if body["checkpoint_sha256"] != _sha256_file(checkpoint):
        raise WinposError(f"{checkpoint} is not the file the run's final evaluation ({path}) was made from; "
                          f"restore it, or {fix}")
    return _from_json(body["results"])
