"""The commands an installed user has (``winpos.cli``, console scripts in setup.py) and their checkout wrappers
(``tools/<name>.py``): the same names in setup.py and ``winpos.cli.COMMANDS``, executable wrappers that only call the
package's ``main``, ``python -m`` of a library module refusing instead of exiting 0, and configs by name."""
import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from winpos.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
WRAPPED = set(COMMANDS.values())


def _setup_commands():
    tree = ast.parse((ROOT / "setup.py").read_text())
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") ==
                "COMMANDS")
    return ast.literal_eval(node.value)


def test_setup_installs_every_command_of_winpos_cli():
    assert _setup_commands() == COMMANDS
    for module in WRAPPED:
        assert (ROOT / "winpos" / "cli" / f"{module}.py").is_file(), module


@pytest.mark.parametrize("module", sorted(WRAPPED))
def test_tools_wrapper_is_an_executable_that_calls_the_package(module):
    path = ROOT / "tools" / f"{module}.py"
    text = path.read_text()
    assert os.access(path, os.X_OK), f"{path} is not executable (chmod +x)"  # before: mode 644, Permission denied
    assert text.startswith("#!/usr/bin/env python\n")
    assert f"from winpos.cli.{module} import" in text and len(text.splitlines()) < 12


@pytest.mark.parametrize("module", sorted(WRAPPED))
def test_python_dash_m_runs_the_command(module):
    res = subprocess.run([sys.executable, "-m", f"winpos.cli.{module}", "--help"], capture_output=True, text=True,
                         cwd=ROOT / "docs")
    assert res.returncode == 0 and "usage:" in res.stdout, res.stderr[-500:]
    _check_help_examples(module, res.stdout)


def _check_help_examples(module, text):
    """The examples of a command's --help are as an installed user types them: configs by name (no checkout
    ``configs/`` path; each --config-file a config name of winpos.model_zoo, or the CFG placeholder) and a
    continued line printed with its backslash (before: ``\\``-newline in the docstring joined the two lines
    with a wide gap)."""
    from winpos.model_zoo import list_configs

    assert "configs/" not in text, f"winpos.cli.{module} --help names a checkout configs/ path"
    names = set(list_configs()) | {"CFG", "FILE"}
    for line in text.splitlines():
        if not line.lstrip().startswith("winpos-"):
            continue
        code = line.split(" #")[0]
        assert not re.search(r"\S {5,}\S", code.strip()), f"winpos.cli.{module} --help: a gap in {line!r}"
        for name in re.findall(r"--config-file (\S+)", code):
            assert name in names, f"winpos.cli.{module} --help: {name!r} is not a config name"


@pytest.mark.parametrize("module, command", [("winpos.d2.engine", "winpos-train"), ("winpos.d2.predict",
                                             "winpos-predict"), ("winpos.diagnostics.doctor", "winpos-posemb"),
                                             ("winpos.experiments.demo", "winpos-demo"),
                                             ("winpos.experiments.footing", "winpos-reproduce")])
def test_a_library_module_run_with_dash_m_names_the_command(module, command):
    res = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True)
    assert res.returncode == 2, res  # before: exit 0, nothing printed
    assert res.stderr.strip().splitlines()[-1].startswith("error:") and command in res.stderr


def test_python_dash_m_winpos_lists_the_commands():
    res = subprocess.run([sys.executable, "-m", "winpos"], capture_output=True, text=True)
    assert res.returncode == 0 and all(c in res.stdout for c in COMMANDS)
    docs = res.stdout.strip().splitlines()[-1]
    assert docs.startswith("Documentation (the docs/<page>.md each --help names): ") and docs.endswith("docs"), docs


def test_doctor_fixes_name_installed_commands():
    from winpos.diagnostics.doctor import fix_text
    from winpos.diagnostics.report import convert_command

    texts = [fix_text("vitdet_b", "COCO/mask_rcnn_vitdet_b_100ep.py", "model.backbone.net.recipe"),
             fix_text("vitdet_b"), convert_command()]
    for text in texts:
        assert "tools/" not in text and "python " not in text, text
    assert "winpos-train --config-file COCO/mask_rcnn_vitdet_b_100ep.py" in texts[0]
    assert "winpos-posemb doctor vitdet_b" in texts[1] and texts[2].startswith("winpos-convert --input")


# ------------------------------------------------------------------------------------------------ configs by name


def test_config_names_resolve_in_the_checkout_and_with_configs_prefix(tmp_path):
    from winpos.model_zoo import config_path, list_configs

    names = list_configs()
    assert "COCO/mask_rcnn_vitdet_b_100ep.py" in names and "common/models/mask_rcnn_vitdet.py" in names
    assert len(list_configs("shapes/")) >= 13
    want = ROOT / "configs" / "COCO" / "mask_rcnn_vitdet_b_100ep.py"
    assert Path(config_path("COCO/mask_rcnn_vitdet_b_100ep.py")).resolve() == want
    assert Path(config_path("configs/COCO/mask_rcnn_vitdet_b_100ep.py")).resolve() == want
    own = tmp_path / "COCO" / "mask_rcnn_vitdet_b_100ep.py"  # a user's file of the same name wins
    own.parent.mkdir()
    own.write_text("x = 1\n")
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        assert config_path("COCO/mask_rcnn_vitdet_b_100ep.py") == "COCO/mask_rcnn_vitdet_b_100ep.py"
    finally:
        os.chdir(cwd)


def test_an_unknown_config_name_is_one_line_with_the_closest_names():
    from winpos.errors import WinposError
    from winpos.model_zoo import config_path

    with pytest.raises(WinposError, match=r"did you mean COCO/mask_rcnn_vitdet_b_100ep.py") as e:
        config_path("COCO/mask_rcnn_vitdet_b_100ep")  # no .py
    assert "\n" not in str(e.value)


def test_get_config_by_name_and_composed_in_a_users_config(tmp_path):
    from winpos.d2.config import load_config
    from winpos.model_zoo import get_config

    cfg = get_config("shapes/mask_rcnn_hieradet_toy_abswin.py", ["train.max_iter=3"])
    assert cfg.train.max_iter == 3 and cfg.model.backbone.bottom_up.recipe == "original"
    user = tmp_path / "my_config.py"  # a user's own LazyConfig built from winpos's pieces
    user.write_text("from winpos.model_zoo import get_config\n"
                    "base = get_config('shapes/mask_rcnn_hieradet_toy_abswin.py')\n"
                    "model, dataloader, optimizer, lr_multiplier, train = (base.model, base.dataloader, "
                    "base.optimizer, base.lr_multiplier, base.train)\n"
                    "model.backbone.bottom_up.recipe = 'paper'\n"
                    "optim_common = get_config('common/optim.py')\n")
    mine = load_config(user)
    assert mine.model.backbone.bottom_up.recipe == "paper" and "AdamW" in mine.optim_common
    coco = load_config("COCO/mask_rcnn_vitdet_b_100ep.py")  # relative imports inside the configs still resolve
    assert coco.model.backbone.net.net == "vitdet_b" and coco.train.max_iter == 184375


def test_doctor_takes_a_config_name():
    from winpos.d2.doctor import diagnose

    report = diagnose("COCO/mask_rcnn_vitdet_b_100ep.py", 1024)  # before: "config ... does not exist"
    assert not report.ok and "winpos-train --config-file COCO/mask_rcnn_vitdet_b_100ep.py" in report.text()


def test_demo_checkpoint_is_found_in_the_checkout():
    from winpos.model_zoo import DEMO_CHECKPOINT, demo_checkpoint

    path = demo_checkpoint()
    assert path.name == DEMO_CHECKPOINT and path.with_suffix(".json").is_file()
