"""Output folders a tool claims while it writes (``winpos.utils.outputs`` holds the atomic writes and the output
checks).

``claim_output_dir`` applies ``winpos.utils.outputs.check_output_dir`` to a folder a tool fills, and holds it while
the tool writes:

- it takes the folder's lock (``.winpos-run.lock``, an exclusive ``flock`` the system releases when the process
  ends), so a second process into the same folder is refused in one line naming the first, instead of both
  writing and the later one silently replacing part of the other's results;
- every file ``atomic_write`` publishes inside a claimed folder (and every file ``publish_folder`` moves there) is
  listed in the folder's manifest, ``.winpos-outputs.json``; a folder whose manifest lists files is refused unless
  ``force``, and with ``force`` exactly those files are replaced: the ones the new run does not write again are
  removed by ``OutputFolder.finish`` when its outputs are complete (an earlier sweep's ``size_96/`` goes, a file
  of the user's stays, and a run that fails half way leaves the earlier files where they were);
- nothing goes through a symbolic link inside the folder: the lock is opened with ``O_NOFOLLOW``, a write below a
  linked sub-folder is refused (``winpos.utils.outputs.refuse_linked_folders``), the files detectron2 appends to itself
  are checked first (``refuse_links``), and removal takes only regular files, never one behind a linked folder.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable

from winpos.errors import WinposError
from winpos.utils.outputs import (LOCK_NAME, MANIFEST_NAME, _claimed, _fsync_dir, _record, atomic_write_json,
                            check_output_dir, link_refusal, refuse_linked_folders)

__all__ = ["lock_folder", "OutputFolder", "claim_output_dir", "adopt_output_dir", "finish_output_dir",
           "release_output_dir", "publish_folder", "clear_outputs", "refuse_links", "staged_outputs",
           "STAGING_PREFIX"]


def _holder_note() -> str:
    import datetime
    import socket
    import sys

    started = datetime.datetime.now().isoformat(timespec="seconds")
    return f"pid {os.getpid()} on {socket.gethostname()}, started {started}: {' '.join(sys.argv)[:300]}\n"


def lock_folder(folder, refusal: str) -> int:
    """Take the exclusive lock of ``folder`` (``LOCK_NAME``, held until the process ends or the returned fd is
    closed) and write this process's note in it. When another process holds it, raise
    ``WinposError(refusal.format(holder=<its note>))``."""
    import fcntl

    path = os.path.join(os.fspath(folder), LOCK_NAME)
    try:  # never through a link: it would truncate the file it points to
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)  # output-policy: the lock, not an output
    except OSError:
        if os.path.islink(path):
            raise link_refusal(path) from None
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise WinposError(refusal.format(holder=holder)) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, _holder_note().encode(), 0)  # names the holder to the next claimant
    return fd


def _read_manifest(folder: Path) -> list[str]:
    import json

    path = folder / MANIFEST_NAME
    if not path.is_file():
        return []
    try:
        names = json.loads(path.read_text()).get("files", [])
    except (ValueError, AttributeError):
        raise WinposError(f"{path} is corrupt (not the list of files a winpos tool wrote there); delete it and the "
                          "outputs beside it by hand, or choose another folder") from None
    return [n for n in names if isinstance(n, str) and n and not os.path.isabs(n) and ".." not in Path(n).parts]


class OutputFolder:
    """A folder this process claimed (``claim_output_dir``): locked, with a manifest of the files written there.

    ``files`` is the manifest (kept on disk after every write); ``stale`` the earlier outputs a ``force`` claim
    replaces: they stay until ``finish`` (the new outputs are complete), so a run that fails leaves them."""

    def __init__(self, path: Path, lock_fd: int | None):
        self.path, self._fd = Path(path), lock_fd
        self.files = _read_manifest(self.path)
        self.fresh: list[str] = []
        self.stale: set[str] = set()

    def written(self) -> list[str]:
        """The manifest's files that exist (relative to the folder)."""
        return [n for n in self.files if (self.path / n).exists()]

    def record(self, path) -> None:
        rel = os.path.relpath(os.path.abspath(path), os.path.abspath(self.path))
        if rel == MANIFEST_NAME or rel.startswith("..") or any(part.startswith(STAGING_PREFIX)
                                                                for part in Path(rel).parts):
            return  # a staging folder's files are listed when published (``publish_folder``)
        if rel not in self.fresh:
            self.fresh.append(rel)
        if rel not in self.files:
            self.files.append(rel)
            atomic_write_json(self.path / MANIFEST_NAME, {"files": self.files})

    def finish(self) -> list[str]:
        """The new outputs are complete: remove the earlier ones they did not replace (``stale``), and the
        sub-folders this empties; the manifest then lists this run's files. Returns the names removed."""
        removed = _remove(self.path, [n for n in sorted(self.stale) if n not in self.fresh])
        self.stale, self.files = set(), list(self.fresh)
        atomic_write_json(self.path / MANIFEST_NAME, {"files": self.files})
        return removed

    def release(self) -> None:
        _claimed.pop(str(self.path.resolve()), None)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _linked_part(folder: Path, name: str) -> Path | None:
    """The first of ``folder / name`` and the folders between it and ``folder`` that is a symbolic link, or None."""
    p = folder
    for part in Path(name).parts:
        p = p / part
        if p.is_symlink():
            return p
    return None


def _remove(folder: Path, names) -> list[str]:
    """Remove the regular files ``folder / name`` and the sub-folders this empties; never through a link: a name
    that is a link, or lies under a linked sub-folder, is left (and logged), so nothing outside ``folder`` goes."""
    import logging
    import stat

    removed = []
    for name in names:
        p = folder / name
        link = _linked_part(folder, name)
        if link is not None:
            logging.getLogger(__name__).warning(f"left {p}: {link} is a symbolic link, and winpos removes only "
                                                f"files inside {folder}")
            continue
        try:
            regular = stat.S_ISREG(os.lstat(p).st_mode)
        except OSError:
            continue
        if regular:
            p.unlink()
            removed.append(name)
    for name in names:
        parent = (folder / name).parent
        while parent != folder and _linked_part(folder, os.path.relpath(parent, folder)) is None \
                and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent
    return removed


def refuse_links(folder, names: Iterable[str]) -> None:
    """Refuse (one line) when one of ``folder / name`` is a symbolic link: for files a third-party writer opens
    itself (detectron2 appends to ``log.txt`` and ``metrics.json``), checked before it opens them."""
    for name in names:
        p = os.path.join(os.fspath(folder), name)
        if os.path.islink(p):
            raise link_refusal(p)


def clear_outputs(folder, also: Iterable[str] = ()) -> list[str]:
    """Remove the files listed in ``folder``'s manifest (plus the relative names in ``also``), the sub-folders
    this leaves empty, and the manifest; returns the names removed. Nothing else in the folder is touched."""
    folder = Path(folder)
    removed = _remove(folder, list(dict.fromkeys(_read_manifest(folder) + list(also))))
    (folder / MANIFEST_NAME).unlink(missing_ok=True)
    return removed


def claim_output_dir(path, planned: Iterable[str] = (), force: bool = False, flag: str = "--output",
                     input_files: Iterable = (), lock: bool = True) -> OutputFolder:
    """``check_output_dir``, then lock the folder for this process and apply its manifest: a folder whose manifest
    lists existing files is refused unless ``force``. With ``force`` those files (and the ``planned`` names) are
    replaced: whatever the new run does not write again is removed by ``claim.finish()`` once its outputs are
    complete, so a failed run leaves the earlier files. ``lock=False`` for a folder inside one this process already
    locked. Returns the claim (also found by ``atomic_write``, which records into it)."""
    planned = list(planned)
    out = check_output_dir(path, input_files=input_files, planned=planned, force=force, flag=flag)
    key = str(out.resolve()) if out.exists() else None
    if key in _claimed:
        return _claimed[key]
    out.mkdir(parents=True, exist_ok=True)
    fd = lock_folder(out, f"{flag} {out} is in use by another process ({{holder}}); wait for it to end, or choose "
                          "another folder") if lock else None
    claim = OutputFolder(out, fd)
    earlier = claim.written()
    again = [n for n in planned if (out / n).exists()]  # written since the check, by a process now gone
    if (earlier or again) and not force:
        claim.release()
        example = (earlier or again)[0]
        raise WinposError(f"{flag} {out} already holds the outputs of an earlier run ({len(earlier) or len(again)} "
                          f"files, e.g. {example}); pass --force to replace them, or choose another folder")
    if force:
        claim.stale = set(earlier) | set(again) | {n for n in planned if (out / n).exists()}
    _claimed[str(out.resolve())] = claim
    return claim


def adopt_output_dir(path) -> OutputFolder:
    """Record what this process writes into ``path`` (a folder whose lock the caller already holds, e.g. a training
    run's ``output_dir``) in its manifest, without the checks of ``claim_output_dir``."""
    key = str(Path(path).resolve())
    if key not in _claimed:
        _claimed[key] = OutputFolder(Path(path), None)
    return _claimed[key]


def finish_output_dir(path) -> list[str]:
    """``finish`` this process's claim on ``path`` (no claim: nothing to do); returns the earlier files removed."""
    claim = _claimed.get(str(Path(path).resolve()))
    return claim.finish() if claim is not None else []


def release_output_dir(path) -> None:
    """Release this process's claim on ``path`` (the end of the process releases it too)."""
    claim = _claimed.get(str(Path(path).resolve()))
    if claim is not None:
        claim.release()


STAGING_PREFIX = ".staging-"  # the folders ``staged_outputs`` writes in before it publishes


@contextmanager
def staged_outputs(path, planned: Iterable[str] = (), force: bool = False, flag: str = "--output",
                   input_files: Iterable = ()):
    """Outputs that are complete or absent: ``claim_output_dir(path, ...)``, then yield ``(claim, staging)``, a
    folder inside ``path`` where the tool writes every output. When the block ends without an error its files are
    moved into ``path`` (``publish_folder``: each one ``os.replace``, nothing left to fail on a full disk) and the
    earlier outputs they did not replace are removed (``claim.finish``; add names to ``claim.stale`` for more).
    On any error, Ctrl-C included, the staging folder is removed and the earlier outputs stay as they were. The
    claim is released at the end (unless this process held it before)."""
    import shutil
    import tempfile

    held = str(Path(path).resolve()) in _claimed
    claim = claim_output_dir(path, planned, force=force, flag=flag, input_files=input_files)
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=claim.path))
    try:
        yield claim, staging
        publish_folder(staging, claim.path)
        claim.finish()
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if not held:
            claim.release()


def publish_folder(staging, dest) -> list[str]:
    """Move every file of the folder ``staging`` into ``dest`` by ``os.replace`` (each one atomic), recording them
    in ``dest``'s claim; returns the names. ``staging`` must be on the same file system (a folder inside ``dest``)."""
    staging, dest = Path(staging), Path(dest)
    names = sorted(p.name for p in staging.iterdir() if p.is_file())
    for name in names:
        refuse_linked_folders(dest / name)
        os.replace(staging / name, dest / name)
        _record(str(dest / name))
    _fsync_dir(str(dest))
    return names
