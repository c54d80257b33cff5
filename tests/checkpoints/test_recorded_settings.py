"""Settings that carry no tensor (LookHere's directions and slopes, RoPE's base, LayerNorm's eps): weights that
winpos-convert recorded for one build are refused by a target built otherwise, naming each difference, because they
would load by name and shape and compute what they were not trained for. The target built as recorded loads them;
``allow_other_settings=True`` loads them on purpose and the report lists the differences. ``winpos-convert`` run on
its own output keeps the recorded build (the second conversion equals the first tensor for tensor and records the
same settings); another recipe is a change on purpose, listed in the report."""
from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from tests.helpers import randomize
from winpos.backbones import create
from winpos.checkpoints import load_external
from winpos.checkpoints.recorded import RecordedBuild, recorded_build, settings_differences
from winpos.cli.convert_checkpoint import main

SIZE = {"img_size": 64, "window_size": 4}
LOOKHERE_90 = {"kind": "lookhere", "lookhere": {"variant": "90", "global_slope": 1.5, "slope_units": "official"}}
# (recipe, constructor arguments of the recorded build, what the refusal must name about the recipe's default build)
CASES = {
    "lookhere": ("lookhere", {"window_pos": LOOKHERE_90},
                 r"LookHere variant '90' in the recorded build, '45' in this model \(2 modules: blocks\.0\.attn"),
    "rope_base": ("rope", {"window_pos": {"kind": "rope", "rope": {"base": 10000.0}},
                           "global_pos": {"kind": "rope", "rope": {"base": 10000.0}}},
                  r"RoPE base 10000\.0 in the recorded build, 100\.0 in this model \(4 modules"),
    "norm_eps": ("original", {"norm_eps": 1e-5}, r"LayerNorm eps 1e-05 in the recorded build, 1e-06 in this model"),
}


def _recorded_file(tmp_path, case, suffix=".safetensors"):
    recipe, kwargs, _ = CASES[case]
    torch.manual_seed(0)
    model = randomize(create("vitdet_toy", recipe=recipe, **SIZE, **kwargs))
    meta = {"winpos_preset": "vitdet_toy", "winpos_recipe": recipe, "winpos_kwargs": json.dumps({**SIZE, **kwargs})}
    path = tmp_path / f"{case}{suffix}"
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    if suffix == ".safetensors":
        save_file(sd, str(path), metadata=meta)
    else:
        torch.save({"model": sd, **meta}, path)
    return path, model


def test_the_recipe_default_differs_in_each_case():
    """The premise: each case's recorded build differs from its recipe's default only in settings without tensors
    (same state-dict names and shapes), so nothing but the recorded build can tell them apart."""
    for case, (recipe, kwargs, _) in CASES.items():
        recorded = create("vitdet_toy", recipe=recipe, **SIZE, **kwargs)
        default = create("vitdet_toy", recipe=recipe, **SIZE)
        assert {k: v.shape for k, v in recorded.state_dict().items()} == \
            {k: v.shape for k, v in default.state_dict().items()}, case
        build = RecordedBuild("vitdet_toy", recipe, {**SIZE, **kwargs})
        assert settings_differences(default, build) and not settings_differences(recorded, build), case


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_target_built_otherwise_is_refused_naming_the_setting(tmp_path, case, suffix):
    recipe, kwargs, named = CASES[case]
    path, source = _recorded_file(tmp_path, case, suffix)
    with pytest.raises(ValueError, match=named) as err:
        load_external(str(path), "vitdet_toy", recipe=recipe, **SIZE)
    assert "create('vitdet_toy', recipe=" in str(err.value) and "allow_other_settings=True" in str(err.value)
    # built as the file records: loads, equal to the source, and the report has no settings entry
    target = create("vitdet_toy", recipe=recipe, **SIZE, **kwargs)
    sd, report = load_external(str(path), target)
    target.load_state_dict(sd, strict=False)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(target.eval()(x), source.eval()(x), rtol=0, atol=0)
    assert not [k for k, _ in report.unexpected if k == "settings"]
    # on purpose: loads, and the report lists what differs
    sd, report = load_external(str(path), "vitdet_toy", recipe=recipe, allow_other_settings=True, **SIZE)
    said = dict(report.unexpected)["settings"]
    assert "the target differs from the build the file records (allowed)" in said
    assert re.search(named, said), said


def test_a_file_without_a_record_is_not_checked(tmp_path):
    """A bare state dict says nothing about its build: nothing to compare, it loads into any build of its shapes."""
    _, source = _recorded_file(tmp_path, "lookhere")
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(tmp_path / "bare.safetensors"))
    assert recorded_build(tmp_path / "bare.safetensors") is None
    sd, _ = load_external(str(tmp_path / "bare.safetensors"), "vitdet_toy", recipe="lookhere", **SIZE)
    assert sd


def test_a_damaged_record_is_refused_with_the_fix(tmp_path):
    _, source = _recorded_file(tmp_path, "lookhere")
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(tmp_path / "bad.safetensors"),
              metadata={"winpos_preset": "vitdet_toy", "winpos_kwargs": "{window_pos: 90"})
    with pytest.raises(ValueError, match="winpos_kwargs is not the JSON object winpos-convert writes.*convert the"):
        load_external(str(tmp_path / "bad.safetensors"), "vitdet_toy", recipe="lookhere", **SIZE)


def _meta(path) -> dict:
    with safe_open(str(path), "pt") as f:
        return f.metadata()


def test_winpos_convert_on_its_own_output_keeps_the_recorded_build(tmp_path, capsys):
    path, _ = _recorded_file(tmp_path, "lookhere")
    out = tmp_path / "again.safetensors"
    assert main(["--input", str(path), "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "recipe 'lookhere'" in printed and "'variant': '90'" in printed, printed
    meta = _meta(out)
    assert meta["winpos_recipe"] == "lookhere" and json.loads(meta["winpos_kwargs"])["window_pos"] == LOOKHERE_90
    first, second = load_file(str(path)), load_file(str(out))
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    # another recipe is a change on purpose: the file's LookHere settings are not carried into it
    other = tmp_path / "relpos.safetensors"
    assert main(["--input", str(path), "--output", str(other), "--recipe", "original"]) == 0
    assert _meta(other)["winpos_recipe"] == "original"
    assert "lookhere" not in _meta(other).get("winpos_kwargs", "")


def test_winpos_convert_with_set_lists_what_it_changes(tmp_path, capsys):
    path, _ = _recorded_file(tmp_path, "rope_base")
    out = tmp_path / "base10k.safetensors"
    assert main(["--input", str(path), "--output", str(out), "--set", "norm_eps=1e-5"]) == 0
    printed = capsys.readouterr().out
    assert "LayerNorm eps 1e-05 in the recorded build" not in printed  # the rope file's eps is the default
    assert json.loads(_meta(out)["winpos_kwargs"])["window_pos"]["rope"]["base"] == 10000.0
    assert "the target differs from the build the file records (allowed): LayerNorm eps 1e-06 in the recorded " \
           "build, 1e-05 in this model" in printed, printed


def test_a_record_this_winpos_cannot_rebuild_loads_as_before_and_says_so(tmp_path):
    """A record naming an argument this winpos does not take (a file from another version): the settings cannot be
    compared, so the weights load as they did before the check, and the report says the settings were not
    compared and why."""
    _, source = _recorded_file(tmp_path, "lookhere")
    path = tmp_path / "other_version.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(path),
              metadata={"winpos_preset": "vitdet_toy", "winpos_recipe": "lookhere",
                        "winpos_kwargs": json.dumps({**SIZE, "no_such_argument": 1})})
    sd, report = load_external(str(path), "vitdet_toy", recipe="lookhere", **SIZE)
    said = dict(report.unexpected)["settings"]
    assert said.startswith("settings not compared: the build") and "no_such_argument" in said, said
    assert set(sd) == set(source.state_dict())
