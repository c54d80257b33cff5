"""Paired statistics (winpos.experiments.stats) against printed Student-t tables and hand computations, and the
report's pair table (winpos.experiments.report) built from made-up runs."""
import math

import pytest

from winpos.experiments import stats as S


@pytest.mark.parametrize("df,q975", [(1, 12.7062), (2, 4.3027), (4, 2.7764), (9, 2.2622), (29, 2.0452),
                                     (1000, 1.9623)])
def test_t_quantiles_match_the_printed_table(df, q975):
    assert S.t_quantile(0.975, df) == pytest.approx(q975, abs=1e-4)
    assert S.t_quantile(0.025, df) == pytest.approx(-q975, abs=1e-4)


@pytest.mark.parametrize("t,df,cdf", [(0.0, 3, 0.5), (1.0, 1, 0.75), (2.0, 2, 0.5 + 1 / math.sqrt(6)),
                                      (-1.5, 7, 0.0886492)])
def test_t_cdf_closed_forms(t, df, cdf):
    # df=1: Cauchy, 1/2 + atan(t)/pi; df=2: 1/2 + t / (2 sqrt(2 + t^2))
    assert S.t_cdf(t, df) == pytest.approx(cdf, abs=1e-6)


def test_paired_difference_by_hand():
    treat, base = {0: 10.86, 1: 10.61, 2: 9.97, 9: 1.0}, {0: 10.0, 1: 10.0, 2: 10.0, 5: 3.0}
    r = S.paired(treat, base)
    diffs = [0.86, 0.61, -0.03]
    mean = sum(diffs) / 3
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2)
    half = 4.302653 * sd / math.sqrt(3)
    assert r["n"] == 3 and r["seeds"] == [0, 1, 2]  # seeds 5 and 9 have no partner
    assert r["per_seed"] == pytest.approx(diffs)
    assert r["mean"] == pytest.approx(mean) and r["sd"] == pytest.approx(sd)
    assert r["ci"] == pytest.approx((mean - half, mean + half), abs=1e-5)
    t = mean / (sd / math.sqrt(3))
    assert r["p"] == pytest.approx(2 * (1 - S.t_cdf(t, 2)))
    assert r["p"] == pytest.approx(0.2118, abs=1e-3) and r["excludes_zero"] is False
    assert "+0.48 [-0.66, +1.62] p=0.212 (n=3)" == S.describe(r)


def test_a_consistent_gain_excludes_zero_and_one_seed_has_no_interval():
    r = S.paired({s: 1.0 + 0.1 * s for s in range(5)}, {s: 0.0 for s in range(5)})
    assert r["excludes_zero"] and r["ci"][0] > 0 and r["p"] < 1e-4
    one = S.paired({0: 2.0}, {0: 1.0})
    assert one["ci"] is None and one["p"] is None and S.describe(one) == "+1.00 AP (n=1: no interval)"
    same = S.paired({0: 2.0, 1: 3.0}, {0: 1.0, 1: 2.0})  # identical differences: sd 0
    assert same["p"] == 0.0 and same["ci"] == (1.0, 1.0)


def _run(row, cond, size, seed, box, iters=10):
    return {"spec": {"name": f"{row}/{cond}/x/seed{seed}", "size": size, "seed": seed, "iters": iters},
            "bbox": {"AP": box}, "segm": {"AP": box / 2}}


def test_report_pairs_are_paired_by_seed_and_say_the_multiplicity(tmp_path):
    from winpos.experiments.report import format_pairs, format_table, format_zero_shot, plot_curve, summarize

    runs = [_run("naive", "canvas", 96, s, 40 + s) for s in range(5)]
    runs += [_run("abs2win", "canvas", 96, s, 41.5 + s + 0.1 * (s % 2)) for s in range(5)]
    runs += [_run("control", "canvas", 96, s, 40 + s + (0.5 if s % 2 else -0.5)) for s in range(5)]
    runs += [_run(r, "canvas", k, 0, v, iters=0) for r, k, v in
             (("naive", 96, 30.0), ("abs2win", 96, 36.0), ("control", 96, 30.0), ("naive", 128, 20.0),
              ("abs2win", 128, 27.0))]
    summary = summarize({"seeds": [0, 1, 2, 3, 4], "finetune_iters": 10}, None, {}, runs)
    pairs = {(e["treatment"], e["baseline"], e["multiplier"]): e for e in summary["pairs"]}
    head = pairs[("abs2win", "naive", "1.5x")]
    assert head["zero_shot_box"] == 6.0 and head["box"]["n"] == 5 and head["box"]["excludes_zero"]
    assert head["box"]["mean"] == pytest.approx(1.54)
    ctrl = pairs[("abs2win", "control", "1.5x")]
    assert ctrl["box"]["n"] == 5 and ctrl["zero_shot_box"] == 6.0
    assert pairs[("abs2win", "naive", "2x")]["zero_shot_box"] == 7.0 and "box" not in pairs[("abs2win", "naive", "2x")]
    table = format_pairs(summary)
    assert "| (b) - (a) | canvas 1.5x | +6.0 / +3.0 | +1.54 [" in table
    assert "2 finetuned pair tests (box AP)" in table and "Bonferroni: p < 0.0250" in table
    assert "beyond" not in table.lower()
    assert "| (a) abs, naive interpolation | 42.0 / 21.0 (5) |" in format_table(summary)
    assert summary["finetuned_rng_seeded"] == {"seeded": 0, "runs": 15}
    assert "0 of 15 finetuned runs were made with the global RNGs seeded" in format_table(summary)
    assert "the other 15 drew their proposal sampling from an unseeded stream" in format_table(summary)
    for out in runs[:4]:
        out["global_rng_seeded"] = True
    assert summarize({}, None, {}, runs)["finetuned_rng_seeded"] == {"seeded": 4, "runs": 15}
    for out in runs:
        out["global_rng_seeded"] = True
    text = format_table(summarize({}, None, {}, runs))
    assert "15 of 15 finetuned runs were made with the global RNGs seeded" in text and "other" not in text
    assert "| (b) abs -> abs-win on import | 36.0 / 18.0 | 27.0 / 13.5 |" in format_zero_shot(summary)
    png = tmp_path / "curve.png"
    plot_curve(summary, str(png), "canvas")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_curve_label_gives_a_row_its_own_stage1_ap_unless_the_reference_line_shows_it():
    from winpos.experiments.report import _curve_label

    stage1 = {"abs_learned": {"box_AP_64px": 36.79}, "rope": {"box_AP_64px": 29.2}, "lookhere": {}}
    assert _curve_label("naive", stage1, "abs_learned") == "(a) abs, naive interpolation"
    assert _curve_label("rope", stage1, "abs_learned") == "(e) RoPE (64 px: 29.2)"
    assert _curve_label("lookhere", stage1, "abs_learned") == "(f) LookHere"  # no 64 px AP recorded: none invented
    assert _curve_label("naive", stage1, None) == "(a) abs, naive interpolation (64 px: 36.8)"
