"""The small-data study (winpos.experiments.small_data): its runs, their data and configs, its statistics against
values computed by hand, its verdicts, its text and figure, and its bad input. No training here (the study itself
is docs/small_data.md; a two-iteration run of one of its specs is in tests/d2/test_freeze.py)."""
import json
import math

import pytest

from winpos.errors import WinposError
from winpos.experiments import runs as R
from winpos.experiments import small_data as S
from winpos.experiments.protocol import build_cfg
from winpos.model_zoo import config_path, demo_checkpoint

CONFIG = str(config_path("shapes/reproduce_hieradet.py"))


def _specs(tmp_path, **kw):
    return S.small_data_specs(CONFIG, str(demo_checkpoint()), tmp_path / "sd", **kw)


def test_the_declared_runs_differ_only_in_what_trains_and_their_draw(tmp_path):
    specs = _specs(tmp_path)
    assert len(specs) == 3 * 2 * 4 and len({s["out"] for s in specs}) == len(specs)
    by = {(s["name"].split("/")[0], s["shapes"]["train_images"], s["seed"]): s for s in specs}
    full, trunk, heads = by[("full", 16, 2)], by[("trunk", 16, 2)], by[("heads", 16, 2)]
    assert "freeze" not in full and trunk["freeze"] == ["backbone.bottom_up"]
    assert heads["freeze"] == ["backbone", "proposal_generator"]
    ident = R.identity(full)
    assert {k for k, v in R.identity(trunk).items() if ident.get(k) != v} == {"freeze"}
    # the seed draws the training images (16 are the first of the 128), one held-out set for every run
    assert full["shapes"]["seed"] == S.TRAIN_SEED + 2 == by[("full", 128, 2)]["shapes"]["seed"]
    assert {s["shapes"]["seed"] for s in specs} == {S.TRAIN_SEED + i for i in range(4)}
    assert {(s["shapes"]["val_seed"], s["shapes"]["val_images"]) for s in specs} == {(S.VAL_SEED, S.VAL_IMAGES)}
    assert all(s["iters"] == 300 and s["lr"] == 2e-4 and s["classes"] == "shapes" and not s["keep_weights"]
               for s in specs)


def test_the_run_config_is_the_four_class_task_with_its_freeze(tmp_path):
    spec = next(s for s in _specs(tmp_path) if s["name"] == "heads/n128/seed3")
    cfg = build_cfg(spec)
    assert cfg.model.roi_heads.num_classes == 4
    assert (cfg.dataloader.train.dataset.names, cfg.dataloader.test.dataset.names) == ("shapes_train", "shapes_val")
    assert dict(cfg.dataloader.train.dataset.shapes)["train_images"] == 128
    assert list(cfg.train.freeze) == ["backbone", "proposal_generator"]
    assert cfg.train.init_checkpoint == str(demo_checkpoint()) and cfg.train.max_iter == 300
    full = build_cfg(next(s for s in _specs(tmp_path) if s["name"] == "full/n128/seed3"))
    assert list(full.train.freeze) == []  # the config's default: nothing frozen


def test_the_data_of_a_run_is_what_the_declaration_says(tmp_path):
    from winpos.data.shapes import ensure_shapes_dataset

    small = ensure_shapes_dataset(tmp_path, **dict(S.shapes_params(16, 1), val_images=3))
    large = ensure_shapes_dataset(tmp_path, **dict(S.shapes_params(32, 1), val_images=3))
    other = ensure_shapes_dataset(tmp_path, **dict(S.shapes_params(16, 2), val_images=3))
    ims = {k: json.loads(v[0].read_text())["images"] for k, v in
           {"small": small["shapes_train"], "large": large["shapes_train"], "other": other["shapes_train"]}.items()}
    read = lambda paths, im: (paths["shapes_train"][1] / im["file_name"]).read_bytes()  # noqa: E731
    assert len(ims["small"]) == 16 and len(ims["large"]) == 32
    assert all(read(small, a) == read(large, b) for a, b in zip(ims["small"], ims["large"]))  # a prefix
    assert read(small, ims["small"][0]) != read(other, ims["other"][0])  # another seed, other images
    assert small["shapes_val"] == other["shapes_val"]  # one evaluation set, shared
    cats = json.loads(small["shapes_val"][0].read_text())["categories"]
    assert [c["name"] for c in cats] == ["circle", "square", "triangle", "star"]


@pytest.mark.parametrize("kw, message", [
    (dict(recipes=("trunk", "full")), "must start with full"), (dict(recipes=("full", "bn")), "unknown recipe"),
    (dict(train_images=(16, 16)), "distinct positive"), (dict(train_images=(0,)), "distinct positive"),
    (dict(seeds=(1, 1)), "distinct non-negative"),
])
def test_bad_settings_are_refused(kw, message, tmp_path):
    with pytest.raises(WinposError, match=message):
        _specs(tmp_path, **kw)


def _run(recipe, n, seed, box, mask=30.0):
    spec = {"name": f"{recipe}/n{n}/seed{seed}", "seed": seed, "shapes": {"train_images": n}}
    if S.FREEZE[recipe]:
        spec["freeze"] = list(S.FREEZE[recipe])
    return {"spec": spec, "bbox": {"AP": box}, "segm": {"AP": mask}, "seconds": 90.0, "started_utc": "2026"}


def _made_up(diffs: dict):
    """``diffs[(recipe, n)]``: per-seed differences to full, whose AP per seed is ``base``."""
    base = [20.0, 22.0, 19.0, 21.0]
    runs = [_run("full", n, s, b) for n in (16, 128) for s, b in enumerate(base)]
    for (recipe, n), d in diffs.items():
        runs += [_run(recipe, n, s, b + x) for s, (b, x) in enumerate(zip(base, d))]
    return runs


def test_analysis_against_values_computed_by_hand():
    clear_loss = [-5.0, -4.0, -6.0, -5.0]  # mean -5, sd sqrt(2/3)
    out = S.analyze(_made_up({("trunk", 16): [0.5, -0.5, 1.0, -1.0], ("heads", 16): clear_loss,
                              ("trunk", 128): [3.0, 2.8, 3.2, 3.0], ("heads", 128): [-1.0, 2.0, -3.0, 1.0]}))
    c = out["contrasts"]["heads-full@16"]
    sd = math.sqrt(2 / 3)
    assert c["bbox"]["mean"] == pytest.approx(-5.0) and c["bbox"]["sd"] == pytest.approx(sd)
    half = 3.182446 * sd / 2  # t(0.975, 3) x sd / sqrt(4)
    assert c["bbox"]["ci"] == pytest.approx((-5 - half, -5 + half), abs=1e-5)
    t = -5.0 / (sd / 2)  # -12.247 with 3 degrees of freedom: two-sided p = 0.00118
    assert t == pytest.approx(-12.247, abs=1e-3) and c["bbox"]["p_t"] == pytest.approx(0.00118, abs=2e-5)
    assert c["bbox"]["p_sign_flip"] == pytest.approx(2 / 16)  # every sign negative: 2 of 2^4 patterns
    ps = {k: v["bbox"]["p_t"] for k, v in out["contrasts"].items()}
    ranked = sorted(ps.values())
    assert out["contrasts"]["trunk-full@128"]["p_t_holm"] == pytest.approx(4 * ranked[0])  # the smallest p x 4
    assert c["p_t_holm"] == pytest.approx(max(4 * ranked[0], 3 * ranked[1]))
    verdicts = {k: v["verdict"] for k, v in out["contrasts"].items()}
    assert verdicts == {"trunk-full@16": "undecided", "heads-full@16": "worse", "trunk-full@128": "better",
                        "heads-full@128": "undecided"}
    row = out["ap"]["16"]["heads"]
    assert row["bbox"]["mean"] == pytest.approx(15.5) and row["per_seed"]["0"]["bbox"] == pytest.approx(15.0)


def test_a_run_that_is_no_recipe_and_a_missing_baseline_are_refused():
    odd = _run("trunk", 16, 0, 10.0)
    odd["spec"]["freeze"] = ["roi_heads"]
    with pytest.raises(WinposError, match="no recipe of the study"):
        S.analyze([_run("full", 16, 0, 10.0), odd])
    with pytest.raises(WinposError, match="no full-finetuning baseline"):
        S.analyze([_run("trunk", 16, 0, 10.0), _run("trunk", 16, 1, 11.0)])


def test_text_and_figure(tmp_path):
    summary = S.analyze(_made_up({("trunk", 16): [0.5, -0.5, 1.0, -1.0], ("heads", 16): [-5.0, -4.0, -6.0, -5.0],
                                  ("trunk", 128): [3.0, 2.8, 3.2, 3.0], ("heads", 128): [-1.0, 2.0, -3.0, 1.0]}))
    summary.update(protocol={"iters": 300, "val_images": 300}, seconds={"full": 200.0, "trunk": 150.0, "heads": 90.0})
    text = S.format_small_data(summary)
    assert "heads at n=16: worse than full finetuning" in text and "trunk at n=128: better than full" in text
    assert "heads - full at n=16, box AP: per seed -5.00, -4.00, -6.00, -5.00" in text
    assert "n=  16 heads : 15.00, 18.00, 13.00, 16.00; mean 15.50" in text and "(1.5 min a run)" in text
    S.plot_small_data(summary, str(tmp_path / "s.png"))
    assert (tmp_path / "s.png").stat().st_size > 10_000
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert S.load_summary(tmp_path)["contrasts"]["heads-full@16"]["verdict"] == "worse"


def test_a_folder_of_other_settings_is_refused(tmp_path):
    S._claim(tmp_path / "o", {"iters": 300})
    S._claim(tmp_path / "o", {"iters": 300})  # the same settings: accepted
    with pytest.raises(WinposError, match="other settings .*iters 200 here, 300 there"):
        S._claim(tmp_path / "o", {"iters": 200})


def test_report_only_without_a_study_is_one_line(tmp_path):
    from tests.bad_inputs_helpers import assert_one_line_error, tool

    r = tool("reproduce.py", "--small-data", "--report-only", "--output", tmp_path / "none")
    assert_one_line_error(r, "summary.json does not exist", "winpos-reproduce --small-data")


@pytest.mark.parametrize("recipe", S.RECIPES)
def test_the_shipped_config_is_one_run_of_the_study(recipe):
    """shapes/small_data_hieradet.py with train.freeze set is the study's run (recipe, 16 images, seed 0): model,
    data, optimizer, schedule and training fields alike (the run folder aside)."""
    from omegaconf import OmegaConf

    from winpos.d2.config import load_config

    spec = next(s for s in S.small_data_specs(CONFIG, str(demo_checkpoint()), "/nowhere", seeds=(0,),
                                              train_images=(16,)) if s["name"].startswith(recipe + "/"))
    study = OmegaConf.to_container(build_cfg(spec))
    freeze = {"full": "[]", "trunk": "trunk", "heads": "heads"}[recipe]
    shipped = OmegaConf.to_container(load_config("shapes/small_data_hieradet.py", [f"train.freeze={freeze}"]))
    from winpos.d2.freeze import freeze_prefixes

    assert freeze_prefixes(shipped["train"].pop("freeze")) == freeze_prefixes(study["train"].pop("freeze"))
    study["train"].pop("output_dir"), shipped["train"].pop("output_dir")
    for key in ("model", "dataloader", "optimizer", "lr_multiplier", "train"):
        assert shipped[key] == study[key], key
