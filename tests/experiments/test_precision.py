"""The mixed-precision study (winpos.experiments.precision): its runs, their identities and configs, its statistics
against values computed by hand, its verdicts, its text and figure, and its bad input. No training here: the
analysis runs on made-up results (the study itself is docs/precision.md)."""
import json
import math

import pytest

from winpos.errors import WinposError
from winpos.experiments import precision as Q
from winpos.experiments import runs as R
from winpos.experiments.protocol import Protocol, build_cfg
from winpos.model_zoo import config_path, demo_checkpoint

CONFIG = config_path("shapes/reproduce_hieradet.py")


def _protocol(tmp_path, seeds=(0, 1, 2)):
    return Protocol(config=CONFIG, output_dir=str(tmp_path / "prec"), rows=(Q.ROW,), multipliers=(1.25,),
                    conditions=("canvas",), seeds=seeds, finetune_iters=150, workers=1)


def test_specs_differ_only_in_precision_and_fp32_runs_keep_their_identity(tmp_path):
    p = _protocol(tmp_path)
    ckpt = str(demo_checkpoint())
    zero, fine = Q.precision_specs(p, ckpt)
    assert len(zero) == 3 * 2 and len(fine) == 3 * 3
    assert len({s["out"] for s in zero + fine}) == len(zero + fine)  # a folder each
    by = {(s.get("amp"), s["seed"]): s for s in fine}
    base = by[(None, 0)]
    assert "amp" not in base and "amp_eval" not in base  # float32: the spec of any float32 run
    for prec in ("bf16", "fp16"):
        s = by[(prec, 0)]
        assert s["amp"] == prec and s["amp_eval"] is False  # finetuned in prec, evaluated in float32
        ident, ident0 = R.identity(s), R.identity(base)
        assert {k for k in ident if ident.get(k) != ident0.get(k)} == {"amp", "amp_eval"}
    assert all(s["init"] == ckpt and s["iters"] == 150 for s in fine)
    inference = {(s.get("amp"), s["size"]): s for s in zero}
    assert set(inference) == {(a, size) for a in (None, "bf16", "fp16") for size in (64, 80)}
    assert all(s["iters"] == 0 and (s.get("amp_eval") is True) == ("amp" in s) for s in zero)


def test_the_run_config_trains_and_evaluates_in_the_spec_precision(tmp_path):
    p = _protocol(tmp_path)
    zero, fine = Q.precision_specs(p, str(demo_checkpoint()))
    fp16 = next(s for s in fine if s.get("amp") == "fp16")
    cfg = build_cfg(fp16)
    assert dict(cfg.train.amp) == {"enabled": True, "precision": "fp16", "eval": False}
    bf16_eval = next(s for s in zero if s.get("amp") == "bf16")
    assert dict(build_cfg(bf16_eval).train.amp) == {"enabled": True, "precision": "bf16", "eval": True}
    fp32 = next(s for s in fine if "amp" not in s)
    assert build_cfg(fp32).train.amp.enabled is False  # as the config has it


@pytest.mark.parametrize("precisions, message", [(("bf16", "fp32"), "must start with fp32"),
                                                 (("fp32", "fp8"), "unknown precision"),
                                                 (("fp32", "bf16", "bf16"), "list each once")])
def test_bad_precisions_are_refused(precisions, message, tmp_path):
    with pytest.raises(WinposError, match=message):
        Q.precision_specs(_protocol(tmp_path), str(demo_checkpoint()), precisions)


def _run(prec, seed=None, size=80, box=50.0, mask=40.0):
    spec = {"size": size, "seed": 0 if seed is None else seed}
    if prec != "fp32":
        spec["amp"] = prec
    return {"spec": spec, "bbox": {"AP": box}, "segm": {"AP": mask}, "seconds": 60.0, "started_utc": "2026"}


def _made_up(bf16_diffs, fp16_diffs):
    zero = [_run(p, size=s, box=50 + (p == "bf16") * 0.1 + (s == 80)) for p in Q.PRECISIONS for s in (64, 80)]
    base = [55.0, 56.0, 54.5, 55.5, 56.5]
    fine = [_run("fp32", i, box=b) for i, b in enumerate(base)]
    fine += [_run("bf16", i, box=b + d) for i, (b, d) in enumerate(zip(base, bf16_diffs))]
    fine += [_run("fp16", i, box=b + d) for i, (b, d) in enumerate(zip(base, fp16_diffs))]
    return zero, fine


def test_analysis_against_values_computed_by_hand():
    bf16 = [0.1, -0.2, 0.3, 0.0, 0.2]  # mean 0.08, sd 0.19235
    fp16 = [-3.0, -2.5, -3.5, -2.8, -3.2]  # clearly lower
    out = Q.analyze(*_made_up(bf16, fp16))
    b = out["contrasts"]["bf16"]
    assert b["bbox"]["mean"] == pytest.approx(0.08)
    sd = math.sqrt(sum((d - 0.08) ** 2 for d in bf16) / 4)
    assert b["bbox"]["sd"] == pytest.approx(sd)
    half = 2.776445 * sd / math.sqrt(5)  # t(0.975, 4)
    assert b["bbox"]["ci"] == pytest.approx((0.08 - half, 0.08 + half), abs=1e-5)
    t_upper = (0.08 - 1.0) / (sd / math.sqrt(5))  # TOST's upper test: t = (mean - margin) / se, df 4
    assert t_upper == pytest.approx(-10.695, abs=1e-3)
    assert b["tost"]["p_upper"] < 1e-3 and b["tost"]["p_lower"] < 1e-3
    assert b["verdict"] == "equivalent"
    f = out["contrasts"]["fp16"]
    assert f["verdict"] == "different" and f["bbox"]["p_t"] < 1e-4 and f["tost"]["p"] > 0.5
    assert f["bbox"]["p_sign_flip"] == pytest.approx(2 / 32)  # every sign negative: 2 of 2^5 patterns
    # Holm over the two contrasts: the smaller p doubled, the larger kept (or raised to the running max)
    pts = sorted([b["bbox"]["p_t"], f["bbox"]["p_t"]])
    assert f["p_t_holm"] == pytest.approx(min(1, 2 * pts[0]))
    assert b["p_t_holm"] == pytest.approx(max(min(1, 2 * pts[0]), pts[1]))
    assert out["inference"]["1.25x"]["bf16"]["bbox"] == pytest.approx(51.1)


def test_a_wide_spread_is_undecided():
    out = Q.analyze(*_made_up([2.0, -2.5, 1.5, -1.0, 0.5], [0.0, 0.1, -0.1, 0.05, -0.05]))
    assert out["contrasts"]["bf16"]["verdict"] == "undecided"
    assert out["contrasts"]["fp16"]["verdict"] == "equivalent"


def test_text_and_figure(tmp_path):
    summary = Q.analyze(*_made_up([0.1, -0.2, 0.3, 0.0, 0.2], [-3.0, -2.5, -3.5, -2.8, -3.2]))
    summary.update(protocol={"iters": 150, "multiplier": 1.25}, train_seconds={"fp32": 120.0, "bf16": 100.0,
                                                                              "fp16": 600.0})
    text = Q.format_precision(summary)
    assert "bf16: equivalent within +-1 box AP" in text and "fp16: different from float32" in text
    assert "fp16 - fp32, box AP: per seed -3.00, -2.50, -3.50, -2.80, -3.20" in text
    assert "1.25x: fp32 51.00 / 40.00 | bf16 51.10 / 40.00 (+0.10 / +0.00)" in text
    Q.plot_precision(summary, str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").stat().st_size > 10_000
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert Q.load_summary(tmp_path)["margin"] == 1.0


def test_report_only_without_a_study_is_one_line(tmp_path):
    from tests.bad_inputs_helpers import assert_one_line_error, tool

    r = tool("reproduce.py", "--precision", "--report-only", "--output", tmp_path / "none")
    assert_one_line_error(r, "summary.json does not exist", "winpos-reproduce --precision")
