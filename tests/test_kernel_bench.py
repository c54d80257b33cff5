"""``python -m winpos.bench.kernels``: the dry run works end to end on CPU (tiny shapes, Triton interpreter) and
writes a complete JSON; without a GPU the real benchmark refuses with a message instead of timing the CPU."""
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from winpos.bench import kernel_baselines as baselines
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
    missing = {u["label"].split("/", 1)[1]: u["reason"] for u in report["unavailable"]}
    for shape in bench.dry_run_shapes():
        for variant in bench.VARIANTS:
            for impl in ("sdpa", "sdpa_xpart", "triton", "reference") + (
                    ("triton_rope_unfused",) if variant == "rope" else ()):
                row = rows[(shape.block, variant, impl)]
                assert row["fwd_ms"] > 0 and row["fwd_bwd_ms"] > 0 and row["fwd_tflops"] > 0
                assert row["fwd_graph_ms"] is None  # CUDA graphs: GPU only
                if impl != "sdpa":  # every implementation computes the same attention (fp32)
                    assert row["max_abs_diff_vs_sdpa"] < 1e-4, row
            # CPU-only gaps are listed with the reason, not dropped
            assert "needs CUDA" in missing[f"{shape.block}/{variant}/sdpa_cudnn"]
            assert "flex" not in {r[2] for r in rows if r[:2] == (shape.block, variant)}
            assert f"{shape.block}/{variant}/flex" in missing


def test_xpart_baseline_is_the_same_attention():
    """The partition-x-once SDPA baseline (one copy of the projection output, pooled queries strided inside each
    window) computes what the per-tensor partition does, for every position term."""
    for shape in (bench.Shape("t", "w4_pool2", 2, (8, 8), 2, 16, 4, pool=2), bench.Shape("t", "w4", 1, (8, 12), 2, 16, 4)):
        qkv = bench.inputs(shape, torch.float64, torch.device("cpu"))
        for variant in bench.VARIANTS:
            pos = baselines.make_pos(shape, variant, "cpu")
            pos = pos if pos.rope is None and pos.rel_pos is None and pos.lookhere is None else type(pos)(
                rope=pos.rope.double() if pos.rope is not None else None,
                rel_pos=tuple(t.double() for t in pos.rel_pos) if pos.rel_pos is not None else None,
                lookhere=pos.lookhere.double() if pos.lookhere is not None else None)
            from torch.nn.attention import SDPBackend

            a = baselines.sdpa_xpart(qkv, shape.window, shape.pool, pos, [SDPBackend.MATH])
            b = baselines.sdpa_baseline(*baselines.split_qkv(qkv, shape.pool), shape.window, pos, [SDPBackend.MATH])
            assert a.shape == b.shape == (shape.batch, shape.grid[0] // shape.pool, shape.grid[1] // shape.pool,
                                          shape.heads, shape.head_dim)
            torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


def test_bad_impls_and_variants_are_refused(capsys):
    import pytest

    for argv, message in ((["--dry-run", "--impls", "sdpa,bogus"], "unknown --impls ['bogus']"),
                          (["--dry-run", "--sweep", "--variants", "rope,nope"], "unknown --variants ['nope']")):
        with pytest.raises(SystemExit) as e:
            bench.main(argv)
        assert e.value.code == 2 and message in capsys.readouterr().err


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


def test_sweep_times_every_configuration_and_restores_the_defaults(monkeypatch):
    """The block-config sweep (the GPU run's tuning hook) on a tiny shape under the interpreter: every tile / warp
    / stage trial is timed through ``set_tuned``, the best per kernel is reported, and the kernels' table is empty
    again afterwards."""
    import time

    from winpos.bench import kernel_sweep
    from winpos.kernels import launch_config as A

    monkeypatch.setattr(kernel_sweep, "SWEEP_BLOCKS", ((16, 16), (32, 32), (64, 64)))
    monkeypatch.setattr(kernel_sweep, "SWEEP_WARPS", (2, 4))
    monkeypatch.setattr(kernel_sweep, "SWEEP_STAGES", (2,))
    monkeypatch.setattr(kernel_sweep, "MAX_PACKED_TILE", 64)
    # 4x4 windows: 16 tokens, so 64-wide tiles (> 2x the window) are not tried; four windows per image, so 16 x 16
    # blocks pack 1, 2 or 4 windows per program and 32 x 32 ones 1 or 2 (tiles up to 64)
    shape = bench.dry_run_shapes()[0]
    result = kernel_sweep.sweep_shape(shape, "none", torch.float32, torch.device("cpu"), 1, time.time() + 600)
    assert not result["cut_short"]
    assert [(t["blocks"], t["pack"], t["num_warps"]) for t in result["trials"]] == [
        ([16, 16], 1, 2), ([16, 16], 1, 4), ([16, 16], 2, 2), ([16, 16], 2, 4), ([16, 16], 4, 2), ([16, 16], 4, 4),
        ([32, 32], 1, 2), ([32, 32], 1, 4), ([32, 32], 2, 2), ([32, 32], 2, 4)]
    assert all(t["fwd_ms"] > 0 and t["bwd_ms"] is not None for t in result["trials"])
    # one key per kernel and launched tile: BLOCK_M x BLOCK_N of the whole tile, "pack" among the terms when packed
    assert set(result["tuned"]) == {f"{k}|{m}|{m}|32|{terms}" for k in ("fwd", "bwd")
                                    for m, terms in ((16, "()"), (32, "()"), (32, "('pack',)"), (64, "('pack',)"))}
    assert all((best["blocks"], best["pack"]) in (([16, 16], 1), ([16, 16], 2), ([16, 16], 4), ([32, 32], 1),
                                                  ([32, 32], 2)) for best in result["tuned"].values())
    assert A.TUNED == {}


def test_sweep_packs_only_windows_that_fit_a_block():
    from winpos.bench.kernel_sweep import sweep_packs

    assert sweep_packs((16, 16), 16, 16, 1024) == (1, 2, 4, 8)
    assert sweep_packs((16, 64), 16, 64, 1024) == (1, 2)
    assert sweep_packs((64, 64), 49, 49, 1024) == (1, 2)
    assert sweep_packs((16, 16), 16, 64, 1024) == (1,)  # the key window does not fit one block
    assert sweep_packs((16, 16), 16, 16, 3) == (1, 2)  # no more than the image's windows


def test_bench_modules_import_each_other_one_way():
    """No import circle inside ``winpos.bench`` (lazy imports count): the kernel benchmark and its sweep share
    shapes, inputs and timing through ``kernel_common``, which imports neither."""
    import ast

    bench_dir = ROOT / "winpos" / "bench"
    graph = {}
    for path in bench_dir.glob("*.py"):
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level == 1:
                    deps |= {node.module} if node.module else {a.name for a in node.names}
                elif node.module == "winpos.bench":
                    deps |= {a.name for a in node.names}
                elif (node.module or "").startswith("winpos.bench."):
                    deps.add(node.module.split(".")[2])
            elif isinstance(node, ast.Import):
                deps |= {a.name.split(".")[2] for a in node.names if a.name.startswith("winpos.bench.")}
        graph[path.stem] = {d for d in deps if (bench_dir / f"{d}.py").is_file()} - {path.stem}

    def cycle_from(start, node, seen):
        for nxt in graph[node]:
            if nxt == start:
                return [node, nxt]
            if nxt not in seen:
                seen.add(nxt)
                found = cycle_from(start, nxt, seen)
                if found:
                    return [node, *found]
        return None

    cycles = [c for c in (cycle_from(m, m, set()) for m in graph) if c]
    assert cycles == [], f"import circles in winpos.bench: {cycles}"
    assert "kernels" not in graph["kernel_sweep"] and "kernel_common" in graph["kernel_sweep"]


def test_rows_run_sdpa_and_triton_per_shape_before_the_terms_and_the_peers():
    """However short the budget, every shape (the HieraDet ones before ViTDet-L) gets its ``sdpa`` and ``triton``
    rows first; every peer row comes after every core row; nothing is lost or repeated."""
    shapes = bench.gpu_shapes()
    order = bench.row_order(shapes, set(baselines.IMPLS))
    assert order[:2 * len(shapes)] == [(s, "none", i) for s in shapes for i in ("sdpa", "triton")]
    models = [s.model for s, _, _ in order[:2 * len(shapes)]]
    assert models.index("hieradet_b+") < models.index("vitdet_l") and models[0] == "vitdet_b"
    core = [n for n, (_, _, impl) in enumerate(order) if impl in ("sdpa", "triton")]
    peers = [n for n, (_, _, impl) in enumerate(order) if impl not in ("sdpa", "triton")]
    assert max(core) < min(peers)
    assert sorted(map(str, order)) == sorted(str((s, v, i)) for s in shapes for v in bench.VARIANTS
                                             for i in baselines.IMPLS)
