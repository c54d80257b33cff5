"""The command-line tools' shared promises: --help and argument errors import neither torch nor detectron2 (they
answer at once), every tool takes --no-progress where it has a bar, refusals come before work, train_net's own
parser keeps detectron2's flags and winpos's, and the resolution sweep's table and plot say their sizes and runs."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ["posemb_viz.py", "convert_checkpoint.py", "eval_coco.py", "predict.py", "train_net.py"]

PROBE = """
import runpy, sys
sys.argv = [{tool!r}] + {args!r}
try:
    runpy.run_path({tool!r}, run_name="__main__")
except SystemExit as e:
    code = e.code
heavy = sorted(m for m in ("torch", "detectron2", "matplotlib") if m in sys.modules)
print("HEAVY", heavy, "CODE", code)
"""


def _probe(tool, args):
    res = subprocess.run([sys.executable, "-c", PROBE.format(tool=str(ROOT / "tools" / tool), args=args)],
                         capture_output=True, text=True)
    return res.stdout.strip().splitlines()[-1], res


@pytest.mark.parametrize("tool", TOOLS)
def test_help_and_argument_errors_import_nothing_heavy(tool):
    line, res = _probe(tool, ["--help"])
    assert line == "HEAVY [] CODE 0", (line, res.stderr[-500:])
    line, res = _probe(tool, ["--no-such-flag"])
    assert line == "HEAVY [] CODE 2", (line, res.stderr[-500:])
    assert "error:" in res.stderr and "Traceback" not in res.stderr


def test_no_progress_everywhere_there_is_a_bar():
    for tool in ("posemb_viz.py", "eval_coco.py", "predict.py"):
        text = subprocess.run([sys.executable, str(ROOT / "tools" / tool)] + (["plot"] if "viz" in tool else [])
                              + ["--help"], capture_output=True, text=True).stdout
        assert "--no-progress" in text, tool


def test_train_net_parser_keeps_every_flag_of_the_engine_parser():
    import importlib.util

    from winpos.d2.engine import build_parser as engine_parser

    spec = importlib.util.spec_from_file_location("train_net", ROOT / "tools" / "train_net.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def flags(parser):
        return {s for a in parser._actions for s in a.option_strings} | {a.dest for a in parser._actions
                                                                           if not a.option_strings}

    assert flags(engine_parser()) <= flags(mod.build_parser())


def test_eval_fps_refused_before_work(tmp_path):
    from tests.d2.test_own_data import make_coco_folder

    ann, images = make_coco_folder(tmp_path / "data", n_images=3)
    out = tmp_path / "ev"
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "eval_coco.py"), "--config-file",
                          str(ROOT / "configs/shapes/mask_rcnn_hieradet_toy_paper.py"), "--checkpoint", "none.pth",
                          "--dataset", f"mine={ann}:{images}", "--test-dataset", "mine", "--sizes", "128,256",
                          "--fps", "--output", str(out), "model.roi_heads.num_classes=2"], capture_output=True,
                         text=True)
    assert res.returncode == 2 and "the test set has 3 images, not more than --warmup 5" in res.stderr, res.stderr
    assert "--warmup 1" in res.stderr and not list(out.glob("size_*"))  # nothing evaluated first


def test_sweep_table_and_plot_name_sizes_and_runs(tmp_path):
    from winpos.d2.evaluate import load_sweeps, plot_sweeps, sweep_table
    from winpos.errors import WinposError

    res = {128: {"bbox": {"AP": 21.9}, "segm": {"AP": 36.9}}, 256: {"bbox": {"AP": 30.5}, "segm": {"AP": float("nan")}}}
    table = sweep_table(res).splitlines()
    assert table[0].split() == ["size", "(px)", "box", "AP", "mask", "AP"]
    assert table[1].split() == ["128", "21.90", "36.90"] and table[2].split() == ["256", "30.50", "-"]
    earlier = tmp_path / "resolution_sweep.json"
    earlier.write_text(json.dumps({"128": {"bbox": {"AP": 20.0}, "segm": {"AP": 30.0}}}))
    runs = {"hieradet_toy paper": res, **load_sweeps([f"original={earlier}"])}
    plot_sweeps(runs, str(tmp_path / "sweep.png"), train_size=256, title="cfg.py\nmodel_final.pth")
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(WinposError, match="not a resolution sweep"):
        (tmp_path / "other.json").write_text("[1, 2]")
        load_sweeps([f"x={tmp_path / 'other.json'}"])


def test_environment_dump_goes_to_the_log_file_only(tmp_path, capsys):
    from detectron2.utils.logger import setup_logger

    from winpos.d2.engine import _log_to_files_only

    log = setup_logger(str(tmp_path), name="winpos_env_test")
    _log_to_files_only(log, "Environment info:\nsys.platform linux")
    log.info("a console line")
    for h in log.handlers:
        h.flush()
    out = capsys.readouterr()
    assert "Environment info" not in out.out + out.err and "a console line" in out.out + out.err
    text = (tmp_path / "log.txt").read_text()
    assert "Environment info:\nsys.platform linux" in text and "a console line" in text


QUIET_PROBE = """
from winpos.utils.cli import quiet_third_party_warnings
{call}
import torch
from detectron2.utils.collect_env import collect_env_info
from winpos.d2.config import load_config
from winpos.d2.engine import build_model
collect_env_info()
model = build_model(load_config({config!r}, ["train.device=cpu"])).eval()
with torch.no_grad():
    model([{{"image": torch.zeros(3, 64, 64), "height": 64, "width": 64}}])
"""
NOISE = ("torch.meshgrid", "is_fx_tracing", "torch.jit.script", "No CUDA runtime is found")


def test_upstream_warnings_filtered_in_one_place():
    config = str(ROOT / "configs/shapes/mask_rcnn_hieradet_toy_paper.py")

    def stderr(call):
        return subprocess.run([sys.executable, "-c", QUIET_PROBE.format(call=call, config=config)],
                              capture_output=True, text=True).stderr

    loud = stderr("")
    assert [n for n in NOISE if n in loud] == list(NOISE), loud[-2000:]  # what a run printed before the filter
    quiet = stderr("quiet_third_party_warnings()")
    assert not [n for n in NOISE if n in quiet], quiet[-2000:]
