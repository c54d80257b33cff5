"""Runs of the reproduction: each a subprocess with a fixed number of torch threads, identified by everything that
made it, reused only when all of it matches.

* **Identity.** A run's folder holds ``identity.json``: its spec (encoding, conversion, size, data, iterations, lr,
  seed, threads...) plus the SHA-256 of its config file and of its init checkpoint. Two identities are the same run
  when their **settings** are (``settings``): the config by its SHA-256, not where the file lies; the init by its
  SHA-256 where the file is here and by its place relative to the run's folder, not its absolute path; no
  measurement (time, speed) is part of it. So a clone, or a moved checkout, reuses its runs. A folder whose settings
  differ from the spec now asked for is refused in one line naming what differs (a finished 400-iteration run is
  never reported as a 100-iteration one; a changed config is another run); a folder with files but no identity is
  refused too.
* **Failures.** A run that fails raises ``RunFailed`` (an ``OSError``: the tools exit with status 1, "it failed
  while working", not 2, "bad input") naming its log.
* **Integrity.** ``result.json`` carries ``integrity``: the SHA-256 of the result and the run's identity. A result
  edited by hand, or moved into another run's folder, no longer matches and is refused in one line.
* **Disk.** A finished run keeps what the report and the later stages read: ``result.json``, ``identity.json``, its
  logs and ``model_final.pth`` (unless its spec says ``keep_weights: False``, as a finetuning run that nothing
  starts from); periodic checkpoints, the init copy and detectron2's raw predictions are deleted (``prune``). A
  killed run keeps its checkpoints until it finishes, so it resumes.
* **Progress.** The child prints a line every ``progress_every`` iterations; the pool relays it with the run's name.
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

IDENTITY = "identity.json"
RESULT = "result.json"
_VOLATILE = ("name", "out")  # where a run is and what it is called are not what made it
PATHS = ("config", "init")  # recorded in the identity, compared by content and relative place (``settings``)


class RunFailed(OSError):
    """A run of the protocol that failed while working; the message names its log."""

    def __str__(self) -> str:
        return self.args[0] if self.args else "a run failed"


def _file_sha(path: str) -> str | None:
    from winpos.experiments.checkpoints import sha256

    return sha256(path) if path and os.path.isfile(path) else None


def identity(spec: dict) -> dict:
    """What made the run of ``spec``: the spec without its name and folder, the config's and the init's SHA-256."""
    ident = {k: v for k, v in spec.items() if k not in _VOLATILE}
    ident["config_sha256"] = _file_sha(spec.get("config", ""))
    ident["init_sha256"] = _file_sha(spec.get("init", ""))
    return json.loads(json.dumps(ident))  # tuples -> lists: compared as stored


def settings(ident: dict, out=None) -> dict:
    """What made a run, wherever its files lie: ``ident`` less its file paths and less ``init_sha256`` (compared
    apart, by ``setting_differences``), plus ``init_from``, the init's path relative to the run's folder ``out``
    (None without an init, or when ``out`` is not known). The config is compared by ``config_sha256``."""
    s = {k: v for k, v in ident.items() if k not in PATHS + ("init_sha256",)}
    init = ident.get("init")
    s["init_from"] = Path(os.path.relpath(init, out)).as_posix() if init and out else None
    return s


def setting_differences(held: dict, now: dict, held_out=None, now_out=None, words=("here", "there")) -> list[str]:
    """The settings (``settings``) in which identity ``now`` (of a run in folder ``now_out``) differs from ``held``
    (made in ``held_out``), one phrase each: ``iters 400 here, 2 there``. ``init_from`` counts where both are
    known; the init's SHA-256 where both were hashed (a parent that is itself only archived has no file here)."""
    a, b = settings(held, held_out), settings(now, now_out)
    diff = [f"{k} {b.get(k)!r} {words[0]}, {a.get(k)!r} {words[1]}" for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k) and not (k == "init_from" and None in (a.get(k), b.get(k)))]
    if None not in (held.get("init_sha256"), now.get("init_sha256")) and held["init_sha256"] != now["init_sha256"]:
        diff.append("init_sha256: the init checkpoint is another file (another SHA-256) than the run started from")
    return diff


def _digest(result: dict, ident: dict) -> str:
    import hashlib

    body = {k: v for k, v in result.items() if k != "integrity"}
    text = json.dumps({"identity": ident, "result": body}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def seal(result: dict, spec: dict) -> dict:
    """``result`` with its ``integrity`` hash (of the result and ``spec``'s identity as held in its folder)."""
    path = Path(spec["out"]) / IDENTITY
    ident = json.loads(path.read_text()) if path.is_file() else identity(spec)
    result = json.loads(json.dumps(result))  # the form it is stored and read back in
    return dict(result, integrity=_digest(result, ident))


def check_seal(result: dict, ident: dict, path) -> dict:
    if result.get("integrity") != _digest(result, ident):
        raise WinposError(f"{path} does not match its integrity hash (edited by hand, or from another run); delete "
                          f"{Path(path).parent} to run it again")
    return result


_PRUNE = ("model_[0-9]*.pth", "init_*.pth", "inference/instances_predictions.pth",
          "inference/coco_instances_results.json", "events.out.tfevents.*")


def prune(spec: dict) -> list[str]:
    """Delete what no report or later stage reads from a finished run's folder (see the module docstring); returns
    the names deleted. Does nothing to an unfinished run."""
    out = Path(spec["out"])
    if not (out / RESULT).is_file():
        return []
    patterns = _PRUNE + (() if spec.get("keep_weights", True) else ("model_final.pth", "last_checkpoint"))
    gone = []
    for pattern in patterns:
        for path in sorted(out.glob(pattern)):
            path.unlink()
            gone.append(str(path.relative_to(out)))
    return gone


def claim(spec: dict) -> dict:
    """Make ``spec['out']`` this run's folder: create it with ``identity.json``, or accept it when its settings are
    this spec's (``setting_differences``); refuse a folder made by another run. Returns the identity the folder
    holds (its seal was made with it)."""
    out = Path(spec["out"])
    ident = identity(spec)
    path = out / IDENTITY
    if path.is_file():
        try:
            held = json.loads(path.read_text())
        except json.JSONDecodeError:
            raise WinposError(f"{path} is corrupt; delete {out} to run {spec['name']} again") from None
        diff = setting_differences(held, ident, spec["out"], spec["out"])
        if diff:
            raise WinposError(f"{out} holds a run made with other settings ({'; '.join(diff[:3])}); pass another "
                              f"--output, or delete {out} to replace it")
        return held
    if out.is_dir() and any(out.iterdir()):
        raise WinposError(f"{out} holds files of a run with no {IDENTITY} (made by an older winpos or another "
                          f"tool); pass another --output, or delete {out}")
    from winpos.utils.outputs import atomic_write_json

    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, ident)
    return ident


def finished(spec: dict) -> dict | None:
    """The result of ``spec``'s run when it finished with this very identity, else None (raises when the folder
    belongs to another run)."""
    result = Path(spec["out"]) / RESULT
    if not (Path(spec["out"]) / IDENTITY).is_file():
        if result.is_file():
            raise WinposError(f"{spec['out']} holds a result with no {IDENTITY} (made by an older winpos); pass "
                              f"another --output, or delete {spec['out']}")
        return None
    ident = claim(spec)
    if not result.is_file():
        return None
    try:
        held = json.loads(result.read_text())
    except json.JSONDecodeError:
        raise WinposError(f"{result} is corrupt; delete {spec['out']} to run {spec['name']} again") from None
    check_seal(held, ident, result)
    prune(spec)  # a run killed between its result and its clean-up
    return held


def launch(spec: dict, log) -> dict:
    """Run one spec (``winpos.experiments.child``) in a fresh process with ``spec['threads']`` torch threads,
    unless it finished before with the same identity; returns the result."""
    done = finished(spec)
    if done is not None:
        log(f"reuse {spec['name']} (finished before, same identity)")
        return done
    claim(spec)
    threads = str(spec.get("threads", 1))
    env = dict(os.environ, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, PYTHONWARNINGS="ignore")
    t0 = time.time()
    log(f"start {spec['name']}")
    logfile = Path(spec["out"]) / "log.txt"
    proc = subprocess.Popen([sys.executable, "-m", "winpos.experiments.child", json.dumps(spec)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    tail = []
    with open(logfile, "a") as f:  # output-policy: append-only log of this run, in the folder it claimed
        for line in proc.stdout:
            f.write(line)
            tail = (tail + [line.rstrip()])[-20:]
            if line.startswith("[progress] "):
                log(f"  {spec['name']}: {line[len('[progress] '):].rstrip()}")
    code = proc.wait()
    result = Path(spec["out"]) / RESULT
    if code != 0 or not result.is_file():
        last = next((t for t in reversed(tail) if t.strip()), "")
        raise RunFailed(f"run {spec['name']} failed (exit {code}): {last[:200]}; its log: {logfile}")
    out = json.loads(result.read_text())
    if "bbox" in out:
        log(f"done  {spec['name']}: box AP {out['bbox']['AP']:.1f}, mask AP {out['segm']['AP']:.1f} "
            f"({(time.time() - t0) / 60:.1f} min)")
    else:
        log(f"done  {spec['name']} ({(time.time() - t0) / 60:.1f} min)")
    return out


def run_pool(specs, workers: int, log) -> list[dict]:
    """Run ``specs`` ``workers`` at a time (each with its own fixed thread count); results in spec order. Every
    spec's folder is checked before any starts, so a clash is refused before work."""
    specs = list(specs)
    names = [s["name"] for s in specs]
    if len(set(names)) != len(names):
        raise WinposError(f"the protocol lists a run twice: {sorted({n for n in names if names.count(n) > 1})}")
    for s in specs:
        finished(s)  # raises for a folder of another run
    if not specs:
        return []
    with ThreadPoolExecutor(max_workers=workers) as ex:
        return list(ex.map(lambda s: launch(s, log), specs))
