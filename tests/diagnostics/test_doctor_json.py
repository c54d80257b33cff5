"""``winpos-posemb doctor --json``: one record per target with the verdict, the findings and each block term's
numbers; the exit status equals the verdict; the file is complete or absent and replaced only with --force."""
import json
import math
import os
import subprocess
import sys

import pytest

from winpos.cli.posemb_viz import main
from winpos.diagnostics.doctor import JSON_SCHEMA_VERSION, DoctorReport, diagnose_preset

STOCK = ["vitdet_b", "--image-size", "1024"]  # detectron2's recipe: abs interpolated under 14-token windows
WINDOW_BLOCKS = [0, 1, 3, 4, 6, 7, 9, 10]


def _doctor(capsys, tmp_path, *args):
    """Run the command in this process; returns (exit status, the JSON document, stdout, stderr)."""
    out = tmp_path / "doctor.json"
    status = main(["doctor", *args, "--json", str(out)])
    captured = capsys.readouterr()
    return status, json.loads(out.read_text()), captured.out, captured.err


def test_stock_vitdet_b_is_a_bug_with_its_blocks(capsys, tmp_path):
    status, doc, out, _ = _doctor(capsys, tmp_path, *STOCK)
    assert status == doc["exit_status"] == 1
    assert doc["schema_version"] == JSON_SCHEMA_VERSION == 1 and doc["errors"] == []
    (rec,) = doc["reports"]
    assert rec["argument"] == "vitdet_b" and rec["target"] == "preset vitdet_b (recipe original)"
    assert rec["verdict"] == "BUG" and rec["image_size"] == 1024
    assert rec["affected_blocks"] == WINDOW_BLOCKS and rec["window_sizes"] == [14]
    assert rec["grid"] == [64, 64] and rec["pretrain_grid"] == [14, 14]
    assert rec["embedding"].startswith("absolute embedding stored at 14x14 tokens")
    assert rec["lines"][0] == "interpolates 14x14 -> 64x64 tokens (x4.57, bicubic)"
    # the fix, one line per step, without the printed continuation indent
    assert rec["fix"].split("\n") == [
        "build it with recipe paper (abs-win): winpos-posemb doctor vitdet_b --recipe paper",
        "and convert its checkpoint on import: winpos-convert --input CKPT --output OUT.safetensors --to vitdet_b "
        "--recipe paper"]
    (pad,) = rec["padding"]
    assert "64x64 tokens padded to 70x70 for 14-token windows" in pad and "+19.6%" in pad
    terms = {(t["term"], t["kind"]): t for t in rec["terms"]}
    assert set(terms) == {("relpos", "window"), ("relpos", "global")}
    win, glob = terms["relpos", "window"], terms["relpos", "global"]
    assert win["blocks"] == WINDOW_BLOCKS and glob["blocks"] == [2, 5, 8, 11]
    assert win["level"] == glob["level"] == "OK" and win["extent"] == [14, 14] and glob["extent"] == [64, 64]
    # tables stored for 1024 px: 2*14-1 and 2*64-1 long, used as stored
    assert win["summary"] == {"stored": [27, 27], "used": [27, 27], "stretch": [1.0, 1.0],
                              "trained_max_offset": [13, 13], "max_offset": [13, 13]}
    assert glob["summary"]["stored"] == glob["summary"]["used"] == [127, 127]
    # the text is the one printed without --json, then one line naming the file
    assert out == _text(capsys, *STOCK) + f"wrote {tmp_path / 'doctor.json'}\n"


def _text(capsys, *args):
    main(["doctor", *args])
    return capsys.readouterr().out


def test_relpos_stretch_at_2048(capsys, tmp_path):
    _, doc, _, _ = _doctor(capsys, tmp_path, "vitdet_b", "--image-size", "2048")
    glob = next(t for t in doc["reports"][0]["terms"] if t["kind"] == "global")
    s = glob["summary"]
    assert glob["level"] == "WARN" and s["stored"] == [127, 127] and s["used"] == [255, 255]
    assert s["stretch"] == [pytest.approx(255 / 127)] * 2 and s["max_offset"] == [127, 127]


def test_paper_recipe_is_clean(capsys, tmp_path):
    status, doc, _, _ = _doctor(capsys, tmp_path, *STOCK, "--recipe", "paper")
    (rec,) = doc["reports"]
    assert status == doc["exit_status"] == 0 and rec["verdict"] == "OK"
    assert rec["affected_blocks"] == [] and rec["window_sizes"] == [] and rec["fix"] == ""
    assert rec["pretrain_grid"] is None and rec["embedding"].startswith("abs-win (single), window embedding 14x14")
    assert [(t["term"], t["kind"], t["level"]) for t in rec["terms"]] == [("relpos", "global", "OK")]


def test_rope_extrapolation_is_a_warning_with_its_numbers(capsys, tmp_path):
    """The docs' example: vitdet_b --recipe rope at 1024 px, global blocks extrapolate 14 -> 64 tokens."""
    status, doc, _, _ = _doctor(capsys, tmp_path, *STOCK, "--recipe", "rope")
    (rec,) = doc["reports"]
    assert status == doc["exit_status"] == 0 and rec["verdict"] == "WARN" and rec["affected_blocks"] == []
    terms = {t["kind"]: t for t in rec["terms"] if t["term"] == "RoPE"}
    win, glob = terms["window"]["summary"], terms["global"]["summary"]
    assert terms["window"]["level"] == "OK" and terms["global"]["level"] == "WARN"
    assert terms["global"]["extent"] == [64, 64] and terms["global"]["trained_extent"] == [14, 14]
    assert glob["positions"] == {"lo": [0.0, 0.0], "hi": [63.0, 63.0], "step": [1.0, 1.0]}
    assert glob["trained_positions"] == {"lo": [0.0, 0.0], "hi": [13.0, 13.0], "step": [1.0, 1.0]}
    assert glob["extrapolates"] and glob["offset_ratio"] == pytest.approx(63 / 13)
    assert glob["unseen_angle_slots"] == 10 and glob["slots"] == 16 and glob["heads"] == 1
    assert glob["max_angle_growth"] == pytest.approx(63 / 13, rel=1e-6)  # integer positions: range grows as offsets
    assert glob["max_angle_rad"] == pytest.approx(63.0) and glob["step_ratio"] == [1.0, 1.0]
    assert not win["extrapolates"] and win["unseen_angle_slots"] == 0 and win["max_angle_growth"] is None
    assert win["offset_ratio"] == 1.0 and win["aliased_slots"] == glob["aliased_slots"] == 0
    # the same numbers as the report's own arrays
    data = next(t for t in diagnose_preset("vitdet_b", 1024, "rope").terms if t.group.kind == "global").data
    assert glob["unseen_angle_slots"] == int(data["new_angles"].sum())
    assert glob["max_step_rad"] == pytest.approx(float(data["new"].step.max()))
    assert glob["trained_max_angle_rad"] == pytest.approx(float(data["ref"].span.max()))


def test_lookhere_distances(capsys, tmp_path):
    """LookHere's global blocks at 1024 px reach keys 63*sqrt(2) tokens away, trained 13*sqrt(2) (224 px)."""
    _, doc, _, _ = _doctor(capsys, tmp_path, *STOCK, "--recipe", "lookhere")
    terms = {t["kind"]: t for t in doc["reports"][0]["terms"] if t["term"] == "LookHere"}
    glob, win = terms["global"]["summary"], terms["window"]["summary"]
    assert doc["reports"][0]["verdict"] == "WARN" and terms["global"]["level"] == "WARN"
    assert glob["max_distance"] == pytest.approx(63 * math.sqrt(2))
    assert glob["trained_max_distance"] == pytest.approx(13 * math.sqrt(2))
    assert glob["distance_ratio"] == pytest.approx(63 / 13) and win["distance_ratio"] == 1.0
    assert 0 < glob["min_slope"] < glob["max_slope"]


@pytest.mark.parametrize("args,verdict,status", [(STOCK, "BUG", 1), (STOCK + ["--recipe", "paper"], "OK", 0),
                                                 (STOCK + ["--recipe", "rope"], "WARN", 0)])
def test_exit_status_is_the_verdict_on_stdout(args, verdict, status):
    """``--json -``: stdout is the JSON alone (the text goes to stderr); the exit status matches the verdict."""
    done = subprocess.run([sys.executable, "-m", "winpos.cli.posemb_viz", "doctor", *args, "--json", "-"],
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    doc = json.loads(done.stdout)
    assert done.returncode == doc["exit_status"] == status
    assert [r["verdict"] for r in doc["reports"]] == [verdict]
    assert done.stderr.startswith(f"[{verdict}] preset vitdet_b")


def test_a_target_that_cannot_be_checked_is_an_error_record(capsys, tmp_path):
    status, doc, out, err = _doctor(capsys, tmp_path, "vitdet_b", "vitdet_q", "--recipe", "paper")
    assert status == doc["exit_status"] == 2
    assert [r["argument"] for r in doc["reports"]] == ["vitdet_b"]
    (bad,) = doc["errors"]
    assert bad["argument"] == "vitdet_q" and "vitdet_q" in bad["error"] and f"error: {bad['error']}" in err


def test_an_existing_file_is_refused_before_any_work_and_replaced_with_force(capsys, tmp_path, monkeypatch):
    out = tmp_path / "doctor.json"
    out.write_text("earlier\n")
    import winpos.diagnostics.doctor as doctor

    def no_work(*a, **k):
        raise AssertionError("the doctor ran before the output was checked")

    monkeypatch.setattr(doctor, "diagnose_presets", no_work)
    assert main(["doctor", *STOCK, "--json", str(out)]) == 2
    assert "--json" in capsys.readouterr().err and out.read_text() == "earlier\n"
    assert main(["doctor", *STOCK, "--json", str(tmp_path / "doctor.txt")]) == 2  # the suffix says the format
    assert "'.txt'" in capsys.readouterr().err and not (tmp_path / "doctor.txt").exists()
    monkeypatch.undo()
    assert main(["doctor", *STOCK, "--json", str(out), "--force"]) == 1
    assert json.loads(out.read_text())["reports"][0]["verdict"] == "BUG"


def test_the_file_is_complete_or_absent(capsys, tmp_path, monkeypatch):
    """A record that cannot be written as JSON (a NaN) and a write failing on the disk leave no file, no temp file,
    and an earlier file replaced with --force unchanged."""
    out = tmp_path / "doctor.json"
    monkeypatch.setattr(DoctorReport, "to_dict", lambda self: {"verdict": self.verdict, "ratio": math.nan})
    with pytest.raises(ValueError, match="not JSON compliant"):
        main(["doctor", *STOCK, "--json", str(out)])
    assert os.listdir(tmp_path) == []
    monkeypatch.undo()
    out.write_text("earlier\n")

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    # the environment's failure: exit status 2, never the 1 of a BUG verdict (the stock recipe has the bug)
    assert main(["doctor", *STOCK, "--json", str(out), "--force"]) == 2
    assert "the previous file is unchanged" in capsys.readouterr().err
    assert os.listdir(tmp_path) == ["doctor.json"] and out.read_text() == "earlier\n"
