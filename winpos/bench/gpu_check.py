"""The prepared GPU check (``tools/gpu_check.py OUT_DIR``): everything a borrowed CUDA machine should measure, in
one call of under 9 minutes, on a machine that has only torch, triton and timm (and pytest) and no network.

Steps, in this order, each timed and recorded (``OUT_DIR/gpu_check.json``, rewritten after every step; everything
printed also goes to ``OUT_DIR/gpu_check.log``). Each step's status is ``ok``, ``failed`` (a failure is recorded
and the later steps still run), ``partial`` (some of its work was cut for time) or ``skipped`` (none of it ran):
work not done is never reported as ok, and the check passes only when every step is ``ok``.

1. ``install``: ``pip install --no-deps --no-build-isolation -e .`` when ``winpos.kernels`` is not importable,
   then the tool starts itself again; no dependency is fetched.
2. ``environment``: GPU, compute capability, driver, CUDA runtime, Python, torch, triton and timm versions.
3. ``ceilings``: bf16 matmul TFLOP/s (4096^3) and device-to-device copy GB/s (1 GiB).
4. ``kernel_tests``: ``pytest tests/kernels`` on CUDA, compiled Triton: the bf16 / fp16 cases of every term
   (window / global / pooled / packed / padded), the whole tiny backbones and the API tests, every failure
   recorded (no ``-x``); not the sm_90a compile test (CPU only, CI runs it) nor the fp32 cases (step 8).
5. ``kernel_benchmark``: ``python -m winpos.bench.kernels``: first one ``sdpa`` and one ``triton`` row per shape
   (ViTDet-B window and global, HieraDet-B+ s1..s4 with the pooled transition, packed 4x4 windows, padded grids),
   then the position terms, then the peers (partition-x-once SDPA, cuDNN, FlexAttention, the reference). Only
   the Triton rows are judged: an error, or an output further than ``KERNEL_TOL`` from SDPA's, fails the step.
6. ``kernel_sweep``: tile shape x warps x stages of the fused kernels on the HieraDet-B+ shapes.
7. ``backbones``: bf16 forward and forward+backward of winpos ViTDet-B, HieraDet-B+ and timm's
   ``sam2_hiera_base_plus`` at 1024^2, eager, then ``torch.compile``-d where ``COMPILED_ROW_S`` seconds are left;
   one child process per row, killed at its deadline; the kernels' first-use self-check report of each row.
8. ``kernel_tests_fp32``: the fp32 kernel cases (exact-fp32 dots compile slowly) and the drawn shapes.

Deadlines: the whole run ends by ``--budget`` seconds (each step's child process is killed at the step's share
of what is left, ``STEP_SHARE``); a step with less than ``MIN_STEP_S`` left is skipped.

``--dry-run`` runs the same steps on the CPU with tiny shapes (kernel tests and benchmark under the Triton
interpreter on a few cases, toy backbones at 64 px, no compile): it rehearses the script end to end; its timings
mean nothing. ``WINPOS_BLOCK_IMPORTS=image`` blocks what the lent image lacks (``blocked_imports``), and
``WINPOS_KERNEL_FAULT=fwd`` breaks a kernel on purpose (``winpos.kernels._jit``): the rehearsal of a failure.
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

from ..utils.outputs import atomic_write_json, atomic_write_text
from .blocked_imports import child_command, pytest_plugin_options

KERNEL_TOL = {"bfloat16": 6e-2, "float16": 1e-2, "float32": 1e-4}  # max |out - sdpa| of a kernel benchmark row
STEPS = ("install", "environment", "ceilings", "kernel_tests", "kernel_benchmark", "kernel_sweep", "backbones",
         "kernel_tests_fp32")
# Share of the seconds left that a step's child processes may use (hard: killed at it), and the least a step needs.
STEP_SHARE = {"kernel_tests": 0.35, "kernel_benchmark": 0.45, "kernel_sweep": 0.3, "backbones": 0.9,
              "kernel_tests_fp32": 1.0}
MIN_STEP_S = 20.0
COMPILED_ROW_S = 150.0  # a torch.compile row starts only with this much left (compiles take 1-3 min)
EAGER_ROW_S = 60.0
TRITON_IMPLS = ("triton", "triton_rope_unfused")
SCHEMA_VERSION = 2
# pytest selections: the 16-bit kernel cases, the hazards, self-check and API tests, then the tiny backbones (fp32
# models: their exact-fp32 kernels compile slowly, so a kill cuts them first); the fp32 cases (ids end in -float32)
# and the drawn shapes (fp32, new kernels per example) in the last step. The dry run takes a few of each under
# the interpreter.
KERNEL_TEST_FILES = ("tests/kernels/test_window_attention.py", "tests/kernels/test_hazards.py",
                     "tests/kernels/test_self_check.py", "tests/kernels/test_kernel_api.py",
                     "tests/kernels/test_rope_kernel.py", "tests/kernels/test_backbone_kernels.py")  # fp32 models last
FIRST = "not float32 and not drawn_shapes"
FP32 = "float32 or drawn_shapes"
DRY_FIRST = "hiera_w8_d56-float16 or pack4_w4_rope_pad_d56 or hiera_w7_pad_lookhere_d56-float16"
DRY_FP32 = "w7_nonsquare_partial_tiles or relpos_w14-float32"


class Log:
    """Print to stdout and append to ``OUT_DIR/gpu_check.log``."""

    def __init__(self, path: Path):
        self.path = path

    def __call__(self, msg: str) -> None:
        print(msg, flush=True)
        with open(self.path, "a") as f:  # output-policy: append-only log of this check, in the folder it claimed
            f.write(msg + "\n")


def _run(cmd: list[str], log: Log, timeout: float, env: dict | None = None) -> tuple[int, str, str]:
    """Run ``cmd`` from the repository root, killed after ``timeout`` s; returns (exit status, 124 when killed; the
    last lines; the whole output, what it printed before the kill included)."""
    log(f"$ {' '.join(cmd)}  (deadline {timeout:.0f} s)")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(timeout, 1), env=env)
    except subprocess.TimeoutExpired as e:
        out = "".join(x if isinstance(x, str) else (x or b"").decode(errors="replace") for x in (e.stdout, e.stderr))
        log(out[-4000:])
        return 124, f"killed at its deadline of {timeout:.0f} s", out
    out = proc.stdout + proc.stderr
    log(out[-6000:])
    return proc.returncode, "\n".join(out.strip().splitlines()[-5:]), out


SOURCE_HOOK = '''"""Written by winpos's GPU check: winpos from the source tree {root} (kernels/ as winpos.kernels)."""
import importlib.abc
import importlib.util
import sys

ROOT = {root!r}
if ROOT not in sys.path:
    sys.path.append(ROOT)


class _WinposKernels(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "winpos.kernels":
            return None
        return importlib.util.spec_from_file_location(name, ROOT + "/kernels/__init__.py",
                                                      submodule_search_locations=[ROOT + "/kernels"])


sys.meta_path.append(_WinposKernels())
'''


def install_if_needed(root) -> dict | None:
    """Make ``winpos`` and ``winpos.kernels`` importable when they are not: ``pip install --no-deps
    --no-build-isolation -e root`` (needs setuptools and wheel; no network), else a ``.pth`` hook in site-packages
    that imports them from the source tree. Returns what happened (None: nothing to do). The running process does
    not see the new install: re-start it."""
    if importlib.util.find_spec("winpos.kernels") is not None:
        return None
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-e",
                           str(root)], capture_output=True, text=True, timeout=300)
    if proc.returncode == 0:
        return {"status": "ok", "detail": "pip install --no-deps -e: " + proc.stdout.strip().splitlines()[-1]}
    import site

    pip_error = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "error" in ln.lower()][-1:]
    target = Path(site.getsitepackages()[0])
    atomic_write_text(target / "winpos_source_hook.py", SOURCE_HOOK.format(root=str(Path(root).resolve())))
    atomic_write_text(target / "winpos_source_hook.pth", "import winpos_source_hook\n")
    return {"status": "ok", "detail": f"pip could not install ({' '.join(pip_error).strip()}); winpos is imported "
                                      f"from the source tree by {target / 'winpos_source_hook.pth'}"}


def _child_env(**extra) -> dict:
    """The environment of a child step: no TRITON_INTERPRET (children that need it set it themselves), the
    kernels' first-use self-check off (tests and benchmark rows must see the kernels, not the reference)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update({"WINPOS_KERNEL_SELF_CHECK": "0", "PYTHONUNBUFFERED": "1"}, **extra)
    return env


def step_install(ctx) -> dict:
    done = os.environ.get("WINPOS_GPU_CHECK_INSTALL")
    if done:
        return json.loads(done)
    return {"status": "ok", "detail": "winpos.kernels already importable: nothing installed"}


def _driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0] if out else None


def step_environment(ctx) -> dict:
    import torch
    import triton

    from .blocked_imports import blocked_names

    info = {"torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
            "cuda_runtime": torch.version.cuda, "blocked_imports": list(blocked_names()),
            "kernel_fault": os.environ.get("WINPOS_KERNEL_FAULT") or None}
    try:
        import timm

        info["timm"] = timm.__version__
    except ImportError:
        info["timm"] = None
    if ctx["cuda"]:
        info.update(gpu=torch.cuda.get_device_name(), capability=list(torch.cuda.get_device_capability()),
                    driver=_driver())
    else:
        info.update(gpu=None, driver=None, cpu=platform.processor() or platform.machine())
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


def pytest_outcomes(output: str) -> dict:
    """Per-test outcomes from ``pytest -v`` output (complete up to a kill): counts and the failed test ids."""
    import re

    found = re.findall(r"^(tests/\S+::\S+) (PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED)", output, re.M)
    counts = {}
    for _, outcome in found:
        counts[outcome.lower()] = counts.get(outcome.lower(), 0) + 1
    return {"counts": counts, "failed": [t for t, o in found if o in ("FAILED", "ERROR", "XPASS")]}


def _kernel_tests(ctx, selection: str) -> dict:
    cmd = child_command(sys.executable, "pytest", "-v", "-p", "no:cacheprovider", *pytest_plugin_options(), "-k",
                        selection, *KERNEL_TEST_FILES)
    code, tail, out = _run(cmd, ctx["log"], ctx["deadline"], env=_child_env())
    result = pytest_outcomes(out)
    ran = sum(result["counts"].values())
    status = "failed" if result["failed"] or code not in (0, 124) else "partial" if code == 124 else "ok"
    if ran == 0 and status == "ok":
        status = "failed"  # a selection that ran nothing checked nothing
    return {"status": status, "exit_status": code, "selection": selection, "ran": ran, **result, "detail": tail}


def step_kernel_tests(ctx) -> dict:
    return _kernel_tests(ctx, DRY_FIRST if ctx["dry_run"] else FIRST)


def step_kernel_tests_fp32(ctx) -> dict:
    return _kernel_tests(ctx, DRY_FP32 if ctx["dry_run"] else FP32)


def step_kernel_benchmark(ctx) -> dict:
    out = ctx["out"] / "kernels.json"
    budget = max(ctx["deadline"] - 30, 10)  # the benchmark's own budget; the kill comes 30 s later
    cmd = child_command(sys.executable, "winpos.bench.kernels", "--json", str(out), "--budget", f"{budget:.0f}")
    if ctx["dry_run"]:
        cmd.append("--dry-run")
    code, tail, _ = _run(cmd, ctx["log"], ctx["deadline"], env=_child_env())
    if not out.is_file():
        return {"status": "failed", "exit_status": code, "detail": tail}
    return dict(kernel_verdict(json.loads(out.read_text()), code), json=out.name)


def step_kernel_sweep(ctx) -> dict:
    """The block-config sweep of the fused kernels (``winpos.bench.kernels --sweep``) on the HieraDet-B+ shapes;
    informational (its ``tuned`` table is the candidate for the kernels' defaults): it fails only when nothing
    could be swept, and is partial when shapes were left for time."""
    out = ctx["out"] / "kernel_sweep.json"
    budget = max(ctx["deadline"] - 30, 10)
    cmd = child_command(sys.executable, "winpos.bench.kernels", "--sweep", "--json", str(out), "--budget",
                        f"{budget:.0f}", "--reps", "5")
    cmd += ["--dry-run", "--variants", "none"] if ctx["dry_run"] else ["--models", "hieradet_b+",
                                                                         "--variants", "none,rope"]
    code, tail, _ = _run(cmd, ctx["log"], ctx["deadline"], env=_child_env())
    if not out.is_file():
        return {"status": "failed", "exit_status": code, "detail": tail}
    report = json.loads(out.read_text())
    cut = bool(report["skipped"]) or any(s.get("cut_short") for s in report["sweeps"]) or code == 124
    status = "failed" if not report["sweeps"] or code not in (0, 124) else "partial" if cut else "ok"
    return {"status": status, "exit_status": code, "sweeps": len(report["sweeps"]), "skipped": report["skipped"],
            "refused": sum(len(s.get("refused", [])) for s in report["sweeps"]), "json": out.name}


def kernel_verdict(report: dict, exit_status: int = 0) -> dict:
    """The kernel benchmark's ``report`` judged on its Triton rows: failed when one errored or differs from SDPA
    by more than ``KERNEL_TOL`` of its dtype, when none ran, or when the benchmark crashed; partial when rows were
    left for time (killed at the deadline: exit 124). Peer rows' errors (cuDNN, flex, ...) are listed, not judged."""
    tol = KERNEL_TOL[report["dtype"]]
    ours = [r for r in report["rows"] if r["impl"] in TRITON_IMPLS]
    bad = [f"{r['model']}/{r['block']}/{r['variant']}/{r['impl']}: {r['max_abs_diff_vs_sdpa']:.3g}"
           for r in ours if r.get("max_abs_diff_vs_sdpa") is not None and r["max_abs_diff_vs_sdpa"] > tol]
    errors = [e for e in report["errors"] if e["label"].rsplit("/", 1)[-1] in TRITON_IMPLS]
    peer_errors = [e for e in report["errors"] if e not in errors]
    failed = bool(bad) or bool(errors) or not ours or exit_status not in (0, 124)
    partial = bool(report["skipped"]) or exit_status == 124
    return {"status": "failed" if failed else "partial" if partial else "ok", "exit_status": exit_status,
            "rows": len(report["rows"]), "triton_rows": len(ours), "skipped": len(report["skipped"]),
            "errors": errors[:5], "peer_errors": peer_errors[:5], "mismatches": bad, "tolerance": tol}


def step_backbones(ctx) -> dict:
    """Each row in its own process (``gpu_check_rows``), killed at its deadline; eager rows first, then the
    compiled ones while ``COMPILED_ROW_S`` seconds are left."""
    from .gpu_check_rows import backbones

    names = list(backbones(ctx["dry_run"]))
    plan = [(n, False) for n in names] + ([] if ctx["dry_run"] else [(n, True) for n in names])
    rows, end = [], time.time() + ctx["deadline"]
    for name, compiled in plan:
        need = COMPILED_ROW_S if compiled else EAGER_ROW_S * (0.25 if ctx["dry_run"] else 1)
        left = end - time.time()
        if left < need:
            rows.append({"model": name, "compiled": compiled,
                         "status": f"skipped: {left:.0f} s left, needs {need:.0f}"})
            continue
        path = ctx["out"] / "backbone_row.json"
        path.unlink(missing_ok=True)
        cmd = child_command(sys.executable, "winpos.bench.gpu_check_rows", name, "--json", str(path),
                            *(["--compiled"] if compiled else []), *(["--dry-run"] if ctx["dry_run"] else []))
        code, tail, _ = _run(cmd, ctx["log"], left - 5, env=_child_env(WINPOS_KERNEL_SELF_CHECK=""))
        row = json.loads(path.read_text()) if code == 0 and path.is_file() else {
            "model": name, "compiled": compiled, "status": f"failed: exit {code}: {tail[-500:]}"}
        ctx["log"](f"  {name} {'compiled' if compiled else 'eager'}: {row}")
        rows.append(row)
    path = ctx["out"] / "backbone_row.json"
    path.unlink(missing_ok=True)
    failed = any(r["status"].startswith("failed") for r in rows)
    skipped = any(r["status"].startswith("skipped") for r in rows)
    return {"status": "failed" if failed else "partial" if skipped else "ok",
            "precision": "bf16 autocast" if ctx["cuda"] else "fp32", "rows": rows}


STEP_FNS = {"install": step_install, "environment": step_environment, "ceilings": step_ceilings,
            "kernel_tests": step_kernel_tests, "kernel_benchmark": step_kernel_benchmark,
            "kernel_sweep": step_kernel_sweep, "backbones": step_backbones,
            "kernel_tests_fp32": step_kernel_tests_fp32}


def run_check(out_dir, dry_run: bool = False, budget_s: float = 450.0, steps=STEPS) -> dict:
    """Run ``steps`` (see the module docstring) within ``budget_s``, writing ``gpu_check.json`` after each;
    returns the report."""
    import torch

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    log = Log(out / "gpu_check.log")
    start = time.time()
    ctx = {"out": out, "log": log, "dry_run": dry_run, "cuda": torch.cuda.is_available() and not dry_run}
    report = {"schema_version": SCHEMA_VERSION, "dry_run": dry_run, "budget_s": budget_s, "steps": {}}
    for name in steps:
        left = budget_s - (time.time() - start)
        ctx["deadline"] = left * STEP_SHARE.get(name, 1.0)
        log(f"== {name} ({time.time() - start:.0f} s elapsed, {left:.0f} s left, step deadline "
            f"{ctx['deadline']:.0f} s)")
        t0 = time.time()
        if name in STEP_SHARE and ctx["deadline"] < MIN_STEP_S:
            result = {"status": "skipped", "detail": f"{left:.0f} s left of the {budget_s:.0f} s budget"}
        else:
            try:
                result = STEP_FNS[name](ctx)
            except Exception as e:  # recorded, and the check fails; the later steps still run
                result = {"status": "failed", "detail": f"{type(e).__name__}: {str(e)[:2000]}"}
        result["seconds"] = time.time() - t0
        report["steps"][name] = result
        log(f"   {name}: {result['status']} ({result['seconds']:.1f} s)")
        report["elapsed_s"] = time.time() - start
        report["ok"] = all(s["status"] == "ok" for s in report["steps"].values())
        atomic_write_json(out / "gpu_check.json", report)
    return report
