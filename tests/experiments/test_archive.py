"""The study archive (winpos.experiments.archive): a finished run's sealed result kept as one JSON file, read when
the run's folder is gone, refused when edited or made with other settings, and compared when the run is made
again; the equal-footing study reads it, skips archived chains and keeps what it runs."""
import json
from pathlib import Path

import pytest

from winpos.errors import WinposError
from winpos.experiments import archive as A
from winpos.experiments import footing as F
from winpos.experiments import footing_runs as FR
from winpos.experiments import runs as R

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "shapes" / "reproduce_hieradet.py")


def _finish(spec, box=30.0, mask=20.0, seconds=12.0):
    """Write ``spec``'s folder as the child does at the end of a run: identity, then a sealed result."""
    R.claim(spec)
    result = {"spec": spec, "bbox": {"AP": box, "AP50": box + 20}, "segm": {"AP": mask}, "seconds": seconds,
              "threads": 1, "started_utc": "2026-12-04T03:00:00Z"}
    (Path(spec["out"]) / R.RESULT).write_text(json.dumps(R.seal(result, spec)))


def _finish_chain(specs):
    """Write a chain's folders as the child writes them: stage 0 with a loss history, the rest with AP 17 / 10."""
    for s in specs:
        R.claim(s)
        res = {"spec": s, "seconds": 1.0, "started_utc": "2026-12-04T03:00:00Z"}
        if s["kind"] == "stage0":
            res.update(history=[{"iter": 0, "ws": None, "loss": None}, {"iter": 400, "ws": None, "loss": 0.06}],
                       reliance={"learned": 0.06})
        else:
            res.update(bbox={"AP": 17.0}, segm={"AP": 10.0})
        (Path(s["out"]) / R.RESULT).write_text(json.dumps(R.seal(res, s)))


def _spec(tmp_path, name="p0/rope/canvas/2x/zero-shot", **kw):
    return dict(dict(name=name, kind="detect", config=CONFIG, encoding="rope", size=128, iters=0, seed=0,
                     threads=1, out=str(tmp_path / "runs" / name)), **kw)


def test_entry_is_read_when_the_folder_is_gone(tmp_path):
    spec = _spec(tmp_path)
    _finish(spec, box=31.5)
    assert A.keep(spec, tmp_path / "arch") == "new"
    path = A.entry_path(tmp_path / "arch", spec["name"])
    assert path.name == "p0__rope__canvas__2x__zero-shot.json"
    import shutil

    shutil.rmtree(tmp_path / "runs")
    assert A.archived(spec, tmp_path / "arch")["bbox"]["AP"] == 31.5
    assert A.finished_or_archived(spec, tmp_path / "arch")["bbox"]["AP"] == 31.5
    assert A.finished_or_archived(spec, None) is None  # no archive: only the folder counts
    assert A.archived(_spec(tmp_path, name="p1/rope/x"), tmp_path / "arch") is None  # no entry under that name


def test_edited_entry_is_refused(tmp_path):
    spec = _spec(tmp_path)
    _finish(spec)
    A.keep(spec, tmp_path / "arch")
    path = A.entry_path(tmp_path / "arch", spec["name"])
    entry = json.loads(path.read_text())
    entry["result"]["bbox"]["AP"] = 99.0
    path.write_text(json.dumps(entry))
    with pytest.raises(WinposError, match=r"archive entry .*p0__rope__canvas__2x__zero-shot.json \(run "
                                          r"p0/rope/canvas/2x/zero-shot\) does not match its integrity hash.*delete "
                                          "just that file to make run p0/rope/canvas/2x/zero-shot again"):
        A.archived(spec, tmp_path / "arch")
    path.write_text("{not json")
    with pytest.raises(WinposError, match="corrupt"):
        A.archived(spec, tmp_path / "arch")


def test_entry_copied_under_another_name_or_settings_is_refused(tmp_path):
    spec = _spec(tmp_path)
    _finish(spec)
    A.keep(spec, tmp_path / "arch")
    with pytest.raises(WinposError, match="other settings.*size 256 asked, 128 archived"):
        A.archived(dict(spec, size=256), tmp_path / "arch")
    # the init's hash is compared when the file is here
    init = tmp_path / "init.pth"
    init.write_bytes(b"weights")
    other = _spec(tmp_path, name="p0/abs/stage1", init=str(init))
    _finish(other)
    A.keep(other, tmp_path / "arch")
    assert A.archived(other, tmp_path / "arch") is not None
    init.write_bytes(b"other weights")
    with pytest.raises(WinposError, match="init_sha256: the init checkpoint is another file"):
        A.archived(other, tmp_path / "arch")
    init.unlink()  # a parent that is itself only archived has no weights here: its entry vouches for the chain
    assert A.archived(other, tmp_path / "arch") is not None
    made = _spec(tmp_path, name="p1/abs/stage1", init=str(tmp_path / "runs" / "p1" / "abs" / "init.pth"))
    _finish(made)
    A.keep(made, tmp_path / "arch")
    # read back with another --output (every path moved, the init at the same place relative to the run): the same run
    moved = dict(made, init=str(tmp_path / "elsewhere" / "p1" / "abs" / "init.pth"),
                 out=str(tmp_path / "elsewhere" / "p1" / "abs" / "stage1"))
    assert A.archived(moved, tmp_path / "arch") is not None
    # an init elsewhere relative to the run is another chain: refused, naming it and how to redo just that entry
    with pytest.raises(WinposError, match=r"init_from '\.\./\.\./other/init.pth' asked, '\.\./init.pth' archived"
                                          r".*delete just that entry \(p1__abs__stage1.json\) to run "
                                          "p1/abs/stage1 again"):
        A.archived(dict(made, init=str(tmp_path / "runs" / "p1" / "other" / "init.pth")), tmp_path / "arch")


def test_a_fresh_clone_reads_and_continues_from_the_archive(tmp_path, monkeypatch):
    """Issues 45 / 47: a study's archive made in one checkout is read in another (another config path, another
    --output, no run folders), a run made again there with another speed is 'reproduced', a changed config is
    refused."""
    import shutil

    clone_a, clone_b = tmp_path / "a", tmp_path / "b"
    for clone in (clone_a, clone_b):
        (clone / "configs").mkdir(parents=True)
        shutil.copy(CONFIG, clone / "configs" / "c.py")
    s0 = dict(name="p0/abs/stage0", kind="stage0", config=str(clone_a / "configs" / "c.py"), encoding="abs_learned",
              iters=4, seed=100, threads=1, out=str(clone_a / "out" / "p0" / "stage0"))
    R.claim(s0)
    res = {"spec": {"iters": 4, "seed": 100}, "history": [{"iter": 4, "ws": 0.5, "loss": 0.1}], "seconds": 2.0,
           "iters_per_s": 2.0, "started_utc": "2026-12-05T00:00:00Z"}
    (Path(s0["out"]) / R.RESULT).write_text(json.dumps(R.seal(res, s0)))
    assert A.keep(s0, tmp_path / "arch") == "new"
    # clone B: relative config path, its own --output, no run folder
    monkeypatch.chdir(clone_b)
    in_b = dict(s0, config="configs/c.py", out="out2/p0/stage0")
    assert A.archived(in_b, tmp_path / "arch")["history"][0]["ws"] == 0.5
    R.claim(in_b)  # made again there: same numbers, another speed and time
    (Path(in_b["out"]) / R.RESULT).write_text(json.dumps(R.seal(dict(res, seconds=9.0, iters_per_s=0.44), in_b)))
    assert A.keep(in_b, tmp_path / "arch") == "reproduced"
    (clone_b / "configs" / "c.py").write_text((clone_b / "configs" / "c.py").read_text() + "\n# changed\n")
    with pytest.raises(WinposError, match="config_sha256"):
        A.archived(in_b, tmp_path / "arch")
    with pytest.raises(WinposError, match="config_sha256"):  # and its old run folder is another run now
        R.claim(in_b)


def test_made_again_same_numbers_is_reproduced_other_numbers_raise(tmp_path):
    spec = _spec(tmp_path)
    _finish(spec, box=30.0, seconds=10.0)
    assert A.keep(spec, tmp_path / "arch") == "new"
    import shutil

    shutil.rmtree(tmp_path / "runs")
    _finish(spec, box=30.0, seconds=55.0)  # time differs, numbers do not
    assert A.keep(spec, tmp_path / "arch") == "reproduced"
    shutil.rmtree(tmp_path / "runs")
    _finish(spec, box=30.25)
    with pytest.raises(A.NotReproduced, match=r"bbox.AP: 30.0 archived, 30.25 now"):
        A.keep(spec, tmp_path / "arch")
    assert A.archived(spec, tmp_path / "arch")["bbox"]["AP"] == 30.0  # the entry is kept


def test_unfinished_run_is_not_archived(tmp_path):
    spec = _spec(tmp_path)
    R.claim(spec)
    with pytest.raises(WinposError, match="has not finished"):
        A.keep(spec, tmp_path / "arch")


def test_result_differences_ignores_only_time_fields():
    a = {"bbox": {"AP": 1.0}, "seconds": 3, "started_utc": "x", "integrity": "h", "history": [{"loss": 0.5}]}
    b = {"bbox": {"AP": 1.0}, "seconds": 9, "started_utc": "y", "integrity": "k", "history": [{"loss": 0.5}]}
    assert A.result_differences(a, b) == []
    a["bbox"]["APl"], b["bbox"]["APl"] = float("nan"), float("nan")  # COCO: no large objects -> NaN in both
    assert A.result_differences(a, b) == []
    b["bbox"]["APl"] = 0.0
    assert A.result_differences(a, b) == ["bbox.APl: nan archived, 0.0 now"]
    b["bbox"]["APl"] = float("nan")
    b["history"][0]["loss"] = 0.51
    assert A.result_differences(a, b) == ["history.0.loss: 0.5 archived, 0.51 now"]


def test_study_collects_from_the_archive_and_skips_archived_chains(tmp_path):
    f = F.Footing(config=CONFIG, output_dir=str(tmp_path / "study"), pipelines=(0,), encodings=("rope",),
                  archive_dir=str(tmp_path / "arch"))
    specs = F.chain_specs(f, 0, "rope")
    _finish_chain(specs)
    counts = FR.archive_all(f, log=lambda m: None)
    assert counts == {"new": len(specs), "reproduced": 0}
    assert FR.archive_all(f, log=lambda m: None) == {"new": 0, "reproduced": len(specs)}
    import shutil

    shutil.rmtree(tmp_path / "study")
    data = FR.collect(f)
    assert data["missing"] == [] and data["ap64"]["rope"]["0"] == {"box": 17.0, "mask": 10.0}
    assert data["zero_shot"]["rope"]["canvas 4x"]["0"]["box"] == 17.0
    logs = []
    FR.run(f, log=logs.append)  # nothing to run: every run of the chain is archived
    assert logs == ["skip p0/rope: every run of it is finished or archived"]
    assert not (tmp_path / "study").exists()
    without = F.Footing(config=CONFIG, output_dir=str(tmp_path / "study"), pipelines=(0,), encodings=("rope",))
    assert len(FR.collect(without)["missing"]) == len(specs)
    with pytest.raises(WinposError, match="--archive"):
        FR.archive_all(without)


def test_a_run_finished_but_stopped_before_its_entry_is_archived_when_the_study_continues(tmp_path):
    """A study stopped between a run's result and its archive entry: the next start archives it (before, a
    finished run was skipped as settled and never archived, and its folder was the only copy)."""
    f = F.Footing(config=CONFIG, output_dir=str(tmp_path / "study"), pipelines=(0,), encodings=("rope",),
                  archive_dir=str(tmp_path / "arch"))
    specs = F.chain_specs(f, 0, "rope")
    _finish_chain(specs)
    from winpos.experiments import archive as A

    A.keep(specs[0], f.archive_dir)  # only the first run made its entry before the stop
    logs = []
    FR.run(f, log=logs.append)
    assert all(A.archived(s, f.archive_dir) is not None for s in specs)
    said = [m for m in logs if m.endswith("(finished before, not archived then)")]
    assert len(said) == len(specs) - 1 and all(": new " in m for m in said)
    assert logs[-1] == "skip p0/rope: every run of it is finished or archived"


def test_report_of_a_study_read_from_its_archive_alone(tmp_path, capsys):
    """``winpos-reproduce --equal-footing --archive DIR --report-only`` on a machine without the run folders: the
    report is made from the archive (here one pipeline's RoPE chain, written as the child writes it)."""
    from winpos.cli.reproduce import main

    out = tmp_path / "study"
    f = F.Footing(config=CONFIG, output_dir=str(out), pipelines=(0,), encodings=("rope",),
                  archive_dir=str(tmp_path / "arch"))
    _finish_chain(F.chain_specs(f, 0, "rope"))
    FR.archive_all(f, log=lambda m: None)
    import shutil

    shutil.rmtree(out)
    code = main(["--equal-footing", "--config", CONFIG, "--output", str(out), "--pipelines", "0", "--encodings",
                 "rope", "--no-finetune", "--archive", str(tmp_path / "arch"), "--report-only"])
    assert code == 0
    text = capsys.readouterr().out
    assert "rope       17.0 (n=1)" in text and "0 new, 0 reproduced" in text  # no run folder here to archive
    # one pipeline of the six declared: an interim report, printed, that writes nothing over the declared one
    assert "interim (1 of the 6 declared pipelines asked for): nothing written" in text
    assert not (out / "results.json").exists()


def test_a_run_records_the_code_that_made_it_and_the_archive_ignores_it():
    import subprocess

    from winpos.experiments.child import code_version

    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:  # a copy without .git (an unpacked sdist): the installed version instead
        assert code_version().startswith(("winpos ", "unknown"))
    else:
        assert code_version().removesuffix("+dirty") == head.stdout.strip()
    a = {"bbox": {"AP": 1.0}, "code": "abc"}
    assert A.result_differences(a, dict(a, code="def+dirty")) == []
