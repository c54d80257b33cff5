"""The declared equivalence study (winpos.experiments.footing.equivalence_study, footing_analysis's D1 / D2) and the
study command's behaviour on partial selections, a held folder and Ctrl-C (issues 45 and 48). References written
here: the t distribution by numerical integration of its density (for TOST), simulated TOSTs (for its power),
brute-force sign flips (for the exact sign-flip p at n > 6), Holm by hand."""
import hashlib
import itertools
import json
import math
import random
import statistics
from pathlib import Path

import pytest

from winpos.errors import WinposError
from winpos.experiments import archive as A
from winpos.experiments import footing as F
from winpos.experiments import footing_runs as FR
from winpos.experiments import footing_analysis as FA
from winpos.experiments import runs as R
from winpos.experiments import stats as ST

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "shapes" / "reproduce_hieradet.py")


# ---------------------------------------------------------------------------------------------- statistics
def _t_cdf_by_integration(t: float, df: int, steps: int = 20000) -> float:
    """P(T <= t) by Simpson's rule on Student's density from 0 to |t| (independent of stats.py's incomplete beta)."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    h = abs(t) / steps
    total = 0.0
    for i in range(steps + 1):
        x = i * h
        w = 1 if i in (0, steps) else (4 if i % 2 else 2)
        total += w * c * (1 + x * x / df) ** (-(df + 1) / 2)
    half = total * h / 3
    return 0.5 + half if t >= 0 else 0.5 - half


def test_tost_by_hand_against_an_independent_t_distribution():
    diffs = [0.10, 0.20, -0.10, 0.05, 0.15, 0.00, 0.12]
    n, m = len(diffs), 0.25
    mean, sd = statistics.fmean(diffs), statistics.stdev(diffs)
    se = sd / math.sqrt(n)
    lower = 1 - _t_cdf_by_integration((mean + m) / se, n - 1)  # H0: mean <= -0.25
    upper = _t_cdf_by_integration((mean - m) / se, n - 1)  # H0: mean >= +0.25
    res = ST.tost(diffs, m)
    assert res["p_lower"] == pytest.approx(lower, abs=1e-7) and res["p_upper"] == pytest.approx(upper, abs=1e-7)
    assert res["p"] == max(res["p_lower"], res["p_upper"])
    # by hand: mean 0.52 / 7 = 0.07429, sd 0.10064, se 0.03804; the upper test's t = (0.07429 - 0.25) / 0.03804 =
    # -4.619 with 6 df, between the printed one-sided 0.0025 (t 4.317) and 0.001 (t 5.208) points
    assert (mean - m) / se == pytest.approx(-4.619, abs=1e-3) and res["p"] == res["p_upper"]
    assert 0.001 < res["p"] < 0.0025
    q95 = 1.943180  # t(0.95, df 6), printed tables
    assert res["ci"] == pytest.approx((mean - q95 * se, mean + q95 * se), abs=1e-5)
    # the 90% interval inside the margin <=> TOST p < 0.05, and the other way round
    wide = [0.4, -0.3, 0.5, 0.1, -0.2]
    res_wide = ST.tost(wide, m)
    assert res_wide["p"] > 0.05 and not (-m < res_wide["ci"][0] and res_wide["ci"][1] < m)
    with pytest.raises(WinposError, match="margin"):
        ST.tost(diffs, 0.0)
    assert ST.tost([0.1], m)["p"] is None


def test_tost_power_is_the_rate_of_simulated_tosts():
    """Independent reference: simulated samples (normal, sd 0.45), each TOSTed at +-0.25; the quadrature must match
    the share shown equivalent within 4 Monte Carlo standard errors."""
    import numpy as np

    rng = np.random.default_rng(48)
    for n, true in ((24, 0.0), (24, 0.1), (12, 0.0)):
        crit = ST.t_quantile(0.95, n - 1)
        x = rng.standard_normal((60_000, n)) * 0.45 + true
        mean, se = x.mean(1), x.std(1, ddof=1) / np.sqrt(n)
        share = float(((mean - crit * se > -0.25) & (mean + crit * se < 0.25)).mean())
        power = ST.power_tost(true, 0.45, n, 0.25)
        assert abs(power - share) < 4 * math.sqrt(share * (1 - share) / 60_000) + 1e-3, (n, true, power, share)
    # the declared numbers (docs/equal_footing.md): n = 24, sd 0.45
    assert ST.power_paired(0.3, 0.45, 24) == pytest.approx(0.878, abs=1e-3)
    assert ST.power_tost(0.0, 0.45, 24, 0.25) == pytest.approx(0.680, abs=2e-3)


@pytest.mark.parametrize("n", [7, 12, 15])
def test_sign_flip_meets_in_the_middle_exactly(n):
    rng = random.Random(n)
    diffs = [round(rng.gauss(0.1, 0.4), 2) for _ in range(n)]  # rounded: ties among the pattern sums
    obs = sum(diffs)
    sums = [sum(s * d for s, d in zip(signs, diffs)) for signs in itertools.product((1, -1), repeat=n)]
    tol = 1e-12 * max(1.0, sum(abs(d) for d in diffs))
    assert ST.sign_flip_p(diffs) == sum(abs(s) >= abs(obs) - tol for s in sums) / 2 ** n
    assert ST.sign_flip_p(diffs, "greater") == sum(s >= obs - tol for s in sums) / 2 ** n
    assert ST.sign_flip_p([0.3] * 24) == pytest.approx(2 / 2 ** 24)
    with pytest.raises(WinposError, match="at most 40"):
        ST.sign_flip_p([0.1] * 41)


# ------------------------------------------------------------------------------------------------ the design
def _study(tmp_path, **kw):
    base = F.Footing(config=CONFIG, output_dir=str(tmp_path / "eq"), archive_dir=str(tmp_path / "arch"), workers=1)
    return F.equivalence_study(base) if not kw else __import__("dataclasses").replace(F.equivalence_study(base), **kw)


def test_the_equivalence_study_is_a_view_of_the_footing_specs(tmp_path):
    f = _study(tmp_path)
    f.validate()
    assert f.pipelines == tuple(range(12, 36)) and f.encodings == ("abs",) and f.stage1_iters == 2000
    specs = F.pipeline_specs(f, 12)
    names = [s["name"] for s in specs]
    assert names[:4] == ["p12/abs/stage0", "p12/abs/stage1", "p12/naive/canvas/1.25x/zero-shot",
                         "p12/abs2win/canvas/1.25x/zero-shot"]
    assert names[4] == "p12/abs/no-embedding"
    fin = specs[5:]
    assert [s["name"] for s in fin] == [f"p12/{r}/canvas/1.25x/seed{j}" for j in range(4) for r in ("naive", "abs2win")]
    # the same specs as the equal-footing study's, with this study's settings (not a copy of the code)
    plain = F.Footing(config=CONFIG, output_dir=f.output_dir, stage1_iters=2000)
    assert F.stage1_spec(f, 12, "abs") == F.stage1_spec(plain, 12, "abs")
    assert specs[1]["iters"] == 2000 and specs[1]["seed"] == 112 and specs[0]["iters"] == 400
    # finetuning seeds drawn from the pipeline's seed: 4 per pipeline, none shared across pipelines
    drawn = {p: [s["seed"] for s in F.finetune_specs(f, p)][::2] for p in f.pipelines}
    assert drawn[12] == [int(hashlib.sha256(f"112:{j}".encode()).hexdigest()[:8], 16) % 2 ** 31 for j in range(4)]
    every = [s for seeds in drawn.values() for s in seeds]
    assert len(every) == len(set(every)) == 96
    for a, b in zip(fin[::2], fin[1::2]):  # naive and abs2win of one seed: one stream, paired
        assert a["seed"] == b["seed"] and a["shapes"] == b["shapes"]
    # its own evaluation set: 1000 images from the pipeline's seed; the shared training images of the cell
    shared = F.dataset_params(1.25, "canvas")
    for s in specs[2:4] + fin:
        assert s["shapes"] == dict(shared, val_images=1000, val_seed=112)
    assert F.stage2_shapes(f, 13, "canvas", 1.25)["val_seed"] == 113
    # the stage-1 evaluation (and the reliance diagnosis) keep the shared 64 px set
    assert "val_seed" not in specs[1]["shapes"] and "val_seed" not in specs[4]["shapes"]
    with pytest.raises(WinposError, match="--archive"):
        _study(tmp_path, archive_dir=None).validate()
    with pytest.raises(WinposError, match="finetune rows"):
        _study(tmp_path, finetune_rows=("bogus",)).validate()


def _fake(diffs_fin, diffs_zs, seeds=(0, 1, 2, 3), pipelines=None, halves=0.0):
    """Collected data of the equivalence study: naive at 20 AP, abs-win at 20 + d (finetuned, every seed; zero-shot);
    the two halves of each evaluation set at AP +- ``halves``."""
    pipelines = pipelines or list(range(12, 12 + len(diffs_fin)))
    cell = "canvas 1.25x"

    def ap(v, sign):
        return {"box": v, "mask": v / 2, "halves": {"box": [v + sign * halves, v - sign * halves],
                                                    "mask": [v / 2, v / 2]}}

    fin = {"naive": {cell: {}}, "abs2win": {cell: {}}}
    zs = {"naive": {cell: {}}, "abs2win": {cell: {}}}
    for p, d, z in zip(pipelines, diffs_fin, diffs_zs):
        fin["naive"][cell][str(p)] = {str(s): ap(20.0, 1) for s in seeds}
        fin["abs2win"][cell][str(p)] = {str(s): ap(20.0 + d, -1) for s in seeds}
        zs["naive"][cell][str(p)] = ap(15.0, 1)
        zs["abs2win"][cell][str(p)] = ap(15.0 + z, 1)
    ap64 = {"abs": {str(p): {"box": 30.0, "mask": 20.0} for p in pipelines}}
    ne = {str(p): {"box": 27.0 - 0.1 * i, "mask": 18.0} for i, p in enumerate(pipelines)}
    return {"stage0": {}, "ap64": ap64, "zero_shot": zs, "finetuned": fin, "no_embedding": ne, "started_utc": {},
            "missing": [], "replication": None}


def test_verdicts_shown_equivalent_undecided_and_holm_over_the_two(tmp_path):
    f = _study(tmp_path)
    rng = random.Random(0)
    small = [rng.gauss(0.0, 0.1) for _ in range(24)]
    big = [0.6 + rng.gauss(0.0, 0.1) for _ in range(24)]
    wide = [rng.gauss(0.0, 1.5) for _ in range(24)]
    res = FA.analyze_equivalence(f, _fake(small, big, halves=0.05))
    d1, d2 = res["tests"]["box"]["D1"], res["tests"]["box"]["D2"]
    assert res["complete"] and res["whole_pipelines"] == [str(p) for p in range(12, 36)]
    assert d1["diffs"] == pytest.approx(small) and d1["n"] == 24
    assert d1["verdict"].startswith("equivalent within +-0.25") and d2["verdict"].startswith("shown: abs-win better")
    # Holm by hand over the two t p values and, apart, over the two TOST p values
    lo, hi = sorted([d1["p_t"], d2["p_t"]])
    assert min(d1["p_holm"], d2["p_holm"]) == pytest.approx(min(1, 2 * lo))
    assert max(d1["p_holm"], d2["p_holm"]) == pytest.approx(max(min(1, 2 * lo), hi))
    assert d1["tost_p_holm"] == pytest.approx(min(1, 2 * min(d1["tost_p"], d2["tost_p"])))
    assert d1["tost_p"] == pytest.approx(ST.tost(small, 0.25)["p"])
    assert res["sentence"].startswith("Abs-win - naive after finetuning at canvas 1.25x is ")
    assert "equivalent within +-0.25" in res["sentence"] and "24 independently trained detectors" in res["sentence"]
    # evaluation noise: the halves differ by 2 * 0.05 per row in opposite directions -> contrast of halves 0.2
    assert res["evaluation_noise"]["box"]["D1"]["n"] == 24
    assert res["evaluation_noise"]["box"]["D1"]["sd_eval"] == pytest.approx(0.0, abs=1e-9)  # the same every pipeline
    assert res["reliance"]["box"]["mean"] == pytest.approx(statistics.fmean(3.0 + 0.1 * i for i in range(24)))
    assert {"naive", "abs2win"} <= set(res["finetuned"]) and {"naive", "abs2win"} <= set(res["zero_shot"])
    undecided = FA.analyze_equivalence(f, _fake(wide, wide))["tests"]["box"]["D1"]
    assert undecided["verdict"].startswith("undecided")


def test_interim_before_every_pipeline_is_whole_or_with_other_seeds(tmp_path):
    f = _study(tmp_path)
    part = FA.analyze_equivalence(f, _fake([0.01] * 10, [0.0] * 10))
    assert not part["complete"] and part["tests"]["box"]["D1"]["verdict"] == \
        "interim: 10 of the 24 declared pipelines whole, no verdict"
    assert part["sentence"].startswith("Interim (10 of 24 declared pipelines whole, no verdict)")
    from winpos.experiments.equivalence_report import format_equivalence, plot_equivalence

    # no peeking: while interim, no estimate, interval, p value or per-pipeline difference is printed or drawn
    text = format_equivalence(part)
    assert "withheld" in part["sentence"] and "+0.01" not in part["sentence"]
    assert "TOST p lower" not in text and "per pipeline:" not in text and "mean +" not in text
    assert "observed sd" not in text
    assert text.count("withheld until the study is whole") == 4  # D1, D2 for box and mask
    # nor each row's mean at the cell, whose difference is the estimate (the reports printed both rows before)
    assert part["zero_shot"] is None and part["finetuned"] is None
    assert "canvas 1.25x naive" not in text and "canvas 1.25x abs2win" not in text
    assert "per row at canvas 1.25x: withheld while interim" in text
    assert plot_equivalence(part, str(tmp_path / "interim.png"))
    fewer = FA.analyze_equivalence(_study(tmp_path, pipelines=(12, 13)), _fake([0.0] * 24, [0.0] * 24))
    assert fewer["interim"] == "2 of the 24 declared pipelines asked for"
    assert fewer["tests"]["box"]["D1"]["verdict"].startswith("interim: 2 of the 24 declared pipelines asked for")
    seeds = FA.analyze_equivalence(_study(tmp_path, finetune_seeds=(0, 1)), _fake([0.0] * 24, [0.0] * 24, (0, 1)))
    assert seeds["interim"] == "finetuning seeds [0, 1] asked for, [0, 1, 2, 3] declared"
    assert all(t["verdict"].startswith("interim") for t in seeds["tests"]["box"].values())


def test_the_report_says_the_verdict_the_tost_p_values_and_draws_the_figure(tmp_path):
    from winpos.experiments.equivalence_report import format_equivalence, plot_equivalence

    rng = random.Random(1)
    res = FA.analyze_equivalence(_study(tmp_path), _fake([rng.gauss(0.05, 0.3) for _ in range(24)],
                                                         [rng.gauss(0.2, 0.3) for _ in range(24)], halves=0.1))
    text = format_equivalence(res)
    d1 = res["tests"]["box"]["D1"]
    assert res["sentence"] in text and "24 of 24 pipelines whole: complete" in text
    assert f"TOST p lower {d1['tost_p_lower']:.4f} / upper {d1['tost_p_upper']:.4f}" in text
    assert "per pipeline: p12 " in text and "evaluation noise (split halves, 24 pipelines)" in text
    assert "power as declared (n = 24, pipeline sd 0.45): t test at a true +-0.3 AP 0.88" in text
    assert "reliance, 64 px AP lost when the embedding is zeroed: box +4.15" in text
    png = tmp_path / "eq.png"
    assert plot_equivalence(res, str(png)) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    empty = FA.analyze_equivalence(_study(tmp_path), _fake([], []))
    assert not plot_equivalence(empty, str(tmp_path / "none.png")) and not (tmp_path / "none.png").exists()


def _finish(spec, ap=17.0):
    R.claim(spec)
    res = {"spec": spec, "seconds": 1.0, "started_utc": "2026-12-05T03:00:00Z"}
    if spec["kind"] == "stage0":
        res.update(history=[{"iter": 0, "ws": None, "loss": None}, {"iter": 4, "ws": 0.1, "loss": 0.06}],
                   reliance={"learned": 0.06})
    else:
        res.update(bbox={"AP": ap}, segm={"AP": ap / 2})
    (Path(spec["out"]) / R.RESULT).write_text(json.dumps(R.seal(res, spec)))


def test_a_whole_pipeline_is_archived_then_its_folders_and_evaluation_set_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("WINPOS_DATA", str(tmp_path / "data"))
    f = _study(tmp_path, pipelines=(12,))
    for s in F.pipeline_specs(f, 12):
        _finish(s)
        A.keep(s, f.archive_dir)
    from winpos.data.shapes import shapes_val_dir

    val = shapes_val_dir(**F.stage2_shapes(f, 12, "canvas", 1.25))
    val.mkdir(parents=True)
    logs = []
    FR.run(f, log=logs.append)  # nothing to run: every run is archived; the tidy-up removes what no report reads
    assert not (tmp_path / "eq" / "pipeline12").exists() and not val.exists()
    assert any("every run archived; removed" in line for line in logs)
    data = FR.collect(f)
    assert data["missing"] == [] and len(data["finetuned"]["abs2win"]["canvas 1.25x"]["12"]) == 4


# ------------------------------------------------------------------------------- the command (issue 45)
def _rope_archive(tmp_path):
    f = F.Footing(config=CONFIG, output_dir=str(tmp_path / "study"), pipelines=(0,), encodings=("rope",),
                  archive_dir=str(tmp_path / "arch"))
    for s in F.chain_specs(f, 0, "rope"):
        _finish(s)
    FR.archive_all(f, log=lambda m: None)
    return f


def test_report_only_on_fewer_pipelines_or_seeds_is_interim_and_writes_nothing(tmp_path, capsys):
    from winpos.cli.reproduce import main

    _rope_archive(tmp_path)
    out = tmp_path / "study"
    (out / "results.json").write_text('{"declared": true}')
    base = ["--equal-footing", "--config", CONFIG, "--output", str(out), "--encodings", "rope", "--no-finetune",
            "--archive", str(tmp_path / "arch"), "--report-only"]
    assert main(base + ["--pipelines", "0"]) == 0
    text = capsys.readouterr().out
    assert "interim (1 of the 6 declared pipelines asked for): nothing written" in text
    assert "confirmed" not in text and "not shown" not in text  # no verdict on a selection
    assert main(base + ["--pipelines", "0,1,2,3,4,5", "--seeds", "0,1"]) == 0
    assert "interim (finetuning seeds [0, 1] asked for, [0, 1, 2] declared): nothing written" in capsys.readouterr().out
    assert (out / "results.json").read_text() == '{"declared": true}'  # the declared report is untouched
    assert not list(out.glob("*.png"))  # nor its figures


def test_a_second_study_into_a_held_folder_is_refused_at_once(tmp_path, capsys):
    from winpos.cli.reproduce import main
    from winpos.utils.output_folders import lock_folder

    out = tmp_path / "study"
    out.mkdir()
    fd = lock_folder(out, "held")
    try:
        code = main(["--equal-footing", "--config", CONFIG, "--output", str(out), "--pipelines", "0"])
    finally:
        __import__("os").close(fd)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "is held by another study (pid" in err[0] and "--output" in err[0]


def test_ctrl_c_is_one_line_and_starts_no_further_run(tmp_path, capsys, monkeypatch):
    from winpos.cli.reproduce import main

    started = []

    def interrupted(spec, log):
        started.append(spec["name"])
        raise KeyboardInterrupt

    monkeypatch.setattr(R, "launch", interrupted)
    code = main(["--equal-footing", "--config", CONFIG, "--output", str(tmp_path / "s"), "--pipelines", "0,1",
                 "--encodings", "rope,relpos", "--workers", "1"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 130 and started == ["p0/rope/stage0"]
    assert err == ["interrupted: the runs that finished are kept (and archived with --archive); the same command "
                   "continues from them"]


def test_split_half_ap_scores_each_half_and_the_whole_set_with_pycocotools(tmp_path, monkeypatch):
    """The evaluation-noise readout of a run (child.split_half_ap) on a tiny evaluation set of its own: detections
    equal to the ground truth of the even images only score AP 100 on the even half, 0 on the odd half and about
    half on the whole set (the one-class json the evaluation uses)."""
    import pycocotools.mask as mask_utils

    from winpos.data.shapes import ensure_shapes_dataset, one_class_json
    from winpos.experiments.child import split_half_ap

    monkeypatch.setenv("WINPOS_DATA", str(tmp_path / "data"))
    shapes = dict(image_size=64, train_images=2, val_images=6, min_objects=1, max_objects=2, val_seed=112)
    spec = dict(name="t", kind="detect", config=CONFIG, encoding="abs_learned", size=64, shapes=shapes, iters=0,
                seed=0, lr=1e-3, init="", threads=1, out=str(tmp_path / "run"))
    gt = json.loads(one_class_json(ensure_shapes_dataset(**shapes)["shapes_val"][0]).read_text())
    ids = sorted(im["id"] for im in gt["images"])
    dets = []
    for a in gt["annotations"]:  # the even images' objects, exactly
        if a["image_id"] in ids[0::2]:
            rle = mask_utils.merge(mask_utils.frPyObjects(a["segmentation"], 64, 64))
            dets.append({"image_id": a["image_id"], "category_id": 1, "bbox": a["bbox"], "score": 1.0,
                         "segmentation": dict(rle, counts=rle["counts"].decode())})
    (tmp_path / "run" / "inference").mkdir(parents=True)
    (tmp_path / "run" / "inference" / "coco_instances_results.json").write_text(json.dumps(dets))
    res = split_half_ap(spec)
    assert res["bbox"] == [pytest.approx(100.0), pytest.approx(0.0)]
    assert res["segm"] == [pytest.approx(100.0), pytest.approx(0.0)]
    assert 20 < res["all"]["bbox"] < 80  # half the objects found, each perfectly
