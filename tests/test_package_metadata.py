"""The package as the ecosystem reads it, checked from the checkout without building anything (the wheel test,
tests/test_wheel_install.py, checks the built wheel's METADATA): pyproject.toml carries the PEP 621 metadata and
reads the version from ``winpos.__version__``; setup.py keeps only what needs code and defines no field that
pyproject.toml defines; ``import winpos`` is cheap and ``from winpos import *`` gives every name of ``__all__``."""
import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import winpos

ROOT = Path(__file__).resolve().parents[1]
# setup() keywords and the pyproject.toml field each one would duplicate
SETUP_FIELDS = {"name": "name", "version": "version", "description": "description", "long_description": "readme",
                "license": "license", "license_files": "license-files", "python_requires": "requires-python",
                "install_requires": "dependencies", "classifiers": "classifiers", "keywords": "keywords",
                "url": "urls", "project_urls": "urls", "author": "authors", "extras_require": "optional-dependencies",
                "entry_points": "scripts"}


def _setup_keywords() -> set:
    tree = ast.parse((ROOT / "setup.py").read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
    return {k.arg for k in call.keywords}


def test_pyproject_metadata_and_one_version():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]
    for field in ("name", "description", "readme", "requires-python", "license", "authors", "classifiers", "urls",
                  "keywords", "dependencies"):
        assert project.get(field), f"pyproject.toml [project] has no {field}"
    assert project["requires-python"] == ">=3.10" and project["license"] == "Apache-2.0"
    assert "version" in project["dynamic"] and tool["setuptools"]["dynamic"]["version"] == {"attr":
                                                                                            "winpos.__version__"}
    assert winpos.__version__.count(".") == 2 and all(p.isdigit() for p in winpos.__version__.split("."))
    assert "F" in tool["ruff"]["lint"]["select"]


def test_setup_py_defines_no_field_of_pyproject():
    """setuptools refuses (or ignores with a warning) a field given in setup() that pyproject.toml's [project]
    defines statically; the dynamic ones are setup.py's to give, and each must be given."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    keywords = _setup_keywords()
    both = sorted(k for k in keywords if SETUP_FIELDS.get(k) in project)
    assert not both, f"setup.py and pyproject.toml both define {both}"
    given = {SETUP_FIELDS[k] for k in keywords if k in SETUP_FIELDS}
    assert set(project["dynamic"]) - {"version"} <= given, (project["dynamic"], keywords)
    assert "py.typed" in (ROOT / "setup.py").read_text() and (ROOT / "winpos" / "py.typed").is_file()


def test_import_winpos_is_cheap_and_star_import_gives_all():
    code = ("import sys, winpos; print(winpos.__version__, 'torch' in sys.modules, 'detectron2' in sys.modules)\n"
            "ns = {}; exec('from winpos import *', ns)\n"
            "print(sorted(set(winpos.__all__) - set(ns)), 'detectron2' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    first, second = res.stdout.splitlines()
    assert first == f"{winpos.__version__} False False", first  # no torch, no detectron2 on import winpos
    assert second == "[] False", second  # every public name there, still without detectron2


def test_each_public_module_has_an_all_of_names_it_defines():
    # before: winpos.posemb, a public subpackage, had no __all__ and re-exported nothing
    import importlib

    public = [n for n in winpos.__all__ if n != "__version__"]
    assert "posemb" in public
    for name in public:
        module = importlib.import_module(f"winpos.{name}")
        names = getattr(module, "__all__", None)
        assert names, f"winpos.{name} has no __all__"
        assert len(set(names)) == len(names), f"winpos.{name}.__all__ repeats a name"
        assert not [n for n in names if not hasattr(module, n)], f"winpos.{name}.__all__ names what it lacks"
