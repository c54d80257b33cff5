"""A study's finished runs kept as small sealed JSON files, so a study can span sessions and machines.

A run's folder (``winpos.experiments.runs``) holds weights and logs and is not meant to be committed; a study that
outlives one session (the equal-footing study needs about four hours of two cores) keeps each finished run's
``identity.json`` and ``result.json`` together in one file of an **archive** folder, one file per run, named after
the run. The archive is then the record the report reads when the run's folder is gone:

* **Sealed.** The entry's result keeps its integrity hash (of the result and the identity), so an entry edited by
  hand, or copied under another run's name, is refused in one line.
* **Matched.** An entry is used for a spec only when the spec asks for the same run: every setting equal, the
  config file's SHA-256 equal; the init checkpoint's SHA-256 is compared when that file exists here (a later stage
  whose parent is itself only archived has no weights to hash, and its parent's entry vouches for the chain).
* **Checked on re-run.** Runs are seeded and repeat bit for bit on one machine and thread count. A run made again
  (because a later stage needs its weights) is compared with its entry: the same numbers are recorded as
  reproduced; different numbers raise ``NotReproduced`` naming the first differing field, and the entry is kept.
"""
from __future__ import annotations

import json
from pathlib import Path

from winpos.errors import WinposError
from winpos.experiments import runs as R

# fields of a result that differ between two runs of the same identity without meaning anything
RESULT_VOLATILE = ("seconds", "started_utc", "integrity", "code")


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
    """The fields (dotted paths) where two results of one identity differ, ``RESULT_VOLATILE`` left out."""
    fa = _flat({k: v for k, v in a.items() if k not in RESULT_VOLATILE})
    fb = _flat({k: v for k, v in b.items() if k not in RESULT_VOLATILE})
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
    R.check_seal(entry["result"], entry["identity"], path)
    return entry


def _check_settings(entry: dict, spec: dict, path) -> None:
    """Refuse, in one line naming what differs, an entry that is not the run ``spec`` asks for."""
    held, now = entry["identity"], R.identity(spec)
    keys = sorted((set(held) | set(now)) - {"init_sha256"})
    diff = [f"{k} {now.get(k)!r} asked, {held.get(k)!r} archived" for k in keys if held.get(k) != now.get(k)]
    if now.get("init_sha256") is not None and now["init_sha256"] != held.get("init_sha256"):
        diff.append("init checkpoint: another SHA-256 than the archived run started from")
    if diff:
        hint = _folder_hint(held.get("init"), now.get("init"))
        raise WinposError(f"archive entry {path} is a run made with other settings ({'; '.join(diff[:3])}); "
                          f"{hint}pass another --archive, or delete the entry to run it again")


def _folder_hint(held, asked) -> str:
    """When the two init paths differ only in the folder above a common tail (``.../pipeline6/abs/stage0/x.pth``),
    the entry was made in another output folder: name it (the study's runs are tied to their folder's paths)."""
    if not (isinstance(held, str) and isinstance(asked, str)) or held == asked:
        return ""
    a, b = Path(held).parts, Path(asked).parts
    common = 0
    while common < min(len(a), len(b)) and a[-1 - common] == b[-1 - common]:
        common += 1
    if common < 2 or common == len(a):
        return ""
    return f"its runs were made with --output {Path(*a[:len(a) - common])}: pass that, or "


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
    from winpos.outputs import atomic_write_json

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, {"name": spec["name"], "identity": ident, "result": result})
    return "new"


def finished_or_archived(spec: dict, archive_dir) -> dict | None:
    """The result of ``spec``'s run from its folder when it finished there, else from the archive, else None."""
    res = R.finished(spec) if Path(spec["out"]).is_dir() else None
    return res if res is not None else archived(spec, archive_dir)
