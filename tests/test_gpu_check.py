"""tools/gpu_check.py on a machine without a GPU: what can be checked here (argument parsing, the refusal without
CUDA, the JSON a dry run writes, the verdicts, the hard deadlines, a broken kernel recorded while the later steps
run). Running it on a GPU is the device check itself."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from winpos.bench.gpu_check import KERNEL_TOL, STEPS, Log, kernel_verdict, pytest_outcomes, run_check

ROOT = Path(__file__).resolve().parents[1]


def _tool(*args):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_check.py"), *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=900)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA (GPU-only skip)")
def test_refuses_without_a_gpu_and_writes_nothing(tmp_path):
    res = _tool(tmp_path / "out")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith("error: the GPU check needs a CUDA GPU")
    assert "--dry-run" in res.stderr and not (tmp_path / "out").exists()


@pytest.mark.parametrize("args,message", [(["--steps", "install,bogus"], "unknown step(s) ['bogus']"),
                                          (["--budget", "0"], "--budget 0.0 must be a positive"),
                                          (["--budget", "nan"], "--budget")])
def test_bad_arguments_are_one_line(args, message, tmp_path):
    res = _tool(tmp_path / "out", "--dry-run", *args)
    assert res.returncode == 2 and message in res.stderr.strip().splitlines()[-1], res.stderr
    assert not (tmp_path / "out").exists()


def test_dry_run_writes_the_report_and_refuses_to_overwrite_it(tmp_path):
    out = tmp_path / "out"
    res = _tool(out, "--dry-run", "--steps", "install,environment,ceilings,backbones")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["schema_version"] == 2 and report["dry_run"] is True and report["ok"] is True
    assert list(report["steps"]) == ["install", "environment", "ceilings", "backbones"]
    assert all(s["status"] == "ok" and s["seconds"] >= 0 for s in report["steps"].values())
    assert report["steps"]["environment"]["torch"] == torch.__version__
    assert report["steps"]["ceilings"]["matmul_tflops"] > 0 and report["steps"]["ceilings"]["copy_gbps"] > 0
    rows = report["steps"]["backbones"]["rows"]
    assert {r["model"] for r in rows} == {"winpos ViTDet toy paper", "winpos HieraDet toy original"}
    assert all(r["fwd_s"] > 0 and r["fwd_bwd_s"] > 0 for r in rows)
    assert "== backbones" in (out / "gpu_check.log").read_text()
    again = _tool(out, "--dry-run", "--steps", "environment")
    assert again.returncode == 2 and "--force" in again.stderr
    assert json.loads((out / "gpu_check.json").read_text()) == report  # the earlier numbers are kept


def _row(diff, impl="triton"):
    return {"model": "vitdet_b", "block": "global", "variant": "relpos", "impl": impl, "max_abs_diff_vs_sdpa": diff}


def test_the_benchmark_verdict_judges_the_triton_rows():
    ok = {"dtype": "bfloat16", "rows": [_row(None, "sdpa"), _row(0.01)], "skipped": [], "errors": []}
    assert kernel_verdict(ok)["status"] == "ok"
    bad = dict(ok, rows=[_row(None, "sdpa"), _row(KERNEL_TOL["bfloat16"] * 2)])
    verdict = kernel_verdict(bad)
    assert verdict["status"] == "failed" and verdict["mismatches"] == ["vitdet_b/global/relpos/triton: 0.12"]
    assert kernel_verdict(dict(ok, errors=[{"label": "a/b/none/triton", "error": "RuntimeError"}]))["status"] == \
        "failed"
    peer = kernel_verdict(dict(ok, errors=[{"label": "a/b/none/sdpa_cudnn", "error": "RuntimeError"}]))
    assert peer["status"] == "ok" and peer["peer_errors"]  # a peer's failure is listed, not judged
    assert kernel_verdict(dict(ok, rows=[_row(0.01, "flex")]))["status"] == "failed"  # no Triton row ran
    assert kernel_verdict(ok, exit_status=1)["status"] == "failed"
    assert kernel_verdict(dict(ok, skipped=["a/b/none/flex"]))["status"] == "partial"  # left for time: not ok
    assert kernel_verdict(ok, exit_status=124)["status"] == "partial"  # killed at its deadline


def test_steps_are_the_documented_ones():
    assert STEPS == ("install", "environment", "ceilings", "kernel_tests", "kernel_benchmark", "kernel_sweep",
                     "backbones", "kernel_tests_fp32")


def test_pytest_outcomes_are_read_from_verbose_output_cut_anywhere():
    out = ("tests/kernels/test_a.py::test_x[c1-float16] PASSED [ 10%]\n"
           "tests/kernels/test_a.py::test_x[c2-float16] FAILED [ 20%]\nsome log line\n"
           "tests/kernels/test_b.py::test_y ERROR [ 30%]\ntests/kernels/test_b.py::test_z PASS")  # cut by a kill
    assert pytest_outcomes(out) == {"counts": {"passed": 1, "failed": 1, "error": 1},
                                    "failed": ["tests/kernels/test_a.py::test_x[c2-float16]",
                                               "tests/kernels/test_b.py::test_y"]}


def test_kernel_sweep_step_dry_run(tmp_path):
    """The sweep step runs the benchmark's --sweep in a child process (interpreter, tiny shapes) and records what
    it swept; its JSON holds the trials and the per-kernel best."""
    from winpos.bench.gpu_check import step_kernel_sweep

    ctx = {"out": tmp_path, "log": Log(tmp_path / "log"), "dry_run": True, "cuda": False, "deadline": 60.0}
    result = step_kernel_sweep(ctx)
    assert result["status"] in ("ok", "partial") and result["sweeps"] >= 1, result
    sweep = json.loads((tmp_path / result["json"]).read_text())
    first = sweep["sweeps"][0]
    assert first["trials"] and all("fwd_ms" in t or "error" in t for t in first["trials"])
    assert set(sweep["tuned"][first["label"]]) and first["label"].endswith("/none")


def test_a_step_past_its_deadline_is_killed_and_the_rest_is_skipped_not_ok(tmp_path, monkeypatch):
    """Hard deadlines: a child that outlives its step's share is killed (partial, with what it printed), a step
    with too little time left is skipped, and the report is not ok."""
    from winpos.bench import gpu_check

    def slow(ctx):
        code, tail, out = gpu_check._run([sys.executable, "-c", "import time; print('started', flush=True); "
                                          "time.sleep(30)"], ctx["log"], ctx["deadline"])
        return {"status": "partial" if code == 124 else "ok", "exit_status": code, "printed": out.strip()}

    monkeypatch.setitem(gpu_check.STEP_FNS, "kernel_tests", slow)
    monkeypatch.setitem(gpu_check.STEP_SHARE, "kernel_tests", 0.5)
    monkeypatch.setitem(gpu_check.STEP_SHARE, "kernel_tests_fp32", 0.5)
    monkeypatch.setattr(gpu_check, "MIN_STEP_S", 5.0)
    report = run_check(tmp_path, dry_run=True, budget_s=12.0, steps=("kernel_tests", "kernel_tests_fp32"))
    first, second = report["steps"]["kernel_tests"], report["steps"]["kernel_tests_fp32"]
    assert first["exit_status"] == 124 and first["printed"] == "started" and 5 < first["seconds"] < 9
    assert second["status"] == "skipped" and "s left of the 12 s budget" in second["detail"]
    assert report["ok"] is False and report["elapsed_s"] < 10
    assert json.loads((tmp_path / "gpu_check.json").read_text())["steps"]["kernel_tests_fp32"]["status"] == "skipped"


def test_without_pip_winpos_is_imported_from_the_source_tree(tmp_path, monkeypatch):
    """The lent image may lack what ``pip install -e`` needs (the rehearsal venv had no ``wheel``): the install
    step then writes a .pth hook that imports winpos, and kernels/ as winpos.kernels, from the checkout."""
    import importlib.util
    import site
    import types

    from winpos.bench import gpu_check

    src = tmp_path / "src"
    (src / "winpos").mkdir(parents=True)
    (src / "kernels").mkdir()
    (src / "winpos" / "__init__.py").write_text("")
    (src / "kernels" / "__init__.py").write_text("WHERE = 'source tree'\n")
    (src / "kernels" / "dispatch.py").write_text("X = 1\n")
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(gpu_check.subprocess, "run", lambda *a, **k: types.SimpleNamespace(
        returncode=1, stdout="", stderr="error: invalid command 'bdist_wheel'"))
    monkeypatch.setattr(site, "getsitepackages", lambda: [str(site_dir)])
    result = gpu_check.install_if_needed(src)
    assert result["status"] == "ok" and "bdist_wheel" in result["detail"] and "source tree" in result["detail"]
    assert (site_dir / "winpos_source_hook.pth").read_text() == "import winpos_source_hook\n"
    monkeypatch.undo()  # the real subprocess.run again
    code = (f"import sys; sys.path.insert(0, {str(site_dir)!r}); import winpos_source_hook, winpos.kernels.dispatch "
            "as d, winpos.kernels as k; print(k.WHERE, d.X)")
    res = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60)
    assert res.stdout.strip() == "source tree 1", res.stderr


def test_blocked_imports_refuse_what_the_lent_image_lacks(monkeypatch):
    """``WINPOS_BLOCK_IMPORTS`` (the rehearsal of the lent image): a child run through ``blocked_imports`` cannot
    import a blocked package, and pytest plugins of blocked packages are turned off."""
    from importlib.metadata import entry_points

    from winpos.bench.blocked_imports import IMAGE_LACKS, child_command, pytest_plugin_options

    env = dict(os.environ, WINPOS_BLOCK_IMPORTS="image")
    monkeypatch.setenv("WINPOS_BLOCK_IMPORTS", "image")
    cmd = child_command(sys.executable, "timeit", "-n", "1", "import json, detectron2")
    assert cmd[:3] == [sys.executable, "-m", "winpos.bench.blocked_imports"]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "detectron2 is blocked (WINPOS_BLOCK_IMPORTS" in res.stderr, res.stderr
    plugins = {ep.name for ep in entry_points(group="pytest11") if ep.value.split(".")[0] in IMAGE_LACKS}
    options = pytest_plugin_options()
    assert options[0::2] == ["-p"] * len(plugins) and set(options[1::2]) == {f"no:{name}" for name in plugins}
    monkeypatch.delenv("WINPOS_BLOCK_IMPORTS")
    assert child_command(sys.executable, "timeit")[:3] == [sys.executable, "-m", "timeit"]
