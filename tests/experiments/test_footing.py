"""The equal-footing study (winpos.experiments.footing): stage 0 trains every encoding with itself, pipelines are
independent and paired by seed, the declared tests compute what docs/equal_footing.md says (checked against
references written here: brute-force sign flips, Holm by hand, a t interval from tabulated quantiles), and a
finished run's result is sealed and pruned."""
import itertools
import json
import statistics
from pathlib import Path

import pytest
import torch

from winpos.backbones import create
from winpos.errors import WinposError
from winpos.experiments import footing as F
from winpos.experiments import footing_runs as FR
from winpos.experiments import pretrain as S0
from winpos.experiments import runs as R
from winpos.experiments import stats as ST

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "shapes" / "reproduce_hieradet.py")
MEAN, STD = [123.675, 116.28, 103.53], [58.395, 57.12, 57.375]


@pytest.mark.parametrize("position", ["rope", "lookhere"])
def test_stage0_trains_a_backbone_without_a_token_embedding(position):
    torch.manual_seed(0)
    net = create("hieradet_toy", "original", embed_dim=16, num_heads=1, window_spec=(4, 2, 0, 2), img_size=64,
                 pretrain_img_size=64, pos_embed="none", window_pos=position, global_pos=position,
                 drop_path_rate=0.0)
    before = [p.detach().clone() for p in net.parameters()]
    spec = S0.PretrainSpec(iters=4, batch=4, images=270, mask_ratio=0.0, log_every=2)
    out = S0.pretrain(net, spec, MEAN, STD)
    assert [h["ws"] for h in out["history"]] == [None, None, None]  # no absolute embedding: no WS
    assert set(out["reliance"]) == {"learned"} and out["reliance"]["learned"] > 0
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, net.parameters()))


def test_stage0_gives_position_parameters_no_weight_decay():
    torch.manual_seed(0)
    net = create("hieradet_toy", "original", embed_dim=16, num_heads=1, window_spec=(4, 2, 0, 2), img_size=64,
                 pretrain_img_size=64, pos_embed="abs", window_pos="relpos", global_pos="relpos",
                 drop_path_rate=0.0)
    extra = [torch.nn.Parameter(torch.zeros(3))]
    decayed, free = S0.param_groups(net, extra)
    names = {id(p): n for n, p in net.named_parameters()}
    free_names = sorted(names[id(p)] for p in free["params"])
    assert free["weight_decay"] == 0.0 and "weight_decay" not in decayed
    assert free_names == sorted(n for n in names.values() if n.startswith("pos_embed.") or ".rel_pos_" in n)
    assert len(free_names) == 1 + 2 * len(net.blocks)  # the embedding and every block's two tables
    assert len(decayed["params"]) + len(free["params"]) == len(names) + 1 and extra[0] is decayed["params"][-1]


def test_pipelines_are_independent_and_encodings_paired_within_one():
    f = F.Footing(config=CONFIG, output_dir="/x")
    f.validate()
    seeds = {(p, e): (F.stage0_spec(f, p, e)["seed"], F.stage1_spec(f, p, e)["seed"])
             for p in f.pipelines for e in f.encodings}
    assert {seeds[(0, e)] for e in f.encodings} == {(100, 100)}  # one pipeline: one seed for every encoding
    assert len({seeds[(p, "rope")] for p in f.pipelines}) == len(f.pipelines)  # pipelines: their own seeds
    for e in f.encodings:  # every encoding starts stage 1 from its own stage 0, trained with the same encoding
        s0, s1 = F.stage0_spec(f, 2, e), F.stage1_spec(f, 2, e)
        assert s1["init"] == str(Path(s0["out"]) / "backbone.pth") and s0["encoding"] == s1["encoding"]
        assert s0["iters"] == 400 and s1["iters"] == 600 and s0["mask_ratio"] == 0.0
    zero = [s["name"] for s in F.chain_specs(f, 0, "abs")[2:]]
    assert "p0/abs2win/canvas/4x/zero-shot" in zero and not any("control" in n for n in zero)
    assert F.finetune_specs(f, 0) == []  # finetuning only when asked
    study = F.Footing(config=CONFIG, output_dir="/x", finetune=True)
    fine = F.finetune_specs(study, 0)
    assert len(fine) == 18 and all(s["keep_weights"] is False for s in fine)
    assert sorted({s["size"] for s in fine}) == [80, 256]  # canvas 4x (T3 / T4) and the demo's 1.25x (T5 / T6)
    # the declared cell's runs of every pipeline come before any run of the added cell
    order = [s["size"] for s in F.all_specs(study) if s["iters"] > 0 and s["kind"] == "detect" and s["seed"] < 100]
    assert order == [256] * 9 * 6 + [80] * 9 * 6
    # the diagnosis: each abs detector at 64 px with its embedding zeroed, after its chain, archived like any run
    ne = F.no_embedding_spec(f, 3)
    assert ne["zero_embedding"] is True and ne["iters"] == 0 and ne["size"] == 64
    assert ne["init"] == str(Path(F.stage1_spec(f, 3, "abs")["out"]) / "model_final.pth")
    assert Path(ne["out"]).parent.name == "diagnosis" and ne["out"] != F.stage1_spec(f, 3, "abs")["out"]
    assert [s for s in F.all_specs(f) if s.get("zero_embedding")] == [F.no_embedding_spec(f, p) for p in f.pipelines]
    assert F.diagnosis_specs(F.Footing(config=CONFIG, encodings=("rope",)), 0) == []


def test_diagnosis_reliance_structure_and_zero_shot_gain():
    ap = lambda vals: {str(p): {"box": v, "mask": v / 2} for p, v in enumerate(vals)}  # noqa: E731
    data = {"ap64": {"abs": ap([16, 15, 17])}, "finetuned": {}, "stage0": {},
            "zero_shot": {"naive": {"canvas 2x": ap([11, 12, 13])}, "abs2win": {"canvas 2x": ap([12, 12, 14])}},
            "no_embedding": {str(p): dict(ap([15, 15, 16])[str(p)], window_structure={"ws": w, "ws_naive_2x": 0.0})
                             for p, w in enumerate([0.5, 0.6, 0.7])}}
    d = F.diagnosis(data)
    assert d["reliance"]["box"]["mean"] == pytest.approx((1 + 0 + 1) / 3) and d["reliance"]["box"]["n"] == 3
    assert d["reliance"]["mask"]["mean"] == pytest.approx(1 / 3)
    assert d["window_structure"]["ws"]["mean"] == pytest.approx(0.6) and d["window_structure"]["ws"]["ci"] is not None
    assert d["zero_shot_gain"]["canvas 2x"]["box"]["mean"] == pytest.approx(2 / 3)
    from winpos.experiments.footing_report import format_footing

    with_rope = dict(data, ap64={**data["ap64"], "rope": ap([1, 2, 3])})
    text = format_footing(F.analyze(F.Footing(config=CONFIG), with_rope))
    assert "64 px AP lost when the embedding is zeroed: box +0.67" in text
    assert "zero-shot abs-win - naive, canvas 2x: box +0.67" in text and "centred WS@4 at 64 px 0.60 [" in text and "naive: 2x 0.00" in text
    empty = F.diagnosis({"ap64": {}, "zero_shot": {}})  # nothing run yet: no numbers, no failure
    assert empty["reliance"]["box"]["n"] == 0 and empty["window_structure"] == {} and empty["zero_shot_gain"] == {}


@pytest.mark.parametrize("kw,message", [(dict(encodings=("rope", "alibi")), "unknown encoding"),
                                        (dict(pipelines=(0, 0)), "without repeats"),
                                        (dict(stage1_iters=0), "stage1_iters=0 must be a positive int"),
                                        (dict(config="/nope.py"), "does not exist")])
def test_a_bad_study_is_refused_in_one_line(kw, message):
    with pytest.raises(WinposError, match=message):
        F.Footing(**{"config": CONFIG, **kw}).validate()


def _brute_sign_flip(diffs, two_sided=True):
    obs = statistics.fmean(diffs)
    means = [statistics.fmean([s * d for s, d in zip(signs, diffs)])
             for signs in itertools.product((1, -1), repeat=len(diffs))]
    hits = [abs(m) >= abs(obs) - 1e-12 if two_sided else m >= obs - 1e-12 for m in means]
    return sum(hits) / len(hits)


@pytest.mark.parametrize("diffs", [[1.0, 2.0, 0.5, 1.5, 3.0, 0.2], [1.0, -2.0, 0.5, -1.5, 3.0, 0.2],
                                   [0.3, -0.1, 0.2], [-1.0, -1.0, -1.0, 2.0]])
def test_sign_flip_matches_brute_force_and_has_its_floor(diffs):
    assert ST.sign_flip_p(diffs) == pytest.approx(_brute_sign_flip(diffs))
    assert ST.sign_flip_p(diffs, "greater") == pytest.approx(_brute_sign_flip(diffs, two_sided=False))
    assert ST.sign_flip_p([1.0] * 6) == pytest.approx(2 / 64) and ST.sign_flip_p([1.0] * 6, "greater") == 1 / 64


def test_t_test_interval_and_non_inferiority():
    diffs = [0.2, -0.5, 0.4, 0.1, -0.2, 0.6]
    res = ST.t_test(diffs)
    m, se = statistics.fmean(diffs), statistics.stdev(diffs) / 6 ** 0.5
    assert res["ci"] == pytest.approx((m - 2.5706 * se, m + 2.5706 * se), abs=1e-3)  # t(0.975, 5) = 2.5706
    ni = ST.t_test(diffs, shift=1.0, alternative="greater")  # H0: mean <= -1
    assert ni["p_t"] < 0.001 and ni["p_sign_flip"] == 1 / 64  # every diff + 1 is positive
    assert ni["ci"] == res["ci"]  # the interval is of the raw difference
    worse = ST.t_test([d - 1.5 for d in diffs], shift=1.0, alternative="greater")
    assert worse["p_t"] > 0.5


def test_holm_by_hand_and_missing_tests_count_as_one():
    adj = ST.holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.2})
    assert adj == pytest.approx({"a": 0.04, "c": 0.09, "b": 0.09, "d": 0.2})
    adj = ST.holm({"a": 0.01, "b": None, "c": 0.02, "d": None})
    assert adj["a"] == pytest.approx(0.04) and adj["c"] == pytest.approx(0.06) and adj["b"] is None


def _data(rope, relpos, lookhere_z, rope_z):
    ap = lambda vals: {str(p): {"box": v, "mask": v / 2} for p, v in enumerate(vals)}  # noqa: E731
    return {"ap64": {"rope": ap(rope), "relpos": ap(relpos)},
            "zero_shot": {"lookhere": {"canvas 2x": ap(lookhere_z), "canvas 4x": ap(lookhere_z)},
                          "rope": {"canvas 2x": ap(rope_z), "canvas 4x": ap(rope_z)}},
            "finetuned": {}, "stage0": {}}


# six pipelines' finetuned box AP per finetuning seed: naive, abs-win, control
_SIX_FINETUNED = ([[10, 11, 12], [9, 9, 9], [12, 13, 11], [10, 10, 10], [8, 9, 10], [11, 11, 11]],
                  [[12, 12, 13], [10, 12, 10], [13, 13, 14], [11, 12, 11], [10, 10, 11], [12, 13, 12]],
                  [[11, 11, 12], [9, 10, 10], [12, 14, 12], [10, 11, 11], [9, 10, 11], [11, 12, 12]])


def _six_pipelines():
    return _data([30, 31, 29, 32, 30, 31], [30.5, 30.8, 29.6, 31.5, 30.2, 31.1], [20, 22, 21, 23, 20, 22],
                 [15, 16, 15.5, 17, 14, 16])


def test_declared_tests_verdicts_follow_holm():
    data = _six_pipelines()
    tests = F.declared_tests(data, "box")
    assert tests["T1"]["verdict"].startswith("RoPE non-inferior") and tests["T1"]["p_holm"] < 0.05
    assert tests["T2"]["verdict"].startswith("confirmed: the first row") and tests["T2"]["mean"] == pytest.approx(5.75)
    assert tests["T3"]["verdict"] == "not run (n=0)" and tests["T3"]["p_holm"] is None
    # Holm over the family of four, two missing counted as p = 1
    assert tests["T2"]["p_holm"] == pytest.approx(min(1, 4 * min(tests["T1"]["p_t"], tests["T2"]["p_t"])))
    small = _data([30, 31], [30.5, 29], [20, 21], [20.5, 20.2])
    assert F.declared_tests(small, "box", declared_n=2)["T2"]["verdict"].startswith("not shown")
    interim = F.declared_tests(small, "box")  # 2 of the 6 declared pipelines: numbers, no verdict
    assert interim["T2"]["verdict"] == "interim: 2 of the 6 declared pipelines, no verdict"
    assert interim["T2"]["p_t"] is not None


def _finetuned(cell, naive, abs2win, control):
    """Per pipeline and seed: ``naive[p][s]`` etc. (box AP; mask AP is half)."""
    rows = {"naive": naive, "abs2win": abs2win, "control": control}
    return {row: {cell: {str(p): {str(s): {"box": v, "mask": v / 2} for s, v in enumerate(seeds)}
                         for p, seeds in enumerate(vals)}} for row, vals in rows.items()}


def test_finetuning_tests_use_detector_means_and_the_added_pair_pays_for_itself():
    data, (naive, win, ctrl) = _six_pipelines(), _SIX_FINETUNED
    data["finetuned"] = _finetuned("canvas 4x", naive, win, ctrl)
    for row, cells in _finetuned("canvas 1.25x", naive, win, ctrl).items():
        data["finetuned"][row].update(cells)
    tests = F.declared_tests(data, "box")
    by_hand = [statistics.fmean(w) - statistics.fmean(n) for w, n in zip(win, naive)]  # detector-level means
    assert tests["T3"]["n"] == 6 and tests["T3"]["mean"] == pytest.approx(statistics.fmean(by_hand))
    assert tests["T5"]["mean"] == pytest.approx(tests["T3"]["mean"]) and tests["T5"]["p_t"] == tests["T3"]["p_t"]
    p = {k: t["p_t"] for k, t in tests.items()}
    # T1-T4 adjusted over the declared four only; T5 / T6 over all six, so never below T3 / T4's adjustment
    assert tests["T3"]["p_holm"] == pytest.approx(ST.holm({k: p[k] for k in ("T1", "T2", "T3", "T4")})["T3"])
    assert tests["T5"]["p_holm"] == pytest.approx(ST.holm(p)["T5"]) and tests["T5"]["p_holm"] >= tests["T3"]["p_holm"]
    assert tests["T3"]["holm_family"] == ["T1", "T2", "T3", "T4"] and len(tests["T6"]["holm_family"]) == 6
    result = F.analyze(F.Footing(config=CONFIG, output_dir="/x"), data)
    assert set(result["power"]) == {"T3", "T4", "T5", "T6"} and result["t4_power"] == result["power"]["T4"]
    assert result["finetuned"]["abs2win"]["canvas 4x"]["box"]["mean"] == pytest.approx(
        statistics.fmean(statistics.fmean(w) for w in win))


def test_finetuned_figure_is_drawn_only_when_there_is_a_finetuning_run(tmp_path):
    from winpos.experiments.footing_report import format_footing, plot_finetuned

    data = _data([30, 31, 29], [30.5, 30.8, 29.6], [20, 22, 21], [15, 16, 15.5])
    f = F.Footing(config=CONFIG, output_dir=str(tmp_path))
    assert plot_finetuned(F.analyze(f, data), str(tmp_path / "none.png")) is False
    assert not (tmp_path / "none.png").exists()
    data["finetuned"] = _finetuned("canvas 4x", [[10, 11, 12], [9, 9, 9], [12, 13, 11], [30, 30]],
                                   [[12, 12, 13], [10, 12, 10], [13, 13, 14], [90, 90]],
                                   [[11, 11, 12], [9, 10, 10], [12, 14, 12], [50, 50]])
    result = F.analyze(f, data)
    assert plot_finetuned(result, str(tmp_path / "fine.png")) is True
    assert (tmp_path / "fine.png").stat().st_size > 10_000
    from PIL import Image

    width, height = Image.open(tmp_path / "fine.png").size  # a column per cell, levels above the paired differences
    assert (width, height) == (round(5.6 * 2 * 110), round(8.2 * 110))
    # pipeline 3 has two of the three finetuning seeds: left out of the means and the tests, not averaged over two
    assert result["tests"]["box"]["T3"]["n"] == 3 and result["finetuned"]["abs2win"]["canvas 4x"]["box"]["n"] == 3
    assert result["tests"]["box"]["T3"]["mean"] == pytest.approx(((37 - 33) + (32 - 27) + (40 - 36)) / 9)
    text = format_footing(result)
    assert "finetuned box / mask AP" in text and "power of T3 (box)" in text and "abs2win   canvas 4x: 12.1" in text


def test_report_says_what_its_intervals_cover_and_names_the_masked_variant():
    import copy

    from winpos.experiments.footing_report import format_footing

    result = json.loads((ROOT / "docs" / "results" / "equal_footing.json").read_text())
    text = format_footing(result)
    assert "every interval of this study covers training randomness only: all pipelines are evaluated on the same " \
        "images and finetuned with the same seeds (0, 1, 2)" in text
    assert "the masked stage-0 variant (hiera_mae: loss on masked units, masked tokens kept in the encoder, a linear " \
        "decoder; not Hiera's MAE), 8000 iterations" in text
    for change in ({"eval_images": 1000}, {"drawn_seeds": True}):  # evaluation sets or seeds of each pipeline's own
        other = copy.deepcopy(result)
        other["study"].update(change)
        assert "training randomness only" not in format_footing(other)


def test_power_grows_with_n():
    assert ST.power_paired(0.5, 1.0, 6) < ST.power_paired(0.5, 1.0, 30) < 1
    n = ST.n_for_power(0.5, 1.0)
    assert ST.power_paired(0.5, 1.0, n) >= 0.8 > ST.power_paired(0.5, 1.0, n - 1)
    assert n == 34  # d = 0.5, two-sided 0.05, 80%: the textbook noncentral-t answer


@pytest.mark.parametrize("n", [2, 3, 6, 12])
def test_power_is_the_rejection_rate_of_simulated_t_tests(n):
    """Independent reference: 100k simulated samples of n normal values (mean d, sd 1), each t-tested; the exact
    power must match the share rejected within 4 Monte Carlo standard errors, and equal alpha at d = 0."""
    import numpy as np

    crit = ST.t_quantile(0.975, n - 1)
    rng = np.random.default_rng(n)
    for d in (0.0, 0.4, 1.5):
        x = rng.standard_normal((100_000, n)) + d
        t = x.mean(1) / (x.std(1, ddof=1) / np.sqrt(n))
        share = float((np.abs(t) > crit).mean())
        power = ST.power_paired(d, 1.0, n)
        assert abs(power - share) < 4 * np.sqrt(share * (1 - share) / 100_000) + 1e-4, (n, d, power, share)
    assert ST.power_paired(0.0, 2.0, n) == pytest.approx(0.05, abs=1e-6)
    assert ST.power_paired(0.7, 1.0, n) == pytest.approx(ST.power_paired(-0.7, 1.0, n))


def _finished(tmp_path, keep_weights=True):
    spec = dict(name="r", kind="detect", config=CONFIG, iters=3, seed=0, out=str(tmp_path / "r"),
                keep_weights=keep_weights)
    R.claim(spec)
    out = Path(spec["out"])
    for name in ("model_0000049.pth", "model_final.pth", "init_stage0.pth", "last_checkpoint"):
        (out / name).write_bytes(b"w" * 1000)
    return spec, out


def test_a_killed_run_keeps_its_checkpoints_a_finished_one_only_what_reports_read(tmp_path):
    spec, out = _finished(tmp_path)
    assert R.prune(spec) == [] and (out / "model_0000049.pth").is_file()  # no result yet: it must resume
    (out / R.RESULT).write_text(json.dumps(R.seal({"bbox": {"AP": 1.0}}, spec)))
    assert sorted(R.prune(spec)) == ["init_stage0.pth", "model_0000049.pth"]
    assert (out / "model_final.pth").is_file()  # a stage-1 detector: later stages start from it
    spec2, out2 = _finished(tmp_path / "b", keep_weights=False)
    (out2 / R.RESULT).write_text(json.dumps(R.seal({"bbox": {"AP": 1.0}}, spec2)))
    assert R.finished(spec2) == json.loads((out2 / R.RESULT).read_text())  # reuse prunes a run killed before
    assert sorted(p.name for p in out2.iterdir()) == ["identity.json", "result.json"]


def test_an_edited_result_is_refused(tmp_path):
    spec, out = _finished(tmp_path)
    sealed = R.seal({"bbox": {"AP": 1.0}}, spec)
    (out / R.RESULT).write_text(json.dumps(sealed))
    assert R.finished(spec)["bbox"]["AP"] == 1.0
    (out / R.RESULT).write_text(json.dumps(dict(sealed, bbox={"AP": 9.0})))
    with pytest.raises(WinposError, match="does not match its integrity hash"):
        R.finished(spec)
    (out / R.RESULT).write_text(json.dumps({"bbox": {"AP": 1.0}}))  # unsealed: not a result this winpos wrote
    with pytest.raises(WinposError, match="integrity hash"):
        R.finished(spec)


def test_report_prints_the_tests_and_draws_a_dot_per_pipeline(tmp_path):
    from winpos.experiments.footing_report import format_footing, plot_footing

    data = _data([30, 31, 29], [30.5, 30.8, 29.6], [20, 22, 21], [15, 16, 15.5])
    data["zero_shot"]["rope"]["upscaled 2x"] = {"0": {"box": 9.0, "mask": 4.0}}
    data["stage0"] = {"rope": {str(p): {"history": [{"iter": 0, "ws": None, "loss": None},
                                                    {"iter": 400, "ws": None, "loss": 0.06}],
                                        "reliance": {"learned": 0.06}} for p in range(3)}}
    f = F.Footing(config=CONFIG, output_dir=str(tmp_path))
    result = F.analyze(f, data)
    assert result["ap64"]["rope"]["box"]["n"] == 3 and result["ap64"]["rope"]["box"]["ci"] is not None
    text = format_footing(result)
    assert "T1 RoPE - relpos, box AP" in text and "T1 RoPE - relpos, mask AP" in text
    assert "none (no abs embedding)" in text and "not run (n=0)" in text
    plot_footing(result, str(tmp_path / "curves.png"))
    assert (tmp_path / "curves.png").stat().st_size > 10_000


def test_the_replication_runs_only_its_cell_on_new_pipelines_and_is_collected_apart(tmp_path):
    study = F.Footing(config=CONFIG, output_dir=str(tmp_path), finetune=True)
    rep = F.replication_study(study)
    assert rep.pipelines == (6, 7, 8, 9, 10, 11) and rep.encodings == ("abs",) and rep.replication_pipelines == ()
    fine = [s for s in F.all_specs(rep) if s["iters"] > 0 and s["seed"] < 100]
    assert len(fine) == 6 * 9 and {s["size"] for s in fine} == {80}  # canvas 1.25x only: R5 / R6
    assert {s["seed"] for s in F.all_specs(rep) if s["kind"] == "stage0"} == set(range(106, 112))  # new detectors
    # not a replication of itself, nor of a study that does not finetune abs detectors
    assert F.replication_study(F.Footing(config=CONFIG, pipelines=tuple(range(12)), finetune=True)) is None
    assert F.replication_study(F.Footing(config=CONFIG, encodings=("rope",), finetune=True)) is None
    assert F.replication_study(F.Footing(config=CONFIG)) is None
    assert FR.collect(study)["replication"] is None  # nothing of it has run: no block in the report
    spec = F.finetune_spec(rep, 7, "abs2win", "canvas", 1.25, 1)  # one finished run of the replication
    R.claim(spec)
    (Path(spec["out"]) / R.RESULT).write_text(json.dumps(R.seal({"bbox": {"AP": 3.0}, "segm": {"AP": 1.5}}, spec)))
    data = FR.collect(study)
    assert data["replication"]["finetuned"] == {"abs2win": {"canvas 1.25x": {"7": {"1": {"box": 3.0, "mask": 1.5}}}}}
    assert data["finetuned"] == {} and "p7/abs2win/canvas/1.25x/seed1" not in data["replication"]["missing"]
    assert not any(name.startswith("p7/") for name in data["missing"])  # the study's own missing runs only
    for kw, message in ((dict(finetune_cells=(("canvas", 3),)), "subset of the study's cells"),
                        (dict(finetune_cells=()), "subset of the study's cells"),
                        (dict(replication_pipelines=(6, 6)), "without repeats")):
        with pytest.raises(WinposError, match=message):
            F.Footing(config=CONFIG, **kw).validate()


def test_replication_tests_use_the_new_pipelines_only_with_holm_over_the_two(tmp_path):
    from winpos.experiments.footing_report import format_footing, plot_replication

    data, (naive, win, ctrl) = _six_pipelines(), _SIX_FINETUNED
    data["finetuned"] = _finetuned("canvas 1.25x", naive, win, ctrl)
    r_naive = [[10, 10, 10], [9, 9, 10], [12, 11, 11], [10, 10, 11], [9, 9, 10], [11, 10, 11]]
    r_win = [[10, 11, 10], [9, 9, 9], [12, 12, 11], [10, 11, 11], [9, 10, 10], [11, 11, 11]]
    r_ctrl = [[10, 10, 11], [9, 10, 9], [11, 11, 12], [11, 10, 11], [9, 10, 9], [10, 11, 11]]
    shift = lambda d: {row: {c: {str(int(p) + 6): v for p, v in pipes.items()} for c, pipes in cells.items()}  # noqa: E731
                       for row, cells in d.items()}
    rep = {"finetuned": shift(_finetuned("canvas 1.25x", r_naive, r_win, r_ctrl)), "missing": [],
           "ap64": {"abs": {str(p): {"box": 16.0 + p % 2, "mask": 8.0} for p in range(6, 12)}},
           "zero_shot": {}, "no_embedding": {}, "stage0": {}}
    data["replication"] = rep
    result = F.analyze(F.Footing(config=CONFIG, output_dir="/x", finetune=True), data)
    tests = result["replication"]["tests"]["box"]
    by_hand = [statistics.fmean(w) - statistics.fmean(n) for w, n in zip(r_win, r_naive)]
    first = [statistics.fmean(w) - statistics.fmean(n) for w, n in zip(win, naive)]
    assert tests["R5"]["n"] == 6 and tests["R5"]["mean"] == pytest.approx(statistics.fmean(by_hand))
    assert tests["R5"]["p_t"] == pytest.approx(ST.t_test(by_hand)["p_t"])  # pipelines 0-5 do not enter the test
    p = {k: t["p_t"] for k, t in tests.items()}
    assert tests["R6"]["p_holm"] == pytest.approx(ST.holm(p)["R6"]) and tests["R5"]["holm_family"] == ["R5", "R6"]
    assert tests["R5"]["pooled"]["n"] == 12 and tests["R5"]["pooled"]["mean"] == pytest.approx(
        statistics.fmean(first + by_hand))
    assert tests["R5"]["verdict"].startswith("not shown")  # by hand: +0.22, interval includes 0 here
    assert result["tests"]["box"]["T5"]["mean"] == pytest.approx(statistics.fmean(first))  # T5 unchanged by it
    text = format_footing(result)
    assert "replication of T5 / T6 over pipelines 6-11" in text and "R5 (= T5 again)" in text
    assert "pooled with the study's pipelines (a description): +" in text
    assert plot_replication(result, str(tmp_path / "rep.png")) is True and (tmp_path / "rep.png").stat().st_size > 10_000
    assert plot_replication(dict(result, replication=None), str(tmp_path / "none.png")) is False
    assert not (tmp_path / "none.png").exists()
    four = {k: dict(v) for k, v in rep["finetuned"].items()}  # two pipelines still running: numbers, no verdict
    for row in four:
        four[row] = {"canvas 1.25x": {p: v for p, v in rep["finetuned"][row]["canvas 1.25x"].items() if int(p) < 10}}
    interim = F.analyze(F.Footing(config=CONFIG, output_dir="/x", finetune=True), dict(data, replication=dict(
        rep, finetuned=four)))
    assert interim["replication"]["tests"]["box"]["R5"]["verdict"] == "interim: 4 of the 6 declared pipelines, no verdict"
    none_yet = F.analyze(F.Footing(config=CONFIG, output_dir="/x", finetune=True), dict(data, replication=dict(
        rep, finetuned={})))  # chains done, no finetuning run whole: no test numbers, no pooled estimate printed
    assert none_yet["replication"]["tests"]["box"]["R5"]["verdict"] == "not run (n=0)"
    assert "replication of T5 / T6" in format_footing(none_yet) and "pooled with" not in format_footing(none_yet)
