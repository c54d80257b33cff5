"""Read a saved ``config.yaml`` as data: no YAML tag builds an object, no ``_target_`` outside a trusted set.

A run folder (``output_dir`` with its ``config.yaml``) is something people copy and share, so reading it must not
run anything. detectron2's ``LazyConfig.load`` reads YAML with PyYAML's unsafe loader, where a tag such as
``!!python/object/apply:os.system`` calls a function while the file is parsed, and ``instantiate`` then calls
whatever each ``_target_`` names. winpos reads every ``config.yaml`` here instead:

- ``load_yaml_config(path)``: a ``SafeLoader`` that knows exactly two Python tags, both plain data:
  ``!!python/tuple`` and detectron2's ``ShapeSpec`` (``LazyConfig.save`` writes it for every ROI head's
  ``input_shape``; it is rebuilt from its four integer fields, nothing else is called). Any other tag is refused
  in one line naming the tag and its line. Every ``_target_`` is then checked by ``check_targets``.
- ``check_targets(cfg, where)``: a ``_target_`` must name a class or function of detectron2's model, data,
  solver and evaluation packages, fvcore's schedulers, ``torch.optim`` / ``torch.nn``, torchvision's ops and
  transforms, or winpos's backbones, data, evaluation and optimizer modules (``TRUSTED_TARGET_MODULES``). Only
  these five top-level packages are imported to resolve a name, so a file beside the config is never imported;
  the resolved object's own module is checked too, so a re-export cannot lead elsewhere. A user who trains their
  own classes from a YAML config adds their modules with ``WINPOS_TRUSTED_TARGETS=mypkg.models,mypkg.data``.
- ``read_yaml_as_data(path)``: for comparisons only (``--resume`` checks): unknown tags become inert
  ``{"!!tag": ..., "value": ...}`` nodes, so nothing is built, and the saved run is still compared key by key.

A LazyConfig ``.py`` file is Python and runs when it is loaded, by design (detectron2's convention): pass only
``.py`` configs you trust, as with any script.
"""
from __future__ import annotations

import os

from winpos.errors import WinposError

TRUSTED_TARGET_MODULES = (
    "detectron2.modeling", "detectron2.layers", "detectron2.data", "detectron2.solver", "detectron2.evaluation",
    "detectron2.structures", "fvcore.common.param_scheduler", "torch.optim", "torch.nn", "torchvision.ops",
    "torchvision.transforms", "winpos.backbones", "winpos.data", "winpos.d2.backbone", "winpos.d2.data",
    "winpos.d2.evaluate", "winpos.d2.optim", "winpos.d2.own_data",
)
"""Modules (and their sub-modules) whose classes and functions a ``config.yaml``'s ``_target_`` may name. None of
them reads a file as code, runs a shell or imports a module by a name it is given."""

_IMPORTABLE = ("detectron2", "fvcore", "torch", "torchvision", "winpos")
"""Top-level packages a target name may be resolved in (installed packages: importing them runs no file of the
run folder)."""

ENV_TRUSTED = "WINPOS_TRUSTED_TARGETS"

_SHAPE_SPEC_TAG = "tag:yaml.org,2002:python/object:detectron2.layers.shape_spec.ShapeSpec"
_SHAPE_SPEC_FIELDS = ("channels", "height", "width", "stride")


def _user_trusted() -> tuple[str, ...]:
    return tuple(p.strip() for p in os.environ.get(ENV_TRUSTED, "").split(",") if p.strip())


def _within(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _loader(inert: bool):
    import yaml

    class ConfigLoader(yaml.SafeLoader):
        """PyYAML's safe loader plus the two data-only Python tags a saved LazyConfig holds."""

    def shape_spec(loader, node):
        from detectron2.layers import ShapeSpec

        fields = loader.construct_mapping(node, deep=True)
        bad = {k: v for k, v in fields.items()
               if k not in _SHAPE_SPEC_FIELDS or not (v is None or (isinstance(v, int) and not isinstance(v, bool)))}
        if bad:
            raise yaml.constructor.ConstructorError(
                None, None, f"a ShapeSpec takes integer or null channels/height/width/stride only, not {bad}",
                node.start_mark)
        return ShapeSpec(**fields)

    def as_tuple(loader, node):
        return tuple(loader.construct_sequence(node, deep=True))

    ConfigLoader.add_constructor(_SHAPE_SPEC_TAG, shape_spec)
    ConfigLoader.add_constructor("tag:yaml.org,2002:python/tuple", as_tuple)
    if inert:
        def unknown(loader, tag_suffix, node):
            if isinstance(node, yaml.MappingNode):
                value = loader.construct_mapping(node, deep=True)
            elif isinstance(node, yaml.SequenceNode):
                value = loader.construct_sequence(node, deep=True)
            else:
                value = loader.construct_scalar(node)
            return {"!!tag": node.tag, "value": value}

        ConfigLoader.add_multi_constructor("", unknown)
    return ConfigLoader


def _read(path, inert: bool):
    import yaml

    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            return yaml.load(f, Loader=_loader(inert))  # noqa: S506 - a SafeLoader subclass (see _loader)
    except OSError as e:
        raise WinposError(f"config file {path!r} cannot be read ({e.strerror or e}); check the path") from None
    except UnicodeDecodeError as e:
        raise WinposError(f"config file {path!r} is not UTF-8 text ({e.reason}); pass a config.yaml that winpos "
                          "or detectron2 wrote, or a LazyConfig .py file") from None
    except yaml.constructor.ConstructorError as e:
        mark = e.problem_mark or e.context_mark
        where = f" (line {mark.line + 1})" if mark is not None else ""
        tag = (e.problem or "").replace("could not determine a constructor for the tag ", "")
        raise WinposError(f"config file {path!r} holds the YAML tag {tag}{where}, which would build a Python object "
                          "while the file is read; winpos reads a config.yaml as data only: remove that tag, or "
                          "pass the LazyConfig .py the run was made from") from None
    except yaml.YAMLError as e:
        raise WinposError(f"config file {path!r} is not valid YAML ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}); restore it from the run, or pass the "
                          "LazyConfig .py the run was made from") from None
    except RecursionError:
        raise WinposError(f"config file {path!r} is nested too deeply to be a config; restore it from the run, "
                          "or pass the LazyConfig .py the run was made from") from None


def read_yaml_as_data(path):
    """The YAML at ``path`` as plain Python containers, for comparing configs: nothing in it is built or called
    (a Python tag other than ``ShapeSpec`` / ``tuple`` becomes an inert ``{"!!tag": tag, "value": ...}`` node)."""
    return _read(path, inert=True)


def _targets(node, key: str = ""):
    if isinstance(node, dict):
        for k, v in node.items():
            sub = f"{key}.{k}" if key else str(k)
            if k == "_target_":
                yield key or "(top level)", v
            else:
                yield from _targets(v, sub)
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            yield from _targets(v, f"{key}.{i}")


def check_target(target, key: str, where: str) -> None:
    """Refuse ``target`` (the ``_target_`` of node ``key`` in ``where``) unless it names a class or function of
    ``TRUSTED_TARGET_MODULES`` or of the user's ``WINPOS_TRUSTED_TARGETS``."""
    from detectron2.utils.registry import locate

    extra = _user_trusted()
    fix = ("a config.yaml may name only classes and functions of detectron2's model, data, solver and evaluation "
           "packages, fvcore's schedulers, torch.optim / torch.nn, torchvision's ops and transforms, and winpos's "
           f"backbones, data and training modules; if {target!r} is your own trusted code, allow its module with "
           f"{ENV_TRUSTED}=<module>, or pass the LazyConfig .py the run was made from")
    if not isinstance(target, str) or not target or not all(p.isidentifier() for p in target.split(".")):
        raise WinposError(f"{where}: {key}._target_ is {target!r}, not a dotted Python name; {fix}")
    trusted = TRUSTED_TARGET_MODULES + extra
    if not (_within(target, _IMPORTABLE) or _within(target, extra)):
        raise WinposError(f"{where}: {key}._target_ {target!r} is outside the trusted modules and is not run; {fix}")
    try:
        obj = locate(target)
    except Exception as e:  # noqa: BLE001 - locate raises ImportError / AttributeError / its own types
        raise WinposError(f"{where}: {key}._target_ {target!r} cannot be found ({type(e).__name__}); check its "
                          "spelling against the installed detectron2 / winpos") from None
    module = getattr(obj, "__module__", None) or ""
    if not (callable(obj) and _within(module, trusted)):
        raise WinposError(f"{where}: {key}._target_ {target!r} resolves to {module or type(obj).__name__}."
                          f"{getattr(obj, '__qualname__', '')}, outside the trusted modules, and is not run; {fix}")


def check_targets(tree, where: str) -> None:
    """``check_target`` for every ``_target_`` in ``tree`` (a config as plain containers or a DictConfig)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(tree, (DictConfig, ListConfig)):
        tree = OmegaConf.to_container(tree, resolve=False)
    for key, target in _targets(tree):
        check_target(target, key, where)


def load_yaml_config(path):
    """A saved ``config.yaml`` as a LazyConfig ``DictConfig`` (what ``LazyConfig.load`` returns), read with the
    safe loader and with every ``_target_`` checked: nothing in the file runs."""
    from omegaconf import DictConfig, OmegaConf

    path = os.fspath(path)
    tree = _read(path, inert=False)
    if not isinstance(tree, dict):
        raise WinposError(f"config file {path!r} holds {type(tree).__name__}, not a mapping of config nodes; pass "
                          "a config.yaml that winpos or detectron2 wrote, or a LazyConfig .py file")
    check_targets(tree, path)
    cfg = OmegaConf.create(tree, flags={"allow_objects": True})
    assert isinstance(cfg, DictConfig)
    return cfg
