"""winpos as an installed library: the wheel is built from this checkout, installed into a fresh virtual
environment, and used from a folder outside the checkout as a new user would, with the installed commands only.

The fresh environment gets winpos from the wheel and nothing else; its dependencies (torch, detectron2, OpenCV, ...)
are the ones this test's interpreter already has, made visible by a ``.pth`` file listing their folders (no network:
pip installs the wheel with ``--no-deps``). Those folders' own ``.pth`` files are not run, so the checkout's
editable install cannot shadow the wheel: the first test checks that winpos is imported from the new environment.
Steps: the wheel's files and PEP 621 metadata (one version: ``winpos.__version__``), config by name (and composed in a
user's own LazyConfig), every installed command's ``--help``, 5 training iterations on the embedded shapes data, and
one real run each of the doctor (on a config and on the run's config.yaml), the converter (the run's window sizes and
image size carried) and predict on an image and on a video; then every command where detectron2 cannot be imported
(one ``error:`` line, exit 2). About 2 minutes of CPU.
"""
import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from winpos.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "shapes/mask_rcnn_hieradet_toy_abswin.py"


def _run(cmd, cwd, timeout=600, **kw):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(OMP_NUM_THREADS="1", TQDM_DISABLE="1", PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, env=env, timeout=timeout,
                          **kw)


def _ok(res):
    assert res.returncode == 0, f"{res.args}\n{res.stdout[-1500:]}\n{res.stderr[-3000:]}"
    return res


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """``(bin folder, python, a work folder outside the checkout, the wheel)``."""
    base = tmp_path_factory.mktemp("wheel")
    _ok(_run([sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "-q", "--no-deps",
              "--no-build-isolation", ROOT, "-w", base / "dist"], cwd=base))
    wheel = next((base / "dist").glob("winpos-*.whl"))
    _ok(_run([sys.executable, "-m", "venv", "--without-pip", base / "venv"], cwd=base))
    python = base / "venv" / "bin" / "python"
    _ok(_run([sys.executable, "-m", "pip", "--python", python, "install", "--disable-pip-version-check", "-q",
              "--no-deps", "--no-index", wheel], cwd=base))
    site = Path(_ok(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=base))
                .stdout.strip())
    deps = [sysconfig.get_paths()["purelib"]]  # this interpreter's packages, the wheel's own first
    for pth in Path(deps[0]).glob("winpos-detectron2.pth"):  # tools/setup_env.sh's pure-Python detectron2
        deps += [line.strip() for line in pth.read_text().splitlines() if line.strip()]
    (site / "zz_winpos_test_deps.pth").write_text("\n".join(deps) + "\n")
    work = base / "user"
    work.mkdir()
    return base / "venv" / "bin", python, work, wheel


def test_the_wheel_holds_configs_checkpoint_license_readme_and_commands(installed):
    _, _, _, wheel = installed
    names = zipfile.ZipFile(wheel).namelist()
    assert "winpos/configs/COCO/mask_rcnn_vitdet_b_100ep.py" in names and "winpos/configs/common/train.py" in names
    assert "winpos/demo_checkpoint/stage1_hieradet_abs_learned_64px.pth" in names
    assert any(n.endswith("dist-info/licenses/LICENSE") or n.endswith("dist-info/LICENSE") for n in names)
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("dist-info/METADATA"))).decode()
    assert "Description-Content-Type: text/markdown" in meta and "# winpos" in meta
    assert "Requires-Dist: torchvision; extra == \"d2\"" in meta and "Requires-Dist: shapely; extra == \"d2\"" in meta
    assert "Requires-Dist: opencv-python-headless" in meta
    assert "winpos/py.typed" in names  # PEP 561: the annotations are for type checkers too


def test_the_wheel_metadata_is_complete_and_has_one_version(installed):
    """pyproject.toml's PEP 621 metadata reaches the wheel, and the version is ``winpos.__version__`` everywhere
    (CITATION.cff and CHANGELOG.md name it too)."""
    import winpos

    _, _, _, wheel = installed
    names = zipfile.ZipFile(wheel).namelist()
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("dist-info/METADATA"))).decode()
    fields = {}
    for line in meta.split("\n\n", 1)[0].splitlines():  # the header, before the long description
        key, _, value = line.partition(": ")
        fields.setdefault(key, []).append(value)
    version = winpos.__version__
    assert fields["Name"] == ["winpos"] and fields["Version"] == [version], fields.get("Version")
    assert wheel.name.startswith(f"winpos-{version}-")
    assert fields["Summary"][0].startswith("Position encodings that work with window attention")
    assert fields["Requires-Python"] == [">=3.10"] and fields["License-Expression"] == ["Apache-2.0"]
    assert fields["Author"] and fields["Keywords"] and "window attention" in fields["Keywords"][0]
    for classifier in ("Programming Language :: Python :: 3.10", "Programming Language :: Python :: 3.11",
                       "Programming Language :: Python :: 3.12", "Typing :: Typed",
                       "Topic :: Scientific/Engineering :: Image Recognition"):
        assert classifier in fields["Classifier"], classifier
    urls = dict(u.split(", ", 1) for u in fields["Project-URL"])
    assert {"https://arxiv.org/abs/2311.05613", "https://arxiv.org/abs/2403.13298",
            "https://arxiv.org/abs/2405.13985"} <= set(urls.values()), urls
    assert all(len(label) <= 32 for label in urls), urls  # the core metadata's limit on a URL's label
    assert {"d2", "bench", "test"} <= set(fields["Provides-Extra"])
    assert f"\nversion: {version}\n" in (ROOT / "CITATION.cff").read_text()
    assert f"## {version}" in (ROOT / "CHANGELOG.md").read_text()
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    for command, module in COMMANDS.items():
        assert f"{command} = winpos.cli.{module}:main" in entry


def test_configs_by_name_outside_the_checkout(installed):
    _, python, work, _ = installed
    (work / "my_config.py").write_text(
        "from winpos.model_zoo import get_config\n"
        f"base = get_config({CONFIG!r})\n"
        "model, dataloader, optimizer, lr_multiplier, train = (base.model, base.dataloader, base.optimizer, "
        "base.lr_multiplier, base.train)\n"
        "model.backbone.bottom_up.recipe = 'paper'\n")
    res = _ok(_run([python, "-c", (
        "import winpos, winpos.model_zoo as z\n"
        "from winpos.d2.config import load_config\n"
        "cfg = z.get_config('COCO/mask_rcnn_vitdet_b_100ep.py')\n"
        "mine = load_config('my_config.py')\n"
        "import importlib.metadata, importlib.resources\n"
        "typed = importlib.resources.files('winpos').joinpath('py.typed')\n"
        "print(winpos.__file__, z.config_root(), z.demo_checkpoint(), cfg.model.backbone.net.net, cfg.train.max_iter,"
        " mine.model.backbone.bottom_up.recipe, len(z.list_configs()), winpos.__version__,"
        " importlib.metadata.version('winpos'), typed, typed.is_file(), ','.join(winpos.__all__))")], cwd=work))
    where, root, ckpt, net, iters, recipe, count, version, dist_version, typed, is_file, public = res.stdout.split()
    venv = str(python.parents[1])
    assert where.startswith(venv) and root.startswith(venv) and ckpt.startswith(venv), res.stdout  # not the checkout
    assert version == dist_version and typed.startswith(venv) and is_file == "True", res.stdout
    assert {"__version__", "backbones", "checkpoints", "model_zoo", "errors"} <= set(public.split(",")), public
    assert "d2" not in public.split(",")  # ``from winpos import *`` must not need detectron2
    assert (net, iters, recipe) == ("vitdet_b", "184375", "paper") and int(count) >= 40


def test_the_docs_the_help_texts_name_are_installed(installed):
    """Every ``docs/<page>.md`` a command's --help or a module names ships in the wheel (as ``winpos/docs``), with
    the figures the pages show, and ``python -m winpos`` says where."""
    import re

    _, python, work, wheel = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    named = set()
    for path in (ROOT / "winpos").rglob("*.py"):
        named |= set(re.findall(r"docs/([a-z0-9_]+\.md)", path.read_text()))
    assert {"equal_footing.md", "precision.md", "export.md"} <= named
    missing = sorted(n for n in named if f"winpos/docs/{n}" not in names)
    assert not missing, missing
    assert "winpos/docs/figures/demo.png" in names and not any(n.startswith("winpos/docs/results/") for n in names)
    res = _ok(_run([python, "-m", "winpos"], cwd=work))
    where = res.stdout.strip().splitlines()[-1].split(": ", 1)[1]
    assert where.startswith(str(python.parents[1])) and (Path(where) / "equal_footing.md").is_file(), res.stdout


def test_every_installed_command_answers_help(installed):
    bin_dir, _, work, _ = installed
    commands = [c for c, m in COMMANDS.items() if m != "reproduce" or (ROOT / "winpos/cli/reproduce.py").is_file()]
    for command in commands + ["winpos-bench-decode"]:
        res = _ok(_run([bin_dir / command, "--help"], cwd=work))
        assert res.stdout.startswith(f"usage: {command}"), (command, res.stdout[:200])


def test_train_doctor_convert_predict_from_the_installed_commands(installed):
    import cv2
    import numpy as np

    bin_dir, _, work, _ = installed
    out = work / "run"
    _ok(_run([bin_dir / "winpos-train", "--config-file", CONFIG, "train.max_iter=5", f"train.output_dir={out}",
              "train.eval_after_train=False", "train.checkpointer.period=5"], cwd=work))
    weights = out / "model_final.pth"
    assert weights.is_file() and len((out / "metrics.json").read_text().splitlines()) >= 1

    doctor = _run([bin_dir / "winpos-posemb", "doctor", "COCO/mask_rcnn_vitdet_b_100ep.py"], cwd=work)
    assert doctor.returncode == 1 and "[BUG]" in doctor.stdout, doctor.stdout[-1500:] + doctor.stderr[-1500:]
    assert "winpos-train --config-file COCO/mask_rcnn_vitdet_b_100ep.py" in doctor.stdout
    assert "winpos-convert --input CKPT" in doctor.stdout and "tools/" not in doctor.stdout

    # the doctor reads the run's own config.yaml (as data), as eval and predict do
    run_doctor = _run([bin_dir / "winpos-posemb", "doctor", out / "config.yaml"], cwd=work)
    assert run_doctor.returncode in (0, 1) and "hieradet_toy" in run_doctor.stdout, run_doctor.stderr[-1500:]
    assert "error:" not in run_doctor.stderr

    conv = _ok(_run([bin_dir / "winpos-convert", "--input", weights, "--output", work / "trunk.safetensors", "--to",
                     "hieradet_toy"], cwd=work))
    assert (work / "trunk.safetensors").is_file() and "wrote" in conv.stdout
    # the run's geometry (shapes configs: windows (8, 4, 8, 4) at 256 px; the preset's own are (8, 4, 14, 7)) is in
    # the line that builds the model and in the file
    load_line = next(line for line in conv.stdout.splitlines() if line.startswith("load it with: "))
    assert "window_spec=(8, 4, 8, 4)" in load_line and "img_size=256" in load_line, load_line
    from safetensors import safe_open

    with safe_open(str(work / "trunk.safetensors"), "pt") as f:
        meta = f.metadata()
    assert meta["winpos_image_size"] == "256" and json.loads(meta["winpos_kwargs"])["window_spec"] == [8, 4, 8, 4]

    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 255, (64, 64, 3), dtype=np.uint8) for _ in range(3)]
    cv2.imwrite(str(work / "img.png"), frames[0])
    writer = cv2.VideoWriter(str(work / "clip.mp4"), cv2.VideoWriter_fourcc(*"mp4v"), 5.0, (64, 64))
    for frame in frames:
        writer.write(frame)
    writer.release()
    common = ["--config-file", f"{out}/config.yaml", "--checkpoint", weights, "--score-thresh", "0"]
    _ok(_run([bin_dir / "winpos-predict", *common, "--input", "img.png", "--output", "preds"], cwd=work))
    assert (work / "preds" / "img.png").is_file()
    assert len(json.loads((work / "preds" / "predictions.json").read_text())) == 1
    video = _ok(_run([bin_dir / "winpos-predict", *common, "--video-input", "clip.mp4", "--output", "vpreds"],
                     cwd=work))
    assert "3 frames" in video.stdout and (work / "vpreds" / "clip.mp4").is_file()


def test_every_command_without_detectron2(installed, tmp_path):
    """Where detectron2 cannot be imported (a stub package first on PYTHONPATH raises ModuleNotFoundError, as a
    missing one does), each installed command that needs it prints one ``error:`` line naming the install command
    and exits 2, which no verdict uses (the doctor: 0 OK, 1 BUG), before making any folder; the preset doctor and
    the converter need no detectron2 and work."""
    import torch

    from winpos.backbones import create

    bin_dir, _, work, _ = installed
    stub = tmp_path / "stub" / "detectron2"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'detectron2'\", "
                                      "name='detectron2')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(OMP_NUM_THREADS="1", TQDM_DISABLE="1", PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=str(stub.parent))
    (work / "nod2").mkdir()
    import cv2
    import numpy as np

    cv2.imwrite(str(work / "nod2" / "img.png"), np.zeros((64, 64, 3), dtype=np.uint8))
    torch.save({"model": create("hieradet_toy").state_dict()}, work / "nod2" / "trunk.pth")
    config = "shapes/mask_rcnn_hieradet_toy_abswin.py"
    needs = {
        "winpos-train": ["--config-file", config],
        "winpos-eval": ["--config-file", config, "--checkpoint", "trunk.pth"],
        "winpos-predict": ["--config-file", config, "--random-weights", "--input", "img.png", "--output", "preds"],
        "winpos-posemb": ["doctor", "COCO/mask_rcnn_vitdet_b_100ep.py"],
        "winpos-demo": ["--output", "demo"],
        "winpos-reproduce": ["--output", "reproduce"],
    }
    assert set(needs) < set(COMMANDS)
    for command, args in needs.items():
        res = subprocess.run([str(bin_dir / command), *args], cwd=work / "nod2", env=env, capture_output=True,
                             text=True, timeout=300)
        errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
        assert res.returncode == 2 and len(errors) == 1 and "Traceback" not in res.stderr, (command, res.stderr)
        assert errors[0].startswith(f"error: {command} needs detectron2") and errors[0].endswith(
            "install it: python -m winpos.install_d2 (detectron2's pure-Python part and the [d2] extra; no compiler "
            "needed)"), errors
        print(f"{command} {' '.join(args)}: exit {res.returncode}: {errors[0][:90]}...")
    assert sorted(p.name for p in (work / "nod2").iterdir()) == ["img.png", "trunk.pth"]  # no folder made
    def works(command, *args):
        res = subprocess.run([str(bin_dir / command), *args], cwd=work / "nod2", env=env, capture_output=True,
                             text=True, timeout=300)
        assert "error:" not in res.stderr and "Traceback" not in res.stderr, (command, res.stderr[-1500:])
        return res

    doctor = works("winpos-posemb", "doctor", "vitdet_b")  # a preset: its verdict, [BUG] at 1024 px (exit 1)
    assert doctor.returncode == 1 and "[BUG]" in doctor.stdout, doctor.stdout[-800:]
    conv = works("winpos-convert", "--input", "trunk.pth", "--output", "out.safetensors", "--to", "hieradet_toy")
    assert conv.returncode == 0 and (work / "nod2" / "out.safetensors").is_file(), conv.stdout[-800:]
    for command in set(COMMANDS) - set(needs) - {"winpos-convert"}:  # the others answer at least --help
        assert works(command, "--help").returncode == 0, command
