"""Symbolic links inside an output folder (issue 45, cases F01-F04): a tool never writes, appends or deletes
through one. The lock is opened with ``O_NOFOLLOW``, detectron2's appended files (``log.txt``, ``metrics.json``)
are checked before its logger opens them, a write below a linked sub-folder is refused, and ``--force`` removes
only regular files inside the folder. Each test keeps a file outside the folder and checks it byte for byte."""
import os

import pytest

from tests.bad_inputs_helpers import ROOT, assert_one_line_error, tool
from winpos.errors import WinposError

TRAIN_CONFIG = ROOT / "configs" / "shapes" / "reproduce_hieradet.py"
OUTSIDE = b"the user's own file, outside the output folder\n" * 3


@pytest.fixture
def outside(tmp_path):
    """A folder outside the output folder holding ``keep.txt`` and ``size_96/{a.json,b.pth}``."""
    root = tmp_path / "outside"
    (root / "size_96").mkdir(parents=True)
    for p in (root / "keep.txt", root / "size_96" / "a.json", root / "size_96" / "b.pth"):
        p.write_bytes(OUTSIDE)
    return root


def _untouched(root):
    files = sorted(p for p in root.rglob("*") if p.is_file())
    assert files and all(p.read_bytes() == OUTSIDE for p in files), files
    return True


def _one_line(e):
    text = str(e.value)
    assert "\n" not in text and "symbolic link" in text and "remove the link" in text, text
    return text


def test_f01_a_linked_lock_is_refused_and_its_target_untouched(tmp_path, outside):
    from winpos.d2.run_dir import claim_run_dir, release_run_dir
    from winpos.utils.output_folders import claim_output_dir
    from winpos.utils.outputs import LOCK_NAME

    for kind in ("eval", "train"):
        out = tmp_path / kind
        out.mkdir()
        (out / LOCK_NAME).symlink_to(outside / "keep.txt")
        with pytest.raises(WinposError) as e:
            if kind == "eval":
                claim_output_dir(out, planned=["results.json"])
            else:
                claim_run_dir(out)
        assert LOCK_NAME in _one_line(e)
        release_run_dir(out)
    assert _untouched(outside)


def test_f01_f04_train_refuses_a_linked_lock_or_log_in_one_line(tmp_path, outside):
    from winpos.utils.outputs import LOCK_NAME

    cases = ((LOCK_NAME, "keep.txt", ()), ("log.txt", "size_96/a.json", ()),
             ("metrics.json", "size_96/b.pth", ("--resume",)))  # metrics.json marks a run: appended on a resume
    for name, target, flags in cases:
        out = tmp_path / f"run_{name.strip('.')}"
        out.mkdir()
        (out / name).symlink_to(outside / target)
        res = tool("train_net.py", "--config-file", TRAIN_CONFIG, *flags, f"train.output_dir={out}",
                   "train.device=cpu", "train.max_iter=1", timeout=300)
        assert_one_line_error(res, name, "symbolic link", code=2)
    assert _untouched(outside)


def _earlier_sweep(out):
    """A folder an earlier evaluation wrote (``size_96/`` and ``sub/x`` listed in its manifest), then released."""
    from winpos.utils.output_folders import claim_output_dir
    from winpos.utils.outputs import atomic_write_text

    claim = claim_output_dir(out, planned=["resolution_sweep.json"])
    for name in ("resolution_sweep.json", "size_96/a.json", "size_96/b.pth", "sub/x"):
        os.makedirs((out / name).parent, exist_ok=True)
        atomic_write_text(out / name, "earlier\n")
    claim.finish()
    claim.release()


@pytest.mark.parametrize("moved", ["size_96", "sub"])
def test_f02_f03_force_never_deletes_behind_a_linked_sub_folder(tmp_path, outside, moved):
    """F02: ``size_96/`` moved out and linked back; F03: a manifest entry ``sub/x`` whose ``sub`` is a link. A
    ``--force`` claim replaces the folder's outputs; the files behind the link stay, and no error follows."""
    import shutil

    from winpos.utils.output_folders import claim_output_dir
    from winpos.utils.outputs import atomic_write_text

    out = tmp_path / "eval"
    _earlier_sweep(out)
    shutil.rmtree(out / moved)
    target = outside / "size_96" if moved == "size_96" else outside
    if moved == "sub":
        (outside / "x").write_bytes(OUTSIDE)
    (out / moved).symlink_to(target)
    claim = claim_output_dir(out, planned=["resolution_sweep.json"], force=True)
    try:
        atomic_write_text(out / "resolution_sweep.json", "new\n")
        os.makedirs(out / "size_64")
        atomic_write_text(out / "size_64" / "a.json", "new\n")
        removed = claim.finish()
    finally:
        claim.release()
    assert _untouched(outside) and (out / moved).is_symlink()
    assert not any(name.startswith(moved) for name in removed)
    other = "sub/x" if moved == "size_96" else "size_96/a.json"  # the earlier outputs not behind the link do go
    assert other in removed and not (out / other).exists()


def test_f02_a_write_below_a_linked_sub_folder_is_refused(tmp_path, outside):
    from winpos.utils.output_folders import claim_output_dir, publish_folder
    from winpos.utils.outputs import atomic_write_text

    out = tmp_path / "eval"
    out.mkdir()
    (out / "size_96").symlink_to(outside / "size_96")
    staging = out / ".staging"
    staging.mkdir()
    (staging / "a.json").write_text("new\n")
    claim = claim_output_dir(out, planned=["resolution_sweep.json"])
    try:
        with pytest.raises(WinposError) as e:
            atomic_write_text(out / "size_96" / "a.json", "new\n")
        assert "size_96" in _one_line(e)
        with pytest.raises(WinposError) as e:
            publish_folder(staging, out / "size_96")
        assert "size_96" in _one_line(e)
    finally:
        claim.release()
    assert _untouched(outside)


def test_a_link_as_the_file_itself_is_replaced_not_written_through(tmp_path, outside):
    """An atomic write replaces a link named like its output (``os.replace`` renames over the link)."""
    from winpos.utils.output_folders import claim_output_dir
    from winpos.utils.outputs import atomic_write_text

    out = tmp_path / "eval"
    out.mkdir()
    (out / "results.json").symlink_to(outside / "keep.txt")
    claim = claim_output_dir(out, planned=["other.json"])
    try:
        atomic_write_text(out / "results.json", "new\n")
    finally:
        claim.release()
    assert not (out / "results.json").is_symlink() and (out / "results.json").read_text() == "new\n"
    assert _untouched(outside)
