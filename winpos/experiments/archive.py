"""A study's finished runs kept as small sealed JSON files, so a study can span sessions and machines.

A run's folder (``winpos.experiments.runs``) holds weights and logs and is not meant to be committed; a study that
outlives one session (the equal-footing study needs about four hours of two cores) keeps each finished run's
``identity.json`` and ``result.json`` together in one file of an **archive** folder, one file per run, named after
the run. The archive is then the record the report reads when the run's folder is gone:

* **Sealed.** The entry's result keeps its integrity hash (of the result and the identity), so an entry edited by
  hand, or copied under another run's name, is refused in one line.
* **Matched.** An entry is used for a spec only when the spec asks for the same run (``runs.setting_differences``):
  every setting equal, the config file's SHA-256 equal (not its path: a fresh clone or a moved checkout reads the
  archive), the init at the same place relative to the run's folder (not the same absolute path: another
  ``--output`` reads it too); the init checkpoint's SHA-256 is compared when that file exists here (a later stage
  whose parent is itself only archived has no weights to hash, and its parent's entry vouches for the chain).
* **Checked on re-run.** Runs are seeded and repeat bit for bit on one machine and thread count. A run made again
  (because a later stage needs its weights) is compared with its entry, measurements (time, speed) and paths left
  out: the same numbers are recorded as reproduced; different numbers raise ``NotReproduced`` naming the first
  differing field, and the entry is kept.
"""
from __future__ import annotations

import json
from pathlib import Path

from winpos.errors import WinposError
from winpos.experiments import runs as R

# fields of a result that differ between two runs of the same identity without meaning anything
RESULT_VOLATILE = ("seconds", "iters_per_s", "started_utc", "integrity", "code")
# where the run's files lay (its spec, kept in the result): compared as settings, by content and relative place
RESULT_PATHS = ("spec.out", "spec.config", "spec.init")


class NotReproduced(WinposError):
    """A run made again gave other numbers than its archived entry."""


def entry_path(archive_dir, name: str) -> Path:
    """The archive file of run ``name`` (``p0/abs/stage1`` -> ``p0__abs__stage1.json``)."""
    return Path(archive_dir) / (name.replace("/", "__") + ".json")


def _flat(obj, prefix: str = "") -> dict:
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    if isinstance(obj, list):
        out = {}
        for i, v in enumerate(obj):
            out.update(_flat(v, f"{prefix}{i}."))
        return out
    return {prefix.rstrip("."): obj}


def result_differences(a: dict, b: dict) -> list[str]:
    """The fields (dotted paths) where two results of one identity differ, ``RESULT_VOLATILE`` (measurements) and
    ``RESULT_PATHS`` (where its files lay) left out."""
    fa, fb = ({k: v for k, v in _flat({k: v for k, v in r.items() if k not in RESULT_VOLATILE}).items()
               if k not in RESULT_PATHS} for r in (a, b))
    return [f"{k}: {fa.get(k)!r} archived, {fb.get(k)!r} now" for k in sorted(set(fa) | set(fb))
            if not _same(fa.get(k), fb.get(k))]


def _same(a, b) -> bool:
    """Equal, counting NaN as equal to NaN (COCO's AP of an empty size range is NaN in every run)."""
    return a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)


def read_entry(path) -> dict:
    """One archive entry, its seal checked."""
    path = Path(path)
    try:
        entry = json.loads(path.read_text())
    except json.JSONDecodeError:
        raise WinposError(f"archive entry {path} is corrupt (not JSON); restore it from git or delete it") from None
    if not isinstance(entry, dict) or not {"name", "identity", "result"} <= set(entry):
        raise WinposError(f"archive entry {path} lacks name / identity / result; restore it from git or delete it")
    try:
        R.check_seal(entry["result"], entry["identity"], path)
    except WinposError:
        raise WinposError(f"archive entry {path} (run {entry['name']}) does not match its integrity hash (edited by "
                          f"hand, or copied from another run); restore that file from git, or delete just that file "
                          f"to make run {entry['name']} again (the other entries stay)") from None
    return entry


def _check_settings(entry: dict, spec: dict, path) -> None:
    """Refuse, in one line naming what differs, an entry that is not the run ``spec`` asks for. The entry's run
    folder is read from its result's spec (older entries without one compare every setting but the init's place)."""
    held_spec = entry["result"].get("spec")
    held_out = held_spec.get("out") if isinstance(held_spec, dict) else None
    diff = R.setting_differences(entry["identity"], R.identity(spec), held_out, spec["out"], ("asked", "archived"))
    if diff:
        raise WinposError(f"archive entry {path} is a run made with other settings ({'; '.join(diff[:3])}); "
                          f"pass another --archive, or delete just that entry ({Path(path).name}) to run "
                          f"{spec['name']} again")


def archived(spec: dict, archive_dir) -> dict | None:
    """The archived result of ``spec``'s run, or None when the archive has no entry under its name. An entry made
    with other settings is refused in one line naming them."""
    if not archive_dir:
        return None
    path = entry_path(archive_dir, spec["name"])
    if not path.is_file():
        return None
    entry = read_entry(path)
    _check_settings(entry, spec, path)
    return entry["result"]


def keep(spec: dict, archive_dir) -> str:
    """Put the finished run of ``spec`` into the archive. Returns ``"new"`` (first entry), ``"reproduced"`` (an
    entry with the same identity and the same numbers was there) ; raises ``NotReproduced`` when the numbers
    differ and ``WinposError`` when the run has not finished."""
    result = R.finished(spec)
    if result is None:
        raise WinposError(f"run {spec['name']} has not finished ({spec['out']}); nothing to archive")
    ident = json.loads((Path(spec["out"]) / R.IDENTITY).read_text())
    path = entry_path(archive_dir, spec["name"])
    if path.is_file():
        held = read_entry(path)
        _check_settings(held, spec, path)
        changed = result_differences(held["result"], result)
        if changed:
            raise NotReproduced(f"run {spec['name']} made again differs from its archived entry in "
                                f"{len(changed)} field(s), first {changed[0]}; the entry ({path}) is kept")
        return "reproduced"
    from winpos.utils.outputs import atomic_write_json

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, {"name": spec["name"], "identity": ident, "result": result})
    return "new"


def finished_or_archived(spec: dict, archive_dir) -> dict | None:
    """The result of ``spec``'s run from its folder when it finished there, else from the archive, else None."""
    res = R.finished(spec) if Path(spec["out"]).is_dir() else None
    return res if res is not None else archived(spec, archive_dir)
