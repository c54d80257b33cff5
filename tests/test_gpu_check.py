"""tools/gpu_check.py on a machine without a GPU: what can be checked here (argument parsing, the refusal without
CUDA, the JSON a dry run writes, the verdict on kernel mismatches). Running it on a GPU is the device check itself."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from winpos.bench.gpu_check import KERNEL_TOL, STEPS, kernel_verdict

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
    assert report["schema_version"] == 1 and report["dry_run"] is True and report["ok"] is True
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


def test_a_kernel_mismatch_fails_the_check():
    ok = {"dtype": "bfloat16", "rows": [_row(None, "sdpa"), _row(0.01)], "skipped": [], "errors": []}
    assert kernel_verdict(ok)["status"] == "ok"
    bad = dict(ok, rows=[_row(None, "sdpa"), _row(KERNEL_TOL["bfloat16"] * 2)])
    verdict = kernel_verdict(bad)
    assert verdict["status"] == "failed" and verdict["mismatches"] == ["vitdet_b/global/relpos/triton: 0.12"]
    assert kernel_verdict(dict(ok, errors=[{"label": "x", "error": "RuntimeError"}]))["status"] == "failed"
    assert kernel_verdict(ok, exit_status=1)["status"] == "failed"
    assert kernel_verdict(dict(ok, rows=[]))["status"] == "failed"  # a benchmark that timed nothing


def test_steps_are_the_documented_ones():
    assert STEPS == ("install", "environment", "ceilings", "kernel_tests", "kernel_benchmark", "kernel_sweep",
                     "backbones")


def test_kernel_sweep_step_dry_run(tmp_path):
    """The sweep step runs the benchmark's --sweep in a child process (interpreter, tiny shapes, a 12 s budget) and
    records what it swept; its JSON holds the trials and the per-kernel best."""
    from winpos.bench.gpu_check import Log, step_kernel_sweep

    ctx = {"out": tmp_path, "log": Log(tmp_path / "log"), "dry_run": True, "cuda": False, "left": lambda: 40.0}
    result = step_kernel_sweep(ctx)
    assert result["status"] == "ok" and result["sweeps"] >= 1, result
    sweep = json.loads((tmp_path / result["json"]).read_text())
    first = sweep["sweeps"][0]
    assert first["trials"] and all("fwd_ms" in t or "error" in t for t in first["trials"])
    assert set(sweep["tuned"][first["label"]]) and first["label"].endswith("/none")
