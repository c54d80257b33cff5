"""The layer diagram is true: every import inside winpos points down the stack, and detectron2 is imported only
under ``winpos/d2`` (the layers above, such as ``winpos/experiments``, reach it through ``winpos.d2``) and by the
commands of ``winpos/cli`` (which set up detectron2's loggers).

Every ``import`` / ``from ... import`` statement of every module is checked, including the lazy ones inside
functions (a lazy import is still a dependency). ``kernels/`` is installed as ``winpos.kernels``. The stack,
bottom up (a module may import its own layer and the layers below):

    helpers (winpos, errors, windows, cache, utils) < data < posemb < kernels < attention < backbones < checkpoints
    < diagnostics < d2 (with model_zoo) < experiments < bench < cli
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

LAYERS = (
    ("helpers", ("winpos", "winpos.errors", "winpos.windows", "winpos.cache", "winpos.utils")),
    ("data", ("winpos.data",)),
    ("posemb", ("winpos.posemb",)),
    ("kernels", ("winpos.kernels",)),
    ("attention", ("winpos.attention",)),
    ("backbones", ("winpos.backbones",)),
    ("checkpoints", ("winpos.checkpoints",)),
    ("diagnostics", ("winpos.diagnostics",)),
    ("d2", ("winpos.d2", "winpos.model_zoo")),
    ("experiments", ("winpos.experiments",)),
    ("bench", ("winpos.bench",)),
    ("cli", ("winpos.cli", "winpos.__main__")),  # the commands: may use every layer, none imports them
)
D2_ONLY = ("detectron2",)  # third-party packages only the d2 layer (and the commands above all) may import


def layer_of(module: str) -> int:
    """Index in ``LAYERS`` of the longest package prefix of ``module`` (``winpos`` itself: helpers)."""
    best, best_len = None, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = i, len(p)
    if best is None:
        raise ValueError(f"{module} is in no layer of the diagram; add it to LAYERS")
    return best


def imported_modules(module: str, source: str, is_package: bool = False) -> list[tuple[int, str]]:
    """``(line, absolute module name)`` of every import in ``source`` (relative imports resolved)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module
            # ``from winpos import d2`` imports the subpackage: check ``winpos.d2``, not ``winpos``
            out += [(node.lineno, f"{name}.{a.name}" if name == "winpos" else name) for a in node.names]
    return sorted(set(out))


def violations(module: str, source: str, is_package: bool = False) -> list[str]:
    """Upward imports of ``module`` and imports of detectron2 outside the d2 layer, as sentences."""
    own = layer_of(module)
    found = []
    for line, name in imported_modules(module, source, is_package):
        top = name.split(".")[0]
        if top == "winpos":
            target = layer_of(name)
            if target > own:
                found.append(f"{module}:{line} imports {name}: layer {LAYERS[own][0]} may not import the layer "
                             f"above it, {LAYERS[target][0]}")
        elif top in D2_ONLY and LAYERS[own][0] not in ("d2", "cli"):
            found.append(f"{module}:{line} imports {name}: only winpos/d2 may import {top}")
    return found


def package_modules() -> list[tuple[str, Path, bool]]:
    """``(module name, file, is package)`` of every module of the installed package (``kernels/`` as
    ``winpos.kernels``)."""
    out = []
    for base, prefix in ((ROOT / "winpos", "winpos"), (ROOT / "kernels", "winpos.kernels")):
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            out.append((".".join([prefix, *parts]), path, is_package))
    return out


def test_every_import_points_down_the_stack():
    modules = package_modules()
    assert len(modules) > 60, "the walk found too few modules: is ROOT right?"
    found = [v for name, path, pkg in modules for v in violations(name, path.read_text(), pkg)]
    assert not found, "\n".join(found)


def test_every_module_is_in_a_layer():
    for name, _, _ in package_modules():
        layer_of(name)  # raises for a module outside the diagram


@pytest.mark.parametrize("module, source, message", [
    ("winpos.posemb.interp", "def f():\n    from winpos.d2.engine import build_model\n", "posemb may not import"),
    ("winpos.kernels.dispatch", "import winpos.attention\n", "kernels may not import the layer above it, attention"),
    ("winpos.kernels.dispatch", "from winpos import bench\n", "kernels may not import"),
    ("winpos.diagnostics.doctor", "from ..d2.config import load_config\n", "diagnostics may not import"),
    ("winpos.data.coco", "from detectron2.data import DatasetCatalog\n", "only winpos/d2 may import detectron2"),
    ("winpos.bench.peers", "import detectron2.modeling\n", "only winpos/d2 may import detectron2"),
    ("winpos.experiments.child", "from detectron2.engine import HookBase\n", "only winpos/d2 may import detectron2"),
    ("winpos.d2.engine", "from winpos.cli.train_net import build_parser\n", "d2 may not import the layer above it, cli"),
    ("winpos.bench.decode", "from winpos.cli import COMMANDS\n", "bench may not import the layer above it, cli"),
])
def test_an_upward_import_is_caught(module, source, message):
    found = violations(module, source)
    assert len(found) == 1 and message in found[0], found


@pytest.mark.parametrize("module, source", [
    ("winpos.d2.engine", "import detectron2.engine\nfrom winpos.backbones import create\n"),
    ("winpos.bench.train", "from winpos.d2.engine import build_model\nfrom .timing import progress\n"),
    ("winpos.kernels.dispatch", "from winpos.posemb.relpos import rel_bias_dense\nfrom . import _jit\n"),
    ("winpos.d2", "from .backbone import HieraDetBackbone\n"),
])
def test_downward_and_sibling_imports_pass(module, source):
    assert violations(module, source, is_package=module == "winpos.d2") == []
