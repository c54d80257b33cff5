"""The prepared GPU check (``tools/gpu_check.py OUT_DIR``): everything a borrowed CUDA machine should measure, in
one run of under 8 minutes, on a machine that has only torch, triton and timm and no network.

Steps, each timed and recorded (``OUT_DIR/gpu_check.json``; everything printed also goes to ``OUT_DIR/gpu_check.log``):

1. ``install``: ``pip install --no-deps --no-build-isolation -e .`` when ``winpos.kernels`` is not importable
   (``kernels/`` is installed as ``winpos.kernels``), then the tool starts itself again; no dependency is fetched.
2. ``environment``: GPU name and compute capability, torch / triton / timm versions.
3. ``ceilings``: what the GPU can do at all, measured first: bf16 matmul TFLOP/s (4096^3) and device-to-device
   copy GB/s (1 GiB), so every later number can be read as a fraction of them.
4. ``kernel_tests``: ``pytest tests/kernels`` on CUDA (compiled Triton, not the interpreter); a failure fails the
   check.
5. ``kernel_benchmark``: ``python -m winpos.bench.kernels`` (Triton vs SDPA-flash / efficient with a bias, the
   partition-x-once SDPA, cuDNN attention, FlexAttention; none / rope / relpos / lookhere; window and global;
   ViTDet-B/L and HieraDet-B+ shapes at 1024^2; bf16; L2 flushed before every timed call, eager and CUDA-graph
   replay), its JSON kept; any row whose output differs from SDPA's by more than ``KERNEL_TOL`` fails the check.
5b. ``kernel_sweep``: tile shape x warps x stages of the fused kernels on the HieraDet-B+ shapes (about 90 s),
   the candidate tuned table (``winpos.kernels.launch_config.set_tuned``) in ``kernel_sweep.json``.
6. ``backbones``: bf16 forward and forward+backward seconds per image of winpos ViTDet-B (recipe paper) and
   HieraDet-B+ (recipe original) and of timm's ``sam2_hiera_base_plus`` (the peer installed there), eager and
   ``torch.compile``-d, batch 1 at 1024^2.

``--dry-run`` runs the same steps on the CPU with tiny shapes (kernel tests and benchmark under the Triton
interpreter, toy backbones at 64 px, no compile): it checks the script end to end; its timings mean nothing.
The exit status is 0 when every step passed, 1 when one failed (the JSON says which and why).
"""
from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

KERNEL_TOL = {"bfloat16": 6e-2, "float16": 1e-2, "float32": 1e-4}  # max |out - sdpa| of a kernel benchmark row
STEPS = ("install", "environment", "ceilings", "kernel_tests", "kernel_benchmark", "kernel_sweep", "backbones")
SCHEMA_VERSION = 1


class Log:
    """Print to stdout and append to ``OUT_DIR/gpu_check.log``."""

    def __init__(self, path: Path):
        self.path = path

    def __call__(self, msg: str) -> None:
        print(msg, flush=True)
        with open(self.path, "a") as f:
            f.write(msg + "\n")


def _run(cmd: list[str], log: Log, timeout: float, env: dict | None = None) -> tuple[int, str]:
    """Run ``cmd`` from the repository root, its output streamed to the log; returns (exit status, last lines)."""
    log(f"$ {' '.join(cmd)}")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(timeout, 1), env=env)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or "") if isinstance(e.stdout, str) else (e.stdout or b"").decode(errors="replace")
        log(out[-4000:])
        return 124, f"timed out after {timeout:.0f} s"
    out = proc.stdout + proc.stderr
    log(out[-6000:])
    return proc.returncode, "\n".join(out.strip().splitlines()[-5:])


def install_if_needed(root) -> dict | None:
    """``pip install --no-deps --no-build-isolation -e root`` when ``winpos.kernels`` is not importable; returns
    what happened (None: nothing to do). The running process does not see the new install: re-start it."""
    if importlib.util.find_spec("winpos.kernels") is not None:
        return None
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-e",
                           str(root)], capture_output=True, text=True, timeout=300)
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
    return {"status": "ok" if proc.returncode == 0 else "failed", "detail": tail}


def step_install(ctx) -> dict:
    done = os.environ.get("WINPOS_GPU_CHECK_INSTALL")
    if done:
        return json.loads(done)
    return {"status": "ok", "detail": "winpos.kernels already importable: nothing installed"}


def step_environment(ctx) -> dict:
    import torch
    import triton

    info = {"torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version()}
    try:
        import timm

        info["timm"] = timm.__version__
    except ImportError:
        info["timm"] = None
    if ctx["cuda"]:
        info.update(gpu=torch.cuda.get_device_name(), capability=list(torch.cuda.get_device_capability()))
    else:
        info.update(gpu=None, cpu=platform.processor() or platform.machine())
    return {"status": "ok", **info}


def _cuda_time(fn, reps: int) -> float:
    """Median seconds of ``fn()`` (``winpos.bench.cuda_timing.bench``: CUDA events, L2 flushed before each call,
    after one warm-up call; wall clock on the CPU)."""
    from winpos.bench.cuda_timing import bench

    fn()
    return bench(fn, reps=reps, warmup=0)["median_ms"] / 1e3


def step_ceilings(ctx) -> dict:
    import torch

    dev, n, nbytes = ("cuda", 4096, 2**30) if ctx["cuda"] else ("cpu", 256, 2**22)
    dtype = torch.bfloat16 if ctx["cuda"] else torch.float32
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    mm = _cuda_time(lambda: a @ b, 10 if ctx["cuda"] else 2)
    src = torch.empty(nbytes // 2, device=dev, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    cp = _cuda_time(lambda: dst.copy_(src), 10 if ctx["cuda"] else 2)
    return {"status": "ok", "matmul_tflops": 2 * n**3 / mm / 1e12, "matmul_n": n, "matmul_dtype": str(dtype),
            "copy_gbps": 2 * nbytes / cp / 1e9, "copy_bytes": nbytes}


def step_kernel_tests(ctx) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "tests/kernels"]
    if ctx["dry_run"]:  # the interpreter is slow: one quick file checks that the step runs
        cmd += ["-k", "test_kernel_api"]
    code, tail = _run(cmd, ctx["log"], ctx["left"]() * 0.45)
    return {"status": "ok" if code == 0 else "failed", "exit_status": code, "detail": tail}


def step_kernel_benchmark(ctx) -> dict:
    out = ctx["out"] / "kernels.json"
    budget = max(ctx["left"]() * 0.5, 10)
    cmd = [sys.executable, "-m", "winpos.bench.kernels", "--json", str(out), "--budget", f"{budget:.0f}"]
    if ctx["dry_run"]:
        cmd.append("--dry-run")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the benchmark sets it itself
    code, tail = _run(cmd, ctx["log"], budget + 60, env=env)
    if not out.is_file():
        return {"status": "failed", "exit_status": code, "detail": tail}
    return dict(kernel_verdict(json.loads(out.read_text()), code), json=out.name)


def step_kernel_sweep(ctx) -> dict:
    """The block-config sweep of the fused kernels (``winpos.bench.kernels --sweep``) on the HieraDet-B+ shapes,
    whose small windows and head_dim 56 the untuned heuristic fits worst; informational (its ``tuned`` table is the
    candidate for the kernels' defaults): it fails only when nothing could be swept."""
    out = ctx["out"] / "kernel_sweep.json"
    budget = max(min(90.0, ctx["left"]() * 0.3), 10)
    cmd = [sys.executable, "-m", "winpos.bench.kernels", "--sweep", "--json", str(out), "--budget", f"{budget:.0f}",
           "--reps", "5"]
    cmd += ["--dry-run", "--variants", "none"] if ctx["dry_run"] else ["--models", "hieradet_b+",
                                                                         "--variants", "none,rope"]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code, tail = _run(cmd, ctx["log"], budget + 60, env=env)
    if not out.is_file():
        return {"status": "failed", "exit_status": code, "detail": tail}
    report = json.loads(out.read_text())
    ok = code == 0 and bool(report["sweeps"])
    return {"status": "ok" if ok else "failed", "exit_status": code, "sweeps": len(report["sweeps"]),
            "skipped": len(report["skipped"]), "json": out.name}


def kernel_verdict(report: dict, exit_status: int = 0) -> dict:
    """The kernel benchmark's ``report`` judged: failed if it exited non-zero, if any row errored, or if any
    implementation's output differs from SDPA's by more than ``KERNEL_TOL`` of its dtype (listed as mismatches)."""
    tol = KERNEL_TOL[report["dtype"]]
    bad = [f"{r['model']}/{r['block']}/{r['variant']}/{r['impl']}: {r['max_abs_diff_vs_sdpa']:.3g}"
           for r in report["rows"] if r.get("max_abs_diff_vs_sdpa") is not None and r["max_abs_diff_vs_sdpa"] > tol]
    failed = exit_status != 0 or bool(bad) or bool(report["errors"]) or not report["rows"]
    return {"status": "failed" if failed else "ok", "exit_status": exit_status, "rows": len(report["rows"]),
            "skipped": len(report["skipped"]), "errors": report["errors"][:5], "mismatches": bad, "tolerance": tol}


def _backbones(dry_run: bool) -> dict:
    """Name -> builder of the models the backbone step times."""
    from winpos.backbones import create

    if dry_run:
        return {"winpos ViTDet toy paper": lambda: create("vitdet_toy", "paper", img_size=64, window_size=4),
                "winpos HieraDet toy original": lambda: create("hieradet_toy", "original")}

    def timm_hiera():
        import timm
        import torch.nn as nn

        class Trunk(nn.Module):  # (B, 3, H, W) -> the last stage's features, no classifier
            def __init__(self):
                super().__init__()
                self.net = timm.create_model("sam2_hiera_base_plus", pretrained=False, num_classes=0)

            def forward(self, x):
                return self.net.forward_features(x)

        return Trunk()

    return {"winpos ViTDet-B paper": lambda: create("vitdet_b", "paper"),
            "winpos HieraDet-B+ original": lambda: create("hieradet_bplus", "original"),
            "timm sam2_hiera_base_plus": timm_hiera}


def _outputs(y):
    if isinstance(y, dict):
        return list(y.values())
    return list(y) if isinstance(y, (list, tuple)) else [y]


def step_backbones(ctx) -> dict:
    import torch

    dev = "cuda" if ctx["cuda"] else "cpu"
    size, reps = (64, 1) if ctx["dry_run"] else (1024, 5)
    rows = []
    for name, build in _backbones(ctx["dry_run"]).items():
        for compiled in ((False,) if ctx["dry_run"] else (False, True)):
            if ctx["left"]() < 30:
                rows.append({"model": name, "compiled": compiled, "status": "skipped: out of time"})
                continue
            row = {"model": name, "compiled": compiled, "image_size": size, "batch": 1}
            try:
                torch.manual_seed(0)
                model = build().to(dev)
                fn = torch.compile(model, fullgraph=False) if compiled else model
                x = torch.randn(1, 3, size, size, device=dev)
                autocast = torch.autocast(dev, dtype=torch.bfloat16, enabled=ctx["cuda"])

                def fwd():
                    with torch.no_grad(), autocast:
                        fn(x)

                def fwd_bwd():
                    with autocast:
                        loss = sum(o.float().mean() for o in _outputs(fn(x)))
                    loss.backward()
                    model.zero_grad(set_to_none=True)

                t0 = time.time()
                row["fwd_s"] = _cuda_time(fwd, reps)
                row["fwd_bwd_s"] = _cuda_time(fwd_bwd, reps)
                row["first_call_and_timing_s"] = time.time() - t0
                row["status"] = "ok"
            except Exception as e:  # keep the other rows: one failing model must not lose them
                row["status"] = f"failed: {type(e).__name__}: {str(e)[:500]}"
            ctx["log"](f"  {name} {'compiled' if compiled else 'eager'}: {row}")
            rows.append(row)
            if ctx["cuda"]:
                torch.cuda.empty_cache()
    failed = [r for r in rows if r["status"].startswith("failed")]
    return {"status": "failed" if failed else "ok", "precision": "bf16 autocast" if ctx["cuda"] else "fp32",
            "rows": rows}


STEP_FNS = {"install": step_install, "environment": step_environment, "ceilings": step_ceilings,
            "kernel_tests": step_kernel_tests, "kernel_benchmark": step_kernel_benchmark,
            "kernel_sweep": step_kernel_sweep, "backbones": step_backbones}


def run_check(out_dir, dry_run: bool = False, budget_s: float = 450.0, steps=STEPS) -> dict:
    """Run ``steps`` (see the module docstring), writing ``gpu_check.json`` after each; returns the report."""
    import torch

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    log = Log(out / "gpu_check.log")
    start = time.time()
    ctx = {"out": out, "log": log, "dry_run": dry_run, "cuda": torch.cuda.is_available() and not dry_run,
           "left": lambda: budget_s - (time.time() - start)}
    report = {"schema_version": SCHEMA_VERSION, "dry_run": dry_run, "budget_s": budget_s, "steps": {}}
    for name in steps:
        log(f"== {name} ({time.time() - start:.0f} s elapsed, budget {budget_s:.0f} s)")
        t0 = time.time()
        try:
            result = STEP_FNS[name](ctx)
        except Exception as e:  # recorded, and the check fails; the later steps still run
            result = {"status": "failed", "detail": f"{type(e).__name__}: {str(e)[:2000]}"}
        result["seconds"] = time.time() - t0
        report["steps"][name] = result
        log(f"   {name}: {result['status']} ({result['seconds']:.1f} s)")
        report["elapsed_s"] = time.time() - start
        report["ok"] = all(s["status"] == "ok" for s in report["steps"].values())
        (out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    return report
