"""What the demo prints and plots is true of the runs it is given (no training: synthetic run results)."""
from __future__ import annotations

import pytest

from winpos.experiments.demo import plot_demo, print_summary
from winpos.experiments.report import summarize

WS = {"ws": 0.42, "ws_naive_1.25x": 0.01, "ws_abswin_1.25x": 0.60}
LEARNED = [{"iter": 0, "ws": -0.001}, {"iter": 800, "ws": 0.93}]


def _run(row, seed, box, iters=200):
    name = f"{row}/canvas/1.25x/" + ("zero-shot" if iters == 0 else f"seed{seed}")
    return {"spec": {"name": name, "size": 80, "iters": iters, "seed": seed},
            "bbox": {"AP": box}, "segm": {"AP": box - 10}}


def _summary(naive, abswin, history=LEARNED):
    runs = [_run("naive", None, 55.0, 0), _run("abs2win", None, 56.4, 0)]
    runs += [_run("naive", s, v) for s, v in enumerate(naive)] + [_run("abs2win", s, v) for s, v in enumerate(abswin)]
    stage0 = {"history": history, "reliance": {"learned": 0.025, "zeroed": 0.289, "rolled_1_token": 0.358,
                                               "rolled_1_window": 0.026}}
    summary = summarize({"rows": ["naive", "abs2win"], "multiplier": 1.25, "condition": "canvas",
                         "seeds": list(range(len(naive))), "finetune_iters": 200, "finetune_lr": 2e-4},
                        stage0, {"abs_learned": {"window_structure": WS}}, runs)
    summary.update(stage1_manifest={"stage0": stage0, "stage1": {"iters": 12000}, "box_AP_64px": 56.9},
                   doctor=["[BUG] absolute embedding naively interpolated", "fix: recipe=paper"], minutes=6.5)
    return summary


def _printed(summary, tmp_path):
    lines = []
    print_summary(summary, tmp_path, log=lines.append)
    return "\n".join(lines)


def test_a_gain_in_every_seed_is_reported_with_its_interval(tmp_path):
    text = _printed(_summary([55.3, 54.5, 56.0], [56.2, 56.0, 56.9]), tmp_path)
    assert "from a random start the embedding learned a window pattern, WS@4 -0.00 -> 0.93" in text
    assert "12000 iterations at 64 px, box AP 56.9" in text and "naive interpolation leaves 0.01" in text
    assert "naive 55.0 | abs-win 56.4 box AP (+1.4; one evaluation each, no interval)" in text
    # per seed +0.9, +1.5, +0.9: mean 1.1, sd 0.35, t(0.975, 2) = 4.303 -> half-width 0.86
    assert "naive 55.3 | abs-win 56.4 box AP" in text and "per seed +0.9, +1.5, +0.9" in text
    assert "+1.10 [+0.24, +1.96]" in text and "the interval excludes 0" in text
    assert "(this run's one test: one detector, 3 seeds, one draw: finetuning rounds differently on other CPUs, " \
        "which draw other intervals)" in text
    assert "this cell was a lead, +0.34 [+0.09, +0.59] box AP over six (T5 of the equal-footing study), that six " \
        "more did not replicate (+0.09 [-0.19, +0.36])" in text
    assert "a declared equivalence test over 24 more pipelines (margin +-0.25 box AP) decided it: +0.13 box AP " \
        "[95% CI +0.05, +0.21] over 24 detectors, TOST p < 0.001 / 0.003: shown (abs-win better than naive), and " \
        "within +-0.25 AP: a difference smaller than the margin; those detectors lose 1.38 [1.07, 1.68] box AP at " \
        "64 px when their embedding is zeroed (docs/reproduce.md)" in text
    assert "[BUG]" in text and "6.5 min" in text


def test_the_study_numbers_it_prints_are_the_studys():
    """The closing line quotes T5 and its replication R5 as the study's results JSON has them."""
    import json
    from pathlib import Path

    from winpos.experiments.demo import STUDY_CELL, STUDY_R5, STUDY_T5

    results = json.loads((Path(__file__).resolve().parents[2] / "docs" / "results" / "equal_footing.json").read_text())
    t5, r5 = results["tests"]["box"]["T5"], results["replication"]["tests"]["box"]["R5"]
    def fmt(t):
        return f"{t['mean']:+.2f} [{t['ci'][0]:+.2f}, {t['ci'][1]:+.2f}]"

    assert (fmt(t5), fmt(r5)) == (STUDY_T5, STUDY_R5)
    assert "canvas 1.25x" in t5["claim"] and "canvas 1.25x" in r5["claim"] and STUDY_CELL == ("canvas", "1.25x")
    assert results["study"]["finetune_seeds"] == [0, 1, 2] and r5["replicates"] == "T5"


def test_the_study_is_quoted_only_at_its_cell(tmp_path):
    summary = _summary([55.3, 54.5, 56.0], [56.2, 56.0, 56.9])
    summary["protocol"]["condition"] = "upscaled"
    for part in ("zero_shot", "stage2"):
        for row in summary[part].values():
            row["upscaled"] = row.pop("canvas")
    text = _printed(summary, tmp_path)
    assert "the interval excludes 0" in text and "other CPUs" in text
    assert "T5" not in text and "+0.34" not in text


def test_a_tie_is_not_called_a_difference(tmp_path):
    text = _printed(_summary([55.3, 54.5, 56.0], [55.1, 54.9, 55.8]), tmp_path)
    assert "the interval includes 0: no difference shown after finetuning" in text
    assert "excludes 0" not in text


@pytest.mark.parametrize("history, phrase", [
    ([{"iter": 0, "ws": 0.0}, {"iter": 800, "ws": 0.2}], "did not learn a window pattern (WS below 0.5)"),
    ([{"iter": 0, "ws": 0.7}, {"iter": 800, "ws": 0.9}], "from a start that already had one"),
])
def test_learned_is_said_only_when_the_history_shows_it(tmp_path, history, phrase):
    summary = _summary([55.3, 54.5], [56.2, 56.0], history)
    text = _printed(summary, tmp_path)
    assert phrase in text
    assert "from a random start the embedding learned" not in text


def test_the_plot_is_written(tmp_path):
    path = tmp_path / "demo.png"
    plot_demo(_summary([55.3, 54.5, 56.0], [56.2, 56.0, 56.9], LEARNED), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_equivalence_verdict_quoted_is_the_archives(tmp_path):
    """The demo quotes the verdict of the declared equivalence study, which was computed once all 24 pipelines were
    whole (13 sealed runs each, pipelines 12-35): the report computed afresh from the archive (``winpos-reproduce
    --equivalence --report-only``) says complete, its D1 line and the detectors' reliance are the demo's, and the
    committed results (docs/results/equivalence.json) are that report's."""
    import json
    import subprocess
    import sys
    from collections import Counter
    from pathlib import Path

    from winpos.experiments.demo import EQUIVALENCE_RELIANCE, EQUIVALENCE_VERDICT
    from winpos.experiments.footing_analysis import equivalence_short

    root = Path(__file__).resolve().parents[2]
    archive = root / "docs" / "results" / "equivalence_runs"
    runs = Counter(p.name.split("__")[0] for p in archive.glob("p*__*.json"))
    assert runs == {f"p{p}": 13 for p in range(12, 36)}, runs
    res = subprocess.run([sys.executable, "-m", "winpos.cli.reproduce", "--equivalence", "--config",
                          "configs/shapes/reproduce_hieradet.py", "--archive", str(archive), "--report-only",
                          "--output", str(tmp_path)], cwd=root, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    fresh = json.loads((tmp_path / "results.json").read_text())
    assert fresh["complete"] and fresh["whole_pipelines"] == [str(p) for p in range(12, 36)], fresh["whole_pipelines"]
    assert EQUIVALENCE_VERDICT == equivalence_short(fresh["tests"]["box"]["D1"])
    reliance = fresh["reliance"]["box"]
    assert EQUIVALENCE_RELIANCE == f"{reliance['mean']:.2f} [{reliance['ci'][0]:.2f}, {reliance['ci'][1]:.2f}]"
    committed = json.loads((root / "docs" / "results" / "equivalence.json").read_text())
    assert committed["sentence"] == fresh["sentence"]
    for family in ("box", "mask"):
        for name in ("D1", "D2"):
            c, f = committed["tests"][family][name], fresh["tests"][family][name]
            assert c["diffs"] == pytest.approx(f["diffs"], abs=1e-9) and c["verdict"] == f["verdict"]
