"""The ``slow`` marker: registered in pyproject.toml, on every test a measured run found slow, and never used to leave
tests out of CI (``.ci/run`` and the README's test command run them all; ``-m "not slow"`` is only the documented
fast local loop, docs/testing.md)."""
import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# tests over about 30 s in a measured run (pytest --durations, 2 cores): module -> test functions ("*": the module)
MEASURED_SLOW = {
    "tests/d2/test_e2e.py": {  # a module fixture trains, kills and resumes a run: 462 s in its first test's setup
        "test_killed_run_resumes_without_lost_or_repeated_iterations", "test_tiny_config_learns",
        "test_eval_from_checkpoint_reproduces_ap_and_sweeps_sizes", "test_predict_writes_drawings",
        "test_resumed_run_equals_uninterrupted_run", "test_two_process_training_with_launch"},
    "tests/d2/test_full_size_cpu.py": {"test_full_size_recipes_train_save_resume_and_evaluate_on_cpu"},  # 285 s
    "tests/kernels/test_aot_compile.py": {"*"},  # 135 s, the module's compile that every test reads
    "tests/d2/test_launch_state.py": {"test_a_two_process_resume_equals_the_uninterrupted_run",  # 70 s
                                      "test_a_refusal_under_two_processes_is_one_error_line"},  # 33 s
    "tests/checkpoints/test_sam3_encoder.py": {"test_the_full_sam3_encoder_equals_sam3"},  # 32 s
    "tests/d2/test_family_configs.py": {"test_sam3_recipe_trains_five_iterations_from_a_converted_checkpoint"},  # 55 s
    "tests/d2/test_rope_family_configs.py": {"test_recipe_trains_five_iterations_from_a_converted_checkpoint"},  # 50 s
}


def _is_slow_mark(node: ast.AST) -> bool:
    return ast.unparse(node) in ("pytest.mark.slow", "mark.slow")


def marked_slow(path: Path) -> set[str]:
    """The test functions of a module that carry ``slow`` ("*" when the module's ``pytestmark`` does)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    marked = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            values = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
            if any(_is_slow_mark(v) for v in values):
                marked.add("*")
        if isinstance(node, ast.FunctionDef) and any(_is_slow_mark(d) for d in node.decorator_list):
            marked.add(node.name)
    return marked


def test_slow_is_a_registered_marker():
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert any(m.split(":")[0].strip() == "slow" for m in ini["markers"]), ini.get("markers")
    assert "-m" not in ini["addopts"].split(), "pyproject's addopts must not select tests: CI runs them all"


def test_the_measured_slow_tests_carry_the_marker():
    for module, tests in MEASURED_SLOW.items():
        path = ROOT / module
        assert path.is_file(), f"{module} is gone: update MEASURED_SLOW"
        found = marked_slow(path)
        missing = sorted(tests - found) if "*" not in found else []
        assert not missing, f"{module}: measured slow but not marked @pytest.mark.slow: {missing}"
        defined = {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}
        assert tests - {"*"} <= defined, f"{module}: no test named {sorted(tests - {'*'} - defined)}"


def test_marked_slow_finds_decorators_and_module_marks(tmp_path):
    src = tmp_path / "test_x.py"
    src.write_text("import pytest\n\n@pytest.mark.slow\ndef test_a():\n    pass\n\n\ndef test_b():\n    pass\n")
    assert marked_slow(src) == {"test_a"}
    src.write_text("import pytest\npytestmark = [pytest.mark.slow]\n\ndef test_b():\n    pass\n")
    assert marked_slow(src) == {"*"}


def test_ci_and_the_readme_run_every_test_and_the_fast_loop_is_documented():
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    for where, text in ((".ci/run", ci), ("README.md", readme)):
        arguments = re.findall(r"python -m pytest([^\n`]*)", text)
        assert arguments, f"{where} has no pytest command"
        for args in arguments:
            assert " -m " not in f" {args} " and "slow" not in args, f"{where} leaves tests out: pytest{args}"
    testing = (ROOT / "docs" / "testing.md").read_text()
    assert '-m "not slow"' in testing and "CI" in testing
