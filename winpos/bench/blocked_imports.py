"""Rehearse the lent GPU image on a full development machine: refuse to import what that image lacks.

The lent machine holds torch, triton and timm (and pytest, hypothesis, numpy) but no detectron2, sam2 or their
dependencies, and no network. ``WINPOS_BLOCK_IMPORTS=a,b,c`` (or ``=image`` for ``IMAGE_LACKS``) makes every
import of those top-level packages raise ImportError in a process that calls ``install_from_env()`` (the GPU
check and its children do) and, through ``python -m winpos.bench.blocked_imports MODULE ARGS...``, in a child
that runs ``MODULE`` as ``python -m MODULE ARGS...`` would.
"""
from __future__ import annotations

import importlib.abc
import os
import runpy
import sys

ENV = "WINPOS_BLOCK_IMPORTS"
IMAGE_LACKS = ("detectron2", "sam2", "fvcore", "iopath", "pycocotools", "hiera", "segment_anything", "omegaconf",
               "hydra")


class _Blocker(importlib.abc.MetaPathFinder):
    def __init__(self, names):
        self.names = frozenset(names)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.names:
            raise ImportError(f"{fullname} is blocked ({ENV}: the lent GPU image does not have it)")
        return None


def blocked_names(value: str | None = None) -> tuple:
    value = os.environ.get(ENV, "") if value is None else value
    names = [n.strip() for n in value.split(",") if n.strip()]
    return IMAGE_LACKS if names == ["image"] else tuple(names)


def install_from_env() -> tuple:
    """Block the packages ``WINPOS_BLOCK_IMPORTS`` names (none when unset); returns them."""
    names = blocked_names()
    if names and not any(isinstance(f, _Blocker) for f in sys.meta_path):
        loaded = sorted(n for n in names if n in sys.modules)
        if loaded:
            raise RuntimeError(f"{ENV}: {loaded} were imported before the block was installed")
        sys.meta_path.insert(0, _Blocker(names))
    return names


def pytest_plugin_options() -> list:
    """``-p no:NAME`` for every installed pytest plugin (entry point group ``pytest11``) of a blocked package:
    pytest loads them at start, and the lent image has none of them."""
    from importlib.metadata import entry_points

    names = blocked_names()
    return [opt for ep in entry_points(group="pytest11") if ep.value.split(".")[0].split(":")[0] in names
            for opt in ("-p", f"no:{ep.name}")]


def child_command(python: str, module: str, *args: str) -> list:
    """``python -m module args``, through this module when imports are blocked."""
    if blocked_names():
        return [python, "-m", __name__, module, *args]
    return [python, "-m", module, *args]


if __name__ == "__main__":
    install_from_env()
    module, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
