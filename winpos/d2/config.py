"""Loading LazyConfig files with strict ``key=value`` overrides.

detectron2's ``LazyConfig.apply_overrides`` silently creates any key it is given, so a typo
(``train.max_iters=10``) trains with the default and nobody notices. Here a plain ``key=value`` must name an
existing key, or an argument accepted by the ``_target_`` of its parent node (``model.backbone.net.
drop_path_rate=0.2`` is fine when that node's target takes ``drop_path_rate`` or ``**kwargs``). A new key is
added explicitly with Hydra's ``+key=value``; ``++key=value`` sets it whether or not it exists. Values use
Hydra's override grammar (``a.b=[1,2]``, ``a.b="text with spaces"``, ``a.b=null``).

Values are checked against the type of the value they replace: a number, or a boolean, only by one of the same
kind (``train.max_iter=abc`` or ``train.max_iter=1.5`` is refused when parsed, not when training starts; ``null``
is always accepted). A ``--flag`` among the overrides means a flag was placed after them, which is said so.
Every error is a ``WinposError`` (a ValueError) naming the override and the fix.
"""
from __future__ import annotations

import difflib
import inspect
import os
import pydoc

from detectron2.config import LazyConfig
from omegaconf import DictConfig, ListConfig, OmegaConf

from winpos.errors import WinposError

__all__ = ["load_config", "apply_overrides", "key_exists"]

_ABSENT = object()


def _child(node, part):
    if isinstance(node, DictConfig):
        return node[part] if part in node else _ABSENT
    if isinstance(node, ListConfig):
        try:
            i = int(part)
        except ValueError:
            return _ABSENT
        return node[i] if -len(node) <= i < len(node) else _ABSENT
    return _ABSENT


def key_exists(cfg, key: str) -> bool:
    """Whether the dotted ``key`` (list indexes as numbers) exists in ``cfg``."""
    node = cfg
    for part in key.split("."):
        node = _child(node, part)
        if node is _ABSENT:
            return False
    return True


def _target_accepts(node, name: str) -> bool:
    if not isinstance(node, DictConfig) or "_target_" not in node:
        return False
    target = node._target_
    if isinstance(target, str):
        target = pydoc.locate(target)
    if target is None:
        return False
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _unknown_key_error(cfg, key: str) -> ValueError:
    parts = key.split(".")
    node, path = cfg, []
    for part in parts[:-1]:
        nxt = _child(node, part)
        if nxt is _ABSENT:
            break
        node, path = nxt, path + [part]
    missing = parts[len(path)]
    where = ".".join(path) or "the top level"
    options = [str(k) for k in node.keys()] if isinstance(node, DictConfig) else []
    close = difflib.get_close_matches(missing, options, n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(repr('.'.join(path + [c])) for c in close)}?" if close else ""
    return WinposError(
        f"config override {key!r}: there is no key {missing!r} under {where} (it has {sorted(options)[:20]}).{hint} "
        f"To add a new key on purpose, write '+{key}=...'.")


def apply_overrides(cfg, overrides) -> DictConfig:
    """Apply Hydra-style overrides to ``cfg`` in place (see module docstring); returns ``cfg``.

    Raises ValueError for an unknown key (naming close matches), for ``+key`` on an existing key, for deletions,
    and for an override that descends into a value that is not a config node.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    overrides = list(overrides)
    flags = [o for o in overrides if isinstance(o, str) and o.startswith("-")]
    if flags:
        raise WinposError(f"{', '.join(flags)} comes after the key=value overrides, which take the rest of the "
                          "command line; put every flag before the overrides")
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as e:
        raise WinposError(f"cannot parse config overrides {list(overrides)}: {e}. Write them as key=value "
                          "(quote strings with spaces, lists as [1,2])") from e
    for o in parsed:
        key = o.key_or_group
        parts = key.split(".")
        for i in range(1, len(parts)):
            v = OmegaConf.select(cfg, ".".join(parts[:i]), default=None)
            if v is not None and not OmegaConf.is_config(v):
                raise WinposError(f"config override {key!r}: {'.'.join(parts[:i])} is a {type(v).__name__}, not a "
                                  "config node, so it has no sub-keys")
        if o.is_delete():
            raise WinposError(f"'~{key}' deletes a key, which is not supported; set it to null instead ({key}=null)")
        exists = key_exists(cfg, key)
        force = o.is_force_add()
        if o.is_add() and not force and exists:
            raise WinposError(f"'+{key}=...' adds a new key but {key!r} exists; write '{key}=...' to change it")
        if not exists and not o.is_add():
            parent_key, _, leaf = key.rpartition(".")
            parent = OmegaConf.select(cfg, parent_key, default=None) if parent_key else cfg
            if not _target_accepts(parent, leaf):
                raise _unknown_key_error(cfg, key)
        if exists:
            _check_value_type(cfg, key, o.value())
        OmegaConf.update(cfg, key, o.value(), merge=True, force_add=True)
    return cfg


def _check_value_type(cfg, key: str, new) -> None:
    """Refuse a value whose kind differs from the number / boolean it replaces (see module docstring)."""
    try:
        old = OmegaConf.select(cfg, key, default=None)
    except Exception:  # noqa: BLE001 - an interpolation that does not resolve yet: nothing to compare
        return
    if old is None or new is None:
        return
    if isinstance(old, bool):
        ok, kind = isinstance(new, bool), "true or false"
    elif isinstance(old, int):
        ok, kind = isinstance(new, int) and not isinstance(new, bool), "an integer"
    elif isinstance(old, float):
        ok, kind = isinstance(new, (int, float)) and not isinstance(new, bool), "a number"
    else:
        return
    if not ok:
        raise WinposError(f"config override {key}={new!r}: {key} takes {kind} (it is {old!r}); write e.g. "
                          f"{key}={str(old).lower() if isinstance(old, bool) else old}")


def load_config(path, overrides=()) -> DictConfig:
    """A LazyConfig ``.py`` file or a saved ``config.yaml``, plus strict ``overrides``. ``path`` is a file, or the
    name of a config shipped with winpos (``COCO/mask_rcnn_vitdet_b_100ep.py``, ``configs/...`` accepted:
    ``winpos.model_zoo.config_path``). A ``.py`` file is Python and runs (detectron2's LazyConfig convention:
    pass only ``.py`` configs you trust); a ``config.yaml`` is read as data (``winpos.d2.safe_config``: no YAML
    tag builds an object, every ``_target_`` must name a trusted module's class or function)."""
    from winpos.utils.config_names import config_path

    path = os.fspath(path)
    if not os.path.isfile(path) and path.endswith(".py"):
        path = config_path(path)  # an unknown name: one line naming the closest config names
    if not os.path.isfile(path):
        raise WinposError(f"config file {path!r} does not exist; pass a config name such as "
                          "shapes/mask_rcnn_hieradet_toy_abswin.py, a LazyConfig .py file or an output_dir/config.yaml")
    if not path.endswith((".py", ".yaml", ".yml")):
        raise WinposError(f"config file {path!r} is neither a LazyConfig .py file nor a config.yaml; pass e.g. "
                          "configs/shapes/mask_rcnn_hieradet_toy_abswin.py")
    if not path.endswith(".py"):
        from winpos.d2.safe_config import load_yaml_config

        return apply_overrides(load_yaml_config(path), overrides)
    try:
        cfg = LazyConfig.load(path)
    except Exception as e:  # noqa: BLE001 - a config file runs arbitrary Python; any error means it did not load
        raise WinposError(f"config file {path!r} could not be loaded ({type(e).__name__}: {e}); fix the file or "
                          "pass a LazyConfig from configs/") from e
    return apply_overrides(cfg, overrides)
