"""The benchmark harness computes what it prints (tiny shapes; timings themselves are never asserted)."""
from winpos.bench import posemb
from winpos.bench.scaling import fit_exponent
from winpos.bench.timing import interleaved_medians


def test_fit_exponent_recovers_power_laws():
    assert abs(fit_exponent([1, 2, 4, 8], [3, 6, 12, 24]) - 1) < 1e-9
    assert abs(fit_exponent([10, 20, 40], [1, 4, 16]) - 2) < 1e-9


def test_interleaved_medians_calls_each_function():
    calls = {"a": 0, "b": 0}

    def make(name):
        def fn():
            calls[name] += 1
        return fn

    t = interleaved_medians({n: make(n) for n in calls}, repeats=3, warmup=1)
    assert calls == {"a": 4, "b": 4} and set(t) == {"a", "b"} and all(v >= 0 for v in t.values())


def test_posemb_benchmark_compares_equal_outputs():
    res = posemb.run(grid=8, heads=2, head_dim=16, repeats=1)
    assert res["max_abs_diff"] < 1e-5
    assert {r["method"] for r in res["rows"]} == {"augmented_qk", "materialized"}
    assert all(r["median_ms"] > 0 for r in res["rows"])
