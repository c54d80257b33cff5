"""Where winpos's configs and the demo's checkpoint are, by name, in a checkout and in an installed package alike
(no detectron2 here: ``winpos.model_zoo`` adds loading). The configs are the repository's ``configs/`` folder,
installed as ``winpos/configs``; a name is a path inside it.
"""
from __future__ import annotations

import os
from pathlib import Path

from winpos.errors import MissingInputError

__all__ = ["config_root", "config_path", "list_configs", "demo_checkpoint", "docs_root", "DEMO_CHECKPOINT",
           "CONFIG_FILE_HELP"]

CONFIG_FILE_HELP = ("a config name (shapes/mask_rcnn_hieradet_toy_abswin.py), a LazyConfig .py file (Python: it runs, "
                    "so pass only files you trust) or a run's config.yaml (read as data: no YAML tag or untrusted "
                    "_target_ runs)")
"""The ``--config-file`` help of ``winpos-train``, ``winpos-eval`` and ``winpos-predict``."""

DEMO_CHECKPOINT = "stage1_hieradet_abs_learned_64px.pth"
_PACKAGE = Path(__file__).resolve().parents[1]  # winpos/ (this module is winpos/utils/config_names.py)


def _first_dir(*candidates: Path) -> Path | None:
    return next((c for c in candidates if c.is_dir()), None)


def config_root() -> Path:
    """The folder holding the configs: ``winpos/configs`` when installed from a wheel, the checkout's ``configs/``
    when winpos is imported from a checkout (editable install or source tree)."""
    root = _first_dir(_PACKAGE / "configs", _PACKAGE.parent / "configs")
    if root is None:
        raise MissingInputError(f"winpos's configs are neither in {_PACKAGE / 'configs'} nor in a checkout next to "
                                f"{_PACKAGE}; reinstall winpos (pip install 'winpos[d2]') or pass a config file path")
    return root


def list_configs(prefix: str = "") -> list[str]:
    """Every config name (``COCO/...``, ``shapes/...``, ``common/...``) starting with ``prefix``, sorted."""
    root = config_root()
    names = (p.relative_to(root).as_posix() for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    return sorted(n for n in names if n.startswith(prefix) and not n.endswith("__init__.py"))


def config_path(name: str | os.PathLike) -> str:
    """The file of config ``name``: the name itself when that file exists (a user's own config or a saved
    ``config.yaml``), else the config of that name inside winpos (a leading ``configs/`` is accepted, so the
    commands written for a checkout work from anywhere). An unknown name raises ``MissingInputError`` naming the
    closest names."""
    text = os.fspath(name)
    if os.path.isfile(text):
        return text
    rel = text.replace("\\", "/")
    for prefix in ("configs/", "winpos/configs/"):
        if rel.startswith(prefix):
            rel = rel[len(prefix):]
    if not os.path.isabs(text) and rel.endswith(".py"):
        candidate = config_root() / rel
        if candidate.is_file():
            return str(candidate)
    import difflib

    names = list_configs()
    close = difflib.get_close_matches(rel, names, n=3, cutoff=0.4)
    hint = f"; did you mean {', '.join(close)}" if close else f"; e.g. {names[0]}" if names else ""
    raise MissingInputError(f"config {text!r} is neither a file nor a winpos config name{hint} (every name: "
                            "python -c 'from winpos.model_zoo import list_configs; print(list_configs())')")


def demo_checkpoint() -> Path:
    """The stage-1 detector the demo starts from (its manifest, with SHA-256 and the command that made it, is the
    ``.json`` next to it): package data when installed, ``tools/checkpoints/`` in a checkout."""
    folder = _first_dir(_PACKAGE / "demo_checkpoint", _PACKAGE.parent / "tools" / "checkpoints")
    path = None if folder is None else folder / DEMO_CHECKPOINT
    if path is None or not path.is_file():
        raise MissingInputError(f"the demo's checkpoint {DEMO_CHECKPOINT} is not installed (looked in "
                                f"{_PACKAGE / 'demo_checkpoint'} and a checkout's tools/checkpoints/); reinstall "
                                "winpos from its wheel or a checkout (it ships there), or pass --checkpoint FILE")
    return path


def docs_root() -> Path:
    """The folder of winpos's documentation pages (``docs/*.md`` and their figures): ``winpos/docs`` when installed
    from a wheel, the checkout's ``docs/`` otherwise. Every ``docs/<page>.md`` a command's help names is there."""
    root = _first_dir(_PACKAGE / "docs", _PACKAGE.parent / "docs")
    if root is None:
        raise MissingInputError(f"winpos's documentation is neither in {_PACKAGE / 'docs'} nor in a checkout next to "
                                f"{_PACKAGE}; reinstall winpos from its wheel or a checkout")
    return root
