"""The benchmark harness computes what it prints (tiny shapes; timings themselves are never asserted).

The CLI tests run ``tools/benchmark.py`` in a subprocess (one thread, no GPU visible) and check its JSON: every
measured number finite and positive, ratios equal to the ratio of the printed times, loaded models equal to the
peer they were loaded from.
"""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from winpos.bench import kernels, mlp, posemb
from winpos.bench.peers import ROWS, build_model, rows_for
from winpos.bench.profile import side_by_side
from winpos.bench.scaling import fit_exponent, local_exponents, parse_sizes
from winpos.bench.timing import interleaved_medians, write_json

ROOT = Path(__file__).resolve().parents[1]


def test_fit_exponent_recovers_power_laws():
    assert abs(fit_exponent([1, 2, 4, 8], [3, 6, 12, 24]) - 1) < 1e-9
    assert abs(fit_exponent([10, 20, 40], [1, 4, 16]) - 2) < 1e-9


def test_local_exponents_show_where_growth_changes():
    pts = [{"tokens": t, "seconds": s} for t, s in [(400, 4.0), (100, 1.0), (200, 2.0), (800, 16.0)]]
    ks = local_exponents(pts)
    assert [(a, b) for a, b, _ in ks] == [(100, 200), (200, 400), (400, 800)]
    assert [round(k, 9) for *_, k in ks] == [1.0, 1.0, 2.0]


def test_interleaved_medians_calls_each_function():
    calls = {"a": 0, "b": 0}

    def make(name):
        def fn():
            calls[name] += 1
        return fn

    t = interleaved_medians({n: make(n) for n in calls}, repeats=3, warmup=1)
    assert calls == {"a": 4, "b": 4} and set(t) == {"a", "b"} and all(v >= 0 for v in t.values())


def test_posemb_benchmark_compares_equal_outputs():
    res = posemb.run(grid=8, heads=2, head_dim=16, repeats=1, memory=False)
    assert res["max_abs_diff"] < 1e-5
    assert {r["method"] for r in res["rows"]} == {"winpos", "materialized", "no relpos (floor)"}
    assert all(r["median_ms"] > 0 for r in res["rows"])


def test_round_ratios_pair_calls_of_the_same_round():
    from winpos.bench.timing import round_ratios

    assert round_ratios([2.0, 3.0, 9.0], [1.0, 2.0, 3.0]) == [2.0, 1.5, 3.0]
    with pytest.raises(ValueError, match="same nonzero number of rounds"):
        round_ratios([1.0], [1.0, 2.0])


def test_parse_sizes():
    assert parse_sizes("64, 96x128") == ((64, 64), (96, 128))
    for bad in ("64", "64,abc", "64,0", "64,1x2x3"):
        with pytest.raises(ValueError):
            parse_sizes(bad)


def test_rows_for_keeps_peers_and_sources():
    assert rows_for("hiera", ["hieradet-b+ paper"]) == ["sam2 Hiera-B+", "winpos HieraDet-B+ paper"]
    sam = rows_for("all", ["SAM weights"])
    assert sam == ["segment-anything ViT-B encoder trunk", "winpos ViTDet-B original (SAM weights)"]
    assert all(ROWS[n].family == "vitdet" for n in rows_for("vitdet"))
    with pytest.raises(ValueError, match="no hiera row matches"):
        rows_for("hiera", ["ViTDet"])


def test_write_json_stores_unmeasured_as_null(tmp_path):
    write_json(tmp_path / "r.json", {"a": float("nan"), "b": [1.5, float("inf")], "c": None})
    assert json.loads((tmp_path / "r.json").read_text()) == {"a": None, "b": [1.5, None], "c": None}


def test_side_by_side_merges_top_ops():
    mine = {"ops": [{"op": "mm", "self_ms": 5.0, "share": 0.5}, {"op": "gelu", "self_ms": 1.0, "share": 0.1}]}
    peer = {"ops": [{"op": "mm", "self_ms": 4.0, "share": 0.6}, {"op": "copy", "self_ms": 2.0, "share": 0.3}]}
    rows = side_by_side(mine, peer)
    assert [r["op"] for r in rows] == ["mm", "copy", "gelu"]
    assert rows[1]["ms"] is None and rows[1]["peer_ms"] == 2.0 and rows[2]["peer_share"] is None


def test_kernels_command_forces_a_dry_run_only_without_cuda():
    cmd, forced = kernels.command(["--json", "x.json"], cuda=False)
    assert forced and cmd[1:] == ["-m", "winpos.bench.kernels", "--json", "x.json", "--dry-run"]
    assert kernels.command(["--json", "x.json"], cuda=True) == ([sys.executable, "-m", "winpos.bench.kernels",
                                                                 "--json", "x.json"], False)
    assert not kernels.command(["--dry-run"], cuda=False)[1] and not kernels.command(["--help"], cuda=False)[1]


@pytest.mark.parametrize("name", ["winpos ViTDet-B original (SAM weights)", "timm HieraDet-B+ (sam2_hiera_base_plus)"])
def test_loaded_rows_match_the_model_they_were_loaded_from(name):
    # Oracle: the peer itself (segment-anything's encoder trunk, sam2's Hiera), random weights shared through
    # winpos' converters (SAM) or timm's checkpoint filter (timm).
    built = {}
    model = build_model(name, 64, built)
    source = built[ROWS[name].source]
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        a, b = model(x), source(x)
    a, b = (o[-1] if isinstance(o, (list, tuple)) else o for o in (a, b))
    assert a.shape == b.shape
    assert float((a - b).abs().max() / b.abs().max()) < 1e-5


def _cli(tmp_path, *args, env=None):
    """Run ``tools/benchmark.py *args --json OUT`` on one thread; returns (json, stdout)."""
    out = tmp_path / "out.json"
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1", **(env or {})}
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "benchmark.py"), *args, "--json", str(out)],
                          cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"benchmark {args[0]} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(out.read_text()), proc.stdout


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_backbone_cli(tmp_path):
    res, stdout = _cli(tmp_path, "backbone", "--rows", "HieraDet-B+ paper", "--size", "64", "--repeats", "1",
                       "--threads", "1", "--profile", "3")
    rows = {r["model"]: r for r in res["rows"]}
    mine, peer = rows["winpos HieraDet-B+ paper"], rows["sam2 Hiera-B+"]
    assert set(rows) == {mine["model"], peer["model"]} and mine["peer"] == peer["model"] and peer["peer"] is None
    assert res["memory_column"] == "peak_rss_mib" and _positive(res["matmul_gflops_per_s"])
    for r in rows.values():
        assert all(_positive(r[k]) for k in ("median_s", "gflops", "fraction_of_matmul_peak", "peak_rss_mib")), r
        assert math.isclose(r["fraction_of_matmul_peak"], r["gflops"] / r["median_s"] / res["matmul_gflops_per_s"])
    assert math.isclose(mine["speedup_vs_peer"], peer["median_s"] / mine["median_s"])
    assert peer["speedup_vs_peer"] is None and peer["speedup_range"] is None
    low, high = mine["speedup_range"]
    assert 0 < low <= high and low <= mine["speedup_vs_peer"] * (1 + 1e-9) and high >= mine["speedup_vs_peer"] * (1 - 1e-9)
    assert f"{low:.3g}-{high:.3g}" in stdout
    assert all(len(r["round_s"]) == 1 and r["round_s"][0] == r["median_s"] for r in rows.values())
    # Same trunk, same matmuls: winpos' abs-win HieraDet-B+ costs what sam2's does.
    assert abs(mine["gflops"] - peer["gflops"]) / peer["gflops"] < 0.01
    assert set(res["profile"]) == set(rows)
    for prof in res["profile"].values():
        assert prof["clock"] == "cpu" and 0 < len(prof["ops"]) <= 3 and _positive(prof["total_ms"])
        assert all(_positive(o["self_ms"]) and 0 < o["share"] <= 1 for o in prof["ops"])
        assert sum(o["share"] for o in prof["ops"]) <= 1 + 1e-9
    assert "## profile, cpu self time, top 3 ops: winpos HieraDet-B+ paper" in stdout
    ceilings = {c["model"]: c for c in res["linear_ceiling"]}
    assert set(ceilings) == set(rows)
    for name, c in ceilings.items():
        # Hiera-B+: 24 blocks x (qkv, proj, fc1, fc2) and the 3 projections of the dim-doubling shortcuts.
        assert sum(s["calls"] for s in c["shapes"]) == 99, name
        assert _positive(c["linear_s"]) and math.isclose(c["linear_share"], c["linear_s"] / c["median_s"])
        assert math.isclose(c["linear_fraction_of_peak"], c["linear_gflops_per_s"] / res["matmul_gflops_per_s"])
        linear_gflop = sum(s["rows"] * s["in"] * s["out"] * s["calls"] for s in c["shapes"]) / 1e9
        assert 0.5 * rows[name]["gflops"] < linear_gflop < rows[name]["gflops"]  # attention's matmuls: the rest
    assert "## linear layers alone" in stdout


def test_posemb_cli(tmp_path):
    res, _ = _cli(tmp_path, "posemb", "--size", "128", "--repeats", "1", "--threads", "1", "--no-memory")
    assert res["shape"]["grid"] == 8 and res["max_abs_diff"] < 1e-5
    methods = ("winpos", "materialized", "no relpos (floor)")
    assert [(r["mode"], r["method"]) for r in res["rows"]] == [(m, x) for m in ("fwd", "fwd+bwd") for x in methods]
    for mode in ("fwd", "fwd+bwd"):
        aug, mat, _ = (r for r in res["rows"] if r["mode"] == mode)
        assert _positive(aug["median_ms"]) and _positive(mat["median_ms"])
        assert math.isclose(aug["speedup_vs_materialized"], mat["median_ms"] / aug["median_ms"])
    assert all(r["peak_rss_mib"] is None for r in res["rows"])  # --no-memory: not measured, stored as null


def test_scaling_cli(tmp_path):
    res, _ = _cli(tmp_path, "scaling", "--preset", "vitdet_toy", "--sizes", "64,128", "--repeats", "1",
                  "--threads", "1", "--no-memory", "--plot", str(tmp_path / "scaling.png"))
    assert len(res["variants"]) == 5 and set(res["exponent"]) == set(res["variants"])
    for pts in res["variants"].values():
        assert [p["tokens"] for p in pts] == [16, 64] and all(_positive(p["seconds"]) for p in pts)
    assert all(math.isfinite(k) for k in res["exponent"].values())
    assert (tmp_path / "scaling.png").stat().st_size > 0


def test_train_cli(tmp_path):
    data = f"dataloader.train.dataset.shapes={{root:'{tmp_path}',train_images:4,val_images:1}}"
    res, stdout = _cli(tmp_path, "train", "--encodings", "abswin,rope", "--iters", "1", "--threads", "1",
                       "--opts", "dataloader.train.total_batch_size=2", data)
    assert [r["encoding"] for r in res["rows"]] == ["abswin", "rope"] and res["data_loading_measured"] is False
    assert "data loading not measured" in stdout
    for r in res["rows"]:
        assert r["images_per_iter"] == 2 and _positive(r["median_s_per_iter"]) and _positive(r["last_total_loss"])
        assert math.isclose(r["images_per_s"], 2 / r["median_s_per_iter"])
    abswin, rope = res["rows"]
    assert abswin["speedup_vs_abswin"] == 1.0
    assert math.isclose(rope["speedup_vs_abswin"], abswin["median_s_per_iter"] / rope["median_s_per_iter"])


def test_kernels_cli_without_gpu_runs_the_dry_run(tmp_path):
    # No GPU visible, so on every machine: the message, then the dry run with the forwarded --impls.
    res, stdout = _cli(tmp_path, "kernels", "--impls", "sdpa", env={"CUDA_VISIBLE_DEVICES": ""})
    assert kernels.GPU_NEEDED in stdout
    assert res["interpreter"] is True and res["rows"] and not res["errors"]
    assert {r["impl"] for r in res["rows"]} == {"sdpa"} and all(_positive(r["fwd_ms"]) for r in res["rows"])


def test_cli_refuses_zero_repeats_with_a_clear_message():
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "benchmark.py"), "backbone", "--repeats", "0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "--repeats: must be at least 1" in proc.stderr


def test_flex_cli(tmp_path):
    # aot_eager: the harness end to end without inductor's code generation (slow on CPU); timings not asserted.
    res, stdout = _cli(tmp_path, "flex", "--sizes", "128", "--repeats", "1", "--threads", "1", "--no-memory",
                       "--flex-compile", "aot_eager", "--device", "cpu")
    assert res["compile_backend"] == "aot_eager" and res["device"] == "cpu"
    assert {(c["term"], c["method"]) for c in res["checks"]} == {
        (t, m) for t in ("relpos", "lookhere") for m in ("flex (compiled score_mod)", "materialized")}
    assert all(c["max_abs_diff_vs_winpos"] < 1e-4 for c in res["checks"])
    rows = {(r["term"], r["mode"], r["method"]): r for r in res["rows"]}
    assert len(rows) == 12 and all(r["tokens"] == "8x8" for r in rows.values())
    for (term, mode, method), r in rows.items():
        if method.startswith("flex") and mode == "fwd+bwd":  # PyTorch's FlexAttention: no CPU backward
            assert r["median_ms"] is None and "no CPU backward" in r["note"]
            continue
        low, high = r["range_ms"]
        assert _positive(r["median_ms"]) and low <= r["median_ms"] <= high
        winpos = rows[(term, mode, "winpos")]["median_ms"]
        assert math.isclose(r["winpos_speedup"], r["median_ms"] / winpos)
        assert (r["vs_flex_range"] is None) == (mode == "fwd+bwd")
    assert "no CPU backward" in stdout


def test_flex_skips_a_materialized_bias_that_would_not_fit(monkeypatch):
    from winpos.bench import posemb

    # ViTDet-B at 1536^2: a (12, 9216, 9216) fp32 bias is 3.8 GiB; its call peaks at about 3.1 of those.
    monkeypatch.setattr(posemb, "available_bytes", lambda: 8 * 2**30)
    note = posemb.flex_unmeasured("materialized", True, "cpu", grid=96, heads=12)
    assert note.startswith("not measured: a materialized bias needs about 11.8 GiB") and "8.0 GiB" in note
    assert posemb.flex_unmeasured("winpos", True, "cpu", grid=96, heads=12) is None
    assert posemb.flex_unmeasured("materialized", False, "cpu", grid=64, heads=12) is None  # 1024^2: 2.3 GiB
    monkeypatch.setattr(posemb, "available_bytes", lambda: 20 * 2**30)
    assert posemb.flex_unmeasured("materialized", True, "cpu", grid=96, heads=12) is None


@pytest.mark.parametrize("args, message", [(["--sizes", "100"], "multiple of the patch size 16"),
                                           (["--terms", "rope"], "choose from relpos, lookhere")])
def test_flex_cli_refuses_bad_arguments(args, message):
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "benchmark.py"), "flex", *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr


def _compiled_run(monkeypatch, pattern):
    """``backbone.run`` at 64 px with compiled rows; aot_eager instead of the benchmark's inductor checks the rows
    without code generation."""
    from winpos.bench import backbone

    monkeypatch.setattr(backbone, "compiled_model", lambda name, model: torch.compile(
        model, fullgraph=name.startswith("winpos"), backend="aot_eager"))
    torch.set_num_threads(1)
    return backbone.run(img_size=64, rows=[pattern], repeats=1, warmup=0, flops=False, memory=False, compile=True)


def test_backbone_compiled_rows_are_timed_against_compiled_peers(monkeypatch):
    from winpos.bench import backbone

    res = _compiled_run(monkeypatch, "HieraDet-B+ paper")
    rows = {r["model"]: r for r in res["rows"]}
    mine, peer = "winpos HieraDet-B+ paper", "sam2 Hiera-B+"
    assert set(rows) == {mine, peer, mine + backbone.COMPILED, peer + backbone.COMPILED}
    c = rows[mine + backbone.COMPILED]
    assert c["peer"] == peer + backbone.COMPILED
    assert math.isclose(c["speedup_vs_peer"], rows[peer + backbone.COMPILED]["median_s"] / c["median_s"])
    assert math.isclose(c["speedup_vs_eager"], rows[mine]["median_s"] / c["median_s"])
    assert rows[mine]["speedup_vs_eager"] is None
    checks = {ch["model"]: ch["max_rel_err"] for ch in res["output_checks"]}
    assert checks.keys() == {mine + backbone.COMPILED, peer + backbone.COMPILED}
    assert all(err < 1e-5 for err in checks.values())


def test_backbone_unfused_rows_check_against_the_peer_and_get_no_compiled_row(monkeypatch):
    from winpos.bench import backbone

    res = _compiled_run(monkeypatch, "HieraDet-B+ original")
    fused, unfused, peer = "winpos HieraDet-B+ original", "winpos HieraDet-B+ original, unfused", "sam2 Hiera-B+"
    assert {r["model"] for r in res["rows"]} == {fused, unfused, peer, fused + backbone.COMPILED,
                                                peer + backbone.COMPILED}
    checks = {ch["model"]: ch["max_rel_err"] for ch in res["output_checks"]}
    assert checks[unfused] == 0.0  # the plain ops are sam2's, bit for bit
    assert 0.0 <= checks[fused] < 1e-5  # oneDNN's fused add rounds once instead of twice


def test_backbone_flex_backend_row_matches_the_peer(monkeypatch):
    from winpos.attention import flex
    from winpos.bench import backbone

    monkeypatch.setattr(flex, "COMPILE_BACKEND", "aot_eager")  # the harness, without inductor's code generation
    monkeypatch.delenv("WINPOS_ATTENTION_BACKEND", raising=False)
    torch.set_num_threads(1)
    res = backbone.run(img_size=64, rows=["HieraDet-B+ flex backend"], repeats=1, warmup=0, flops=False,
                       memory=False)
    name = "winpos HieraDet-B+ flex backend, original"
    assert {r["model"] for r in res["rows"]} == {name, "sam2 Hiera-B+"}
    checks = {ch["model"]: ch["max_rel_err"] for ch in res["output_checks"]}
    assert checks[name] < 1e-5  # sam2's weights, every attention through FlexAttention
    assert "WINPOS_ATTENTION_BACKEND" not in os.environ  # restored after each call


def test_mlp_cli(tmp_path):
    res, stdout = _cli(tmp_path, "mlp", "--divide", "256", "--repeats", "2", "--threads", "1")
    assert [r["shape"] for r in res["rows"]] == [s[0] for s in mlp.SHAPES] and res["divide"] == 256
    for r, (_, tokens, channels) in zip(res["rows"], mlp.SHAPES):
        assert r["tokens"] == tokens // 256 and r["channels"] == channels
        assert _positive(r["plain_ms"]) and _positive(r["fused_ms"])
        assert math.isclose(r["speedup"], r["plain_ms"] / r["fused_ms"])
        low, high = r["speedup_range"]
        assert 0 < low <= high
        assert r["max_abs_diff"] < 1e-4  # the same function: the fused add rounds once instead of twice
    assert "## MLP with residual: plain vs fused" in stdout
