"""How every winpos tool writes files: atomically, never over an input, never over an existing output unless asked.

The API in short (every writer in ``winpos`` and ``tools`` follows it; ``tests/test_output_policy.py`` walks them):

1. Before any work, check every output: ``check_output_file(path, inputs=..., force=args.force, flag="--json")``
   for a file, ``check_output_dir(folder, planned=[names], force=...)`` for a folder of known files, and
   ``winpos.d2.run_dir.claim_run_dir`` for a training ``output_dir`` (refused when it holds another run; locked).
   An existing output is replaced only with ``force`` (``--force`` on the command line).
2. Write through this module: ``atomic_write(path, lambda f: torch.save(sd, f))``, ``atomic_write_text``,
   ``atomic_write_json`` or ``atomic_savefig`` (a matplotlib figure). Any ``open(..., "w")``, ``torch.save``,
   ``json.dump``, ``savefig``, ``Image.save``, ``write_text`` / ``write_bytes`` or ``shutil.copy`` outside an
   ``atomic_write(...)`` call (or outside a function passed to one) bypasses the policy, and the writer walk fails
   naming its file:line. A write that is correct without it (a staging folder renamed into place as a whole, an
   append-only log, a ``/proc`` control file) carries the comment ``# output-policy: <why>`` on its line, which
   the walk accepts and nothing else does.

``atomic_write`` is the one writer. The data goes to a temporary file in the destination's folder, is flushed to
disk (``fsync``) and renamed over the destination, so a reader sees the old file or the new one, never a part.
On Linux the temporary file is anonymous (``O_TMPFILE``) until it is complete, so even a process killed with
SIGKILL mid-write leaves nothing behind; elsewhere it is ``<name>.<pid>.tmp``, removed on any error.

``check_output_file`` / ``check_output_dir`` apply the output policy before any work starts: the output must not
be one of the inputs (or, for a folder, hold them), an existing output is refused unless ``force``, and the
location must be writable.

Claimed output folders (a lock while a tool writes, a manifest of what it wrote) are in
``winpos.utils.output_folders``; every ``atomic_write`` inside a claimed folder is listed in its manifest (``_record``).
"""
from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Callable, Iterable

from winpos.errors import WinposError

__all__ = ["atomic_write", "atomic_write_text", "atomic_write_json", "atomic_savefig", "EXEMPT_MARK", "WriteError",
           "check_output_file", "check_output_dir", "same_file", "remove_stale_temps", "LOCK_NAME", "MANIFEST_NAME",
           "as_write_error", "link_refusal", "refuse_linked_folders"]

LOCK_NAME = ".winpos-run.lock"
MANIFEST_NAME = ".winpos-outputs.json"


class WriteError(OSError):
    """A write that failed (disk full, file size limit, I/O error); the destination is unchanged."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


def _anonymous_file(folder: str):
    """A file descriptor of an unnamed file in ``folder`` (Linux ``O_TMPFILE``), or None where unsupported."""
    flag = getattr(os, "O_TMPFILE", None)
    if flag is None or not os.path.isdir("/proc/self/fd"):
        return None
    try:
        return os.open(folder, flag | os.O_WRONLY, 0o666)
    except OSError:
        return None


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _link_anonymous(fd: int, name: str) -> None:
    """Give the ``O_TMPFILE`` file ``fd`` the name ``name``: ``linkat`` with ``AT_SYMLINK_FOLLOW`` on its
    ``/proc/self/fd`` entry (a directory fd makes ``os.link`` call ``linkat`` rather than ``link``, which would
    not follow the ``/proc`` link)."""
    root = os.open("/", os.O_RDONLY)
    try:
        os.link(f"/proc/self/fd/{fd}", os.path.abspath(name), src_dir_fd=root, dst_dir_fd=root,
                follow_symlinks=True)
    finally:
        os.close(root)


def atomic_write(path, write: Callable, mode: str = "wb") -> None:
    """Write ``path`` through ``write(fileobj)`` atomically (see module docstring).

    Raises ``WriteError`` (an OSError) when writing fails; the previous file at ``path``, if any, is unchanged and
    no temporary file is left.
    """
    path = os.fspath(path)
    refuse_linked_folders(path)
    folder = os.path.dirname(os.path.abspath(path))
    tmp = f"{path}.{os.getpid()}.tmp"
    linked = False
    fd = _anonymous_file(folder)
    try:
        if fd is None:
            f = open(tmp, mode)
            linked = True
        else:
            f = os.fdopen(fd, mode)
            fd = None
        with f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
            if not linked:
                if os.path.lexists(tmp):
                    os.remove(tmp)  # left by an earlier process that had the same pid
                _link_anonymous(f.fileno(), tmp)
                linked = True
        os.replace(tmp, path)
        _fsync_dir(folder)
    except BaseException as e:
        if fd is not None:
            os.close(fd)
        if linked and os.path.lexists(tmp):
            os.remove(tmp)
        state = "the previous file is unchanged" if os.path.exists(path) else "nothing was written"
        error = as_write_error(e, f"could not write {path}", state)
        if error is not None:
            raise error from e
        raise
    _record(path)  # after the file is in place: a failure to list it is not a failure to write it


def as_write_error(e: BaseException, what: str, state: str) -> "WriteError | None":
    """``WriteError("<what> (<reason>); <state>[; free disk space ...]")`` when an ``OSError`` is in the chain of
    ``e`` (torch.save turns one into a RuntimeError), else None. ``state`` says what the failure left."""
    cause = e
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__context__
    if not isinstance(e, Exception) or not isinstance(cause, OSError) or isinstance(cause, WriteError):
        return None
    hint = "; free disk space (or raise the file size limit, ulimit -f) and run again" \
        if cause.errno in (errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", -1)) else ""
    return WriteError(cause.errno, f"{what} ({cause.strerror or cause}); {state}{hint}")


def sha256_file(path) -> str:
    """SHA-256 (hex) of a file's bytes, read in 1 MiB blocks."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def atomic_write_text(path, text: str) -> None:
    """``atomic_write`` of a str (utf-8)."""
    atomic_write(path, lambda f: f.write(text), "w")


def atomic_write_json(path, obj, indent: int | None = 1, **dump_kwargs) -> None:
    """``atomic_write`` of ``obj`` as JSON; serialized first, so an unserializable value leaves no file."""
    import json

    text = json.dumps(obj, indent=indent, **dump_kwargs)
    atomic_write_text(path, text + "\n")


EXEMPT_MARK = "# output-policy:"
"""The comment that marks a file write the writer walk accepts without ``atomic_write``; a reason must follow."""


def atomic_savefig(fig, path, dpi: int = 110) -> None:
    """``atomic_write`` of a matplotlib figure. The format follows ``path``'s extension (``.png``, ``.pdf``, ``.svg``,
    ...; a path without one is written as PNG); an extension matplotlib cannot write is refused before anything is
    written, naming the ones it can."""
    ext = os.path.splitext(os.fspath(path))[1][1:].lower() or "png"
    supported = fig.canvas.get_supported_filetypes()
    if ext not in supported:
        raise WinposError(f"cannot write a figure as '.{ext}' ({os.fspath(path)}); use one of the extensions "
                          f"matplotlib writes: {', '.join('.' + e for e in sorted(supported))}")
    atomic_write(path, lambda f: fig.savefig(f, dpi=dpi, format=ext), "wb")


def remove_stale_temps(folder, pattern: str = "*.tmp") -> list[Path]:
    """Remove ``<name>.<pid>.tmp`` files of ``atomic_write`` in ``folder`` whose process is gone; returns them.

    Only the fallback writer (no ``O_TMPFILE``) or a kill between its last two steps can leave such a file.
    """
    removed = []
    for p in Path(folder).glob(pattern):
        stem, _, pid = p.name[:-len(".tmp")].rpartition(".")
        if not stem or not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        try:
            p.unlink()
            removed.append(p)
        except OSError:
            pass
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def same_file(a, b) -> bool:
    """Whether paths ``a`` and ``b`` name the same file (also through links), existing or not."""
    a, b = Path(a), Path(b)
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    return a.resolve() == b.resolve()


def _check_writable_location(folder: Path, flag: str, what: str) -> None:
    probe = folder
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise WinposError(f"{flag} {what}: {probe} is a file, so no folder can be made there; choose another "
                          "location")
    if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        raise WinposError(f"{flag} {what}: the folder {probe} is not writable; choose a location you can write to")


def check_output_file(path, inputs: Iterable = (), force: bool = False, flag: str = "--output",
                      suffixes: Iterable[str] | None = None) -> Path:
    """Validate an output file before any work: not a folder, an accepted suffix, not one of ``inputs``, not an
    existing file unless ``force``, and a writable location. Returns the path."""
    out = Path(path)
    if str(path).endswith(os.sep) or out.is_dir():
        example = out / ("output" + next(iter(suffixes or [".pth"])))
        raise WinposError(f"{flag} {path} is a folder; name a file inside it, e.g. {example}")
    if suffixes is not None:
        suffixes = tuple(suffixes)
        if out.suffix.lower() not in suffixes:
            close = [s for s in suffixes if s.startswith(out.suffix.lower()) or out.suffix.lower().startswith(s)]
            hint = f" (did you mean {out.with_suffix(close[0])}?)" if close and out.suffix else ""
            raise WinposError(f"{flag} {path} has the suffix {out.suffix or '(none)'!r}; the file type is chosen by "
                              f"the suffix: use one of {', '.join(suffixes)}{hint}")
    for item in inputs:
        if same_file(out, item):
            raise WinposError(f"{flag} {path} is the input file {item}; writing there would replace the input: "
                              "choose another output name")
    if out.exists() and not force:
        raise WinposError(f"{flag} {path} already exists; pass --force to replace it, or choose another name")
    _check_writable_location(out.parent, flag, str(path))
    return out


def check_output_dir(path, input_files: Iterable = (), planned: Iterable[str] = (), force: bool = False,
                     flag: str = "--output") -> Path:
    """Validate an output folder before any work: not a file, not the folder of any input file, none of the
    ``planned`` file names already there unless ``force``, and writable. Returns the path."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise WinposError(f"{flag} {path} is a file, not a folder; name a new or existing folder for the outputs")
    for item in input_files:
        if same_file(Path(item).parent, out):
            raise WinposError(f"{flag} {path} holds the input {item}; writing the outputs there could replace "
                              "inputs: choose a separate output folder")
    if out.is_dir() and not force:
        existing = [name for name in planned if (out / name).exists()]
        if existing:
            raise WinposError(f"{flag} {path} already holds {len(existing)} of the output files (e.g. "
                              f"{existing[0]}); pass --force to replace them, or choose another folder")
    _check_writable_location(out, flag, str(path))
    return out


# ---------------------------------------------------------------------------------------------------------------
# the registry of claimed folders (filled by winpos.utils.output_folders), which every atomic write records into

_claimed: dict = {}  # resolved folder -> the OutputFolder this process holds


def _enclosing_claim(path: str):
    """``(claim, between)``: the innermost claimed folder that holds ``path`` (None if none) and the folders
    between them (``path``'s folder up to, not including, the claimed one)."""
    between = []
    probe = os.path.dirname(os.path.abspath(path))
    while True:
        claim = _claimed.get(probe) or _claimed.get(os.path.realpath(probe))
        if claim is not None:
            return claim, between
        parent = os.path.dirname(probe)
        if parent == probe:
            return None, []
        between.append(probe)
        probe = parent


def _record(path: str) -> None:
    """List ``path`` in the manifest of the claimed folder that holds it (the innermost one)."""
    if not _claimed or os.path.basename(path) == MANIFEST_NAME:
        return
    claim, _ = _enclosing_claim(path)
    if claim is not None:
        claim.record(path)


def link_refusal(link) -> WinposError:
    """The one line for a symbolic link met where a tool writes inside its output folder."""
    try:
        target = f" (to {os.readlink(link)})"
    except OSError:
        target = ""
    return WinposError(f"{link} is a symbolic link{target}; winpos never writes, appends or deletes through a link "
                       "inside its output folder: remove the link (what it points to stays untouched) or choose "
                       "another folder")


def refuse_linked_folders(path) -> None:
    """Refuse (``link_refusal``) a write to ``path`` inside a claimed output folder when a folder between the
    claimed one and ``path`` is a symbolic link (an earlier run's ``size_96/`` moved away and linked back): the
    write would land outside. ``path`` itself may be a link: an atomic write replaces the link, not its target."""
    if not _claimed:
        return
    _, between = _enclosing_claim(os.fspath(path))
    for folder in between:
        if os.path.islink(folder):
            raise link_refusal(folder)
