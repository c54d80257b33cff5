"""``python -m winpos.bench.kernels``: the dry run works end to end on CPU (tiny shapes, Triton interpreter) and
writes a complete JSON; without a GPU the real benchmark refuses with a message instead of timing the CPU."""
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from winpos.bench import kernels as bench

ROOT = Path(__file__).resolve().parents[1]


def test_dry_run_writes_every_row(tmp_path):
    out = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the bench sets it itself
    proc = subprocess.run([sys.executable, "-m", "winpos.bench.kernels", "--dry-run", "--json", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["interpreter"] is True and report["errors"] == [] and report["skipped"] == []
    rows = {(r["block"], r["variant"], r["impl"]): r for r in report["rows"]}
    for shape in bench.dry_run_shapes():
        for variant in bench.VARIANTS:
            for impl in ("sdpa", "triton", "reference") + (("triton_rope_unfused",) if variant == "rope" else ()):
                row = rows[(shape.block, variant, impl)]
                assert row["fwd_ms"] > 0 and row["fwd_bwd_ms"] > 0 and row["fwd_tflops"] > 0
                if impl != "sdpa":  # every implementation computes the same attention (fp32)
                    assert row["max_abs_diff_vs_sdpa"] < 1e-4, row


def test_refuses_without_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main(["--json", "unused.json"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not Path("unused.json").exists()


def test_gpu_shapes_are_the_1024px_backbones():
    shapes = {(s.model, s.block): s for s in bench.gpu_shapes()}
    assert shapes[("vitdet_b", "window14")].grid == (70, 70) and shapes[("vitdet_b", "global")].heads == 12
    assert shapes[("vitdet_l", "global")].heads == 16
    assert shapes[("hieradet_b+", "s1_window8")].grid == (256, 256)
    assert all(s.head_dim == 56 for s in shapes.values() if s.model == "hieradet_b+")
