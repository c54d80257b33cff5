"""Every package of winpos keeps a map: its ``__init__`` docstring lists each of its modules and subpackages, one line
each with what it is for, and names nothing that is not there.

The map is a block of the docstring headed by a line that starts with ``Modules`` and ends with ``:``; each line of
the block (indented, until the first blank line after the first entry) is a name, two or more spaces, and the
purpose (a purpose too long for one line goes on under itself, indented deeper than the names):

    Modules:

        config        loading LazyConfig files with strict overrides
        adapters/     one adapter per checkpoint format (a subpackage ends in /)

Every package counts: each folder with an ``__init__.py`` under ``winpos/``, at any depth (``checkpoints/adapters``,
any package added later), and ``kernels/`` (installed as ``winpos.kernels``). A module is every ``.py`` file of the
package's folder but ``__init__.py`` (``_private`` and ``__main__`` ones included).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# packages whose folder is not their import path (setup.py's package_dir); each is also a subpackage of winpos
MAPPED = {"winpos.kernels": ROOT / "kernels"}

HEADING = re.compile(r"^Modules\b.*:$")
ENTRY = re.compile(r"^ {4,}(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<package>/)?(?:\.py)? {2,}\S")


def packages() -> dict[str, Path]:
    """Every winpos package: dotted name -> folder."""
    found = {".".join(p.parent.relative_to(ROOT).parts): p.parent for p in (ROOT / "winpos").rglob("__init__.py")
             if "__pycache__" not in p.parts}
    return {**found, **MAPPED}


def contents(name: str, folder: Path) -> set[str]:
    """What a package's map must list: its module files (stems) and its subpackages (``name/``)."""
    modules = {p.stem for p in folder.glob("*.py") if p.name != "__init__.py"}
    subpackages = {child[len(name) + 1:] + "/" for child in packages()
                   if child.startswith(name + ".") and "." not in child[len(name) + 1:]}
    return modules | subpackages


def package_map(docstring: str) -> list[str]:
    """The names a docstring's ``Modules ...:`` blocks list (``name/`` for a subpackage), in order."""
    names, in_block, started, column = [], False, False, 0
    for line in docstring.splitlines():
        if HEADING.match(line.strip()) and not line.startswith(" "):
            in_block, started = True, False
            continue
        if not in_block:
            continue
        if not line.strip():
            if started:
                in_block = False
            continue
        indent = len(line) - len(line.lstrip(" "))
        if started and indent > column:
            continue  # the purpose wrapped onto a line indented deeper than the names
        entry = ENTRY.match(line)
        if entry is None:
            raise AssertionError(f"map line is not 'name  purpose' (indented, two spaces before the purpose): {line!r}")
        names.append(entry["name"] + ("/" if entry["package"] else ""))
        started, column = True, indent
    return names


def docstring_of(folder: Path) -> str:
    return ast.get_docstring(ast.parse((folder / "__init__.py").read_text(encoding="utf-8"))) or ""


def test_packages_found():
    # the discovery itself: the packages this test was written against are all found (no silent empty parametrize)
    found = packages()
    for name in ("winpos", "winpos.d2", "winpos.experiments", "winpos.bench", "winpos.checkpoints.adapters",
                 "winpos.kernels", "winpos.cli"):
        assert name in found, name
    assert contents("winpos.checkpoints", found["winpos.checkpoints"]) >= {"adapters/", "convert", "io"}


@pytest.mark.parametrize("name", sorted(packages()))
def test_package_map_lists_every_module(name):
    folder = packages()[name]
    listed = package_map(docstring_of(folder))
    assert listed, (f"{folder.relative_to(ROOT)}/__init__.py: its docstring has no 'Modules:' block listing the "
                    f"package's modules, one 'name  purpose' line each")
    duplicates = sorted({n for n in listed if listed.count(n) > 1})
    assert not duplicates, f"{name}: listed twice in its map: {duplicates}"
    actual = contents(name, folder)
    missing, extra = sorted(actual - set(listed)), sorted(set(listed) - actual)
    assert not missing, (f"{folder.relative_to(ROOT)}/__init__.py: its map does not list {missing}: add one "
                         f"'name  purpose' line each to its 'Modules:' block")
    assert not extra, (f"{folder.relative_to(ROOT)}/__init__.py: its map lists {extra}, which is no module or "
                       f"subpackage of {name} (moved or renamed?): update the 'Modules:' block")


def test_package_map_parser():
    # the parser on a docstring with prose around the block, a subpackage, a '.py' spelling and a second block
    doc = ("Prose that mentions ``not_a_module``.\n\nModules (the public ones first):\n\n"
           "    alpha        does a\n    beta.py      does b, on\n                 two lines\n    sub/         a subpackage\n\n"
           "More prose.\n\nModules of the second kind:\n    gamma   does c\n")
    assert package_map(doc) == ["alpha", "beta", "sub/", "gamma"]
    with pytest.raises(AssertionError, match="not 'name  purpose'"):
        package_map("Modules:\n    alpha does a with one space\n")
    assert package_map("No map here.\n") == []
