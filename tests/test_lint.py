"""The tree passes pyflakes' rules (ruff, configured in pyproject.toml: ``select = ["F"]``): an undefined name, an
unused import or variable, or a redefinition fails the test command (and so CI) with ruff's own listing."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_pyflakes_rules_are_clean():
    try:
        import ruff  # noqa: F401 - the package ships the binary that `python -m ruff` runs
    except ImportError:
        pytest.fail("ruff is not installed; run `bash tools/setup_env.sh` (it is in winpos's [test] extra)")
    res = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", "--no-cache", str(ROOT)],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "All checks passed" in res.stdout, res.stdout
