"""Named backbone presets (``vitdet_b``, ``hieradet_b``, ...) and the one ``create`` entry point.

A preset is a factory ``factory(recipe: str = "original", **overrides) -> nn.Module`` registered under its name.
A model file declares its sizes (constructor arguments per preset name) and recipes (named sets of position
encodings: ``original`` / ``paper`` / ``rope`` / ``lookhere``) and calls ``register_family`` once: every size
becomes a preset built by ``build_preset``, which checks the size, the recipe and the overrides (constructor
arguments applied on top of the size and the recipe; an unknown one is a ``ValueError`` listing the valid ones)
and copies the recipe, so a built model never shares a dict with the table.

This module imports no model file at import time; ``create`` and ``list_presets`` import them lazily so every
preset is registered before it is looked up.
"""
from __future__ import annotations

import copy
import importlib
import importlib.util
import inspect
from typing import Callable

import torch.nn as nn
from winpos.errors import WinposError

__all__ = ["PRESETS", "build_preset", "create", "list_presets", "register_family", "register_preset"]

PRESETS: dict[str, Callable[..., nn.Module]] = {}

# Model files that register presets when imported.
_MODEL_MODULES = ("winpos.backbones.vitdet", "winpos.backbones.hieradet", "winpos.backbones.rope_vits",
                  "winpos.backbones.sam3_encoder", "winpos.backbones.dinov2")


def register_preset(name: str):
    """Decorator registering ``factory(recipe="original", **overrides) -> nn.Module`` under ``name``."""

    def decorator(factory: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        if name in PRESETS and PRESETS[name] is not factory:
            existing = PRESETS[name]
            # Reloading a module re-registers the same function name; anything else is a clash.
            if getattr(existing, "__qualname__", None) != getattr(factory, "__qualname__", None) or \
                    getattr(existing, "__module__", None) != getattr(factory, "__module__", None):
                raise WinposError(f"backbone preset {name!r} is already registered by {existing.__module__}; "
                                  "pick a different name")
        PRESETS[name] = factory
        return factory

    return decorator


def build_preset(cls: type, family: str, sizes: dict, recipes: dict, size: str, recipe: str = "original",
                 overrides: dict | None = None) -> nn.Module:
    """``cls(**sizes[size], **recipes[recipe], **overrides)``, each name checked (``ValueError`` naming the valid
    choices), the tables deep-copied."""
    from winpos.errors import check_choice

    check_choice(f"{family} size", size, sizes)
    check_choice(f"{family} recipe", recipe, recipes)
    overrides = dict(overrides or {})
    valid = set(inspect.signature(cls.__init__).parameters) - {"self"}
    unknown = sorted(set(overrides) - valid)
    if unknown:
        import difflib

        # "recipe" is create()'s own argument, not the class's: a typo of it must point there too
        names = sorted(valid | {"recipe"})
        close = {u: difflib.get_close_matches(u, names, n=1, cutoff=0.7) for u in unknown}
        hint = "; ".join(f"{u!r}: did you mean {c[0]!r}?" for u, c in close.items() if c)
        raise WinposError(f"unknown {family} arguments {unknown}{' (' + hint + ')' if hint else ''}; valid ones are "
                          f"'recipe' (the preset's recipe) and {sorted(valid)}")
    return cls(**{**copy.deepcopy(sizes[size]), **copy.deepcopy(recipes[recipe]), **overrides})


def register_family(cls: type, family: str, sizes: dict, recipes: dict, docs: dict | None = None) -> None:
    """Register one preset per key of ``sizes``: ``create(size, recipe, **overrides)`` calls ``build_preset``.
    ``docs``: an optional one-line description per size (the factory's docstring)."""
    def preset(size: str) -> Callable[..., nn.Module]:
        def factory(recipe: str = "original", **overrides) -> nn.Module:
            return build_preset(cls, family, sizes, recipes, size, recipe, overrides)

        return factory

    for size in sizes:
        factory = preset(size)
        factory.__name__ = factory.__qualname__ = size
        factory.__module__ = cls.__module__
        factory.__doc__ = (docs or {}).get(size, f"{family} preset {size!r}: ``{family}(**SIZES[{size!r}], "
                                                 f"**RECIPES[recipe], **overrides)``")
        register_preset(size)(factory)


def _import_models() -> None:
    for module in _MODEL_MODULES:
        # A model file that is not part of this checkout simply has no presets; a file that exists but fails to
        # import is a real error and propagates.
        if importlib.util.find_spec(module) is not None:
            importlib.import_module(module)


def list_presets() -> list[str]:
    """Sorted names of every registered backbone preset."""
    _import_models()
    return sorted(PRESETS)


def create(name: str, recipe: str = "original", **overrides) -> nn.Module:
    """Build a registered backbone.

    Args:
        name: preset name, e.g. ``"vitdet_b"`` (see ``list_presets()``).
        recipe: the preset family's named set of position encodings, e.g. ``"original"`` or ``"paper"``.
        **overrides: constructor arguments that replace the preset's and the recipe's values.
    Returns:
        The backbone module (``ViTDet`` or ``HieraDet``).
    Raises:
        ValueError: unknown preset (the message lists them), unknown recipe, or invalid overrides.
    """
    _import_models()
    if name not in PRESETS:
        raise WinposError(f"unknown backbone preset {name!r}; available presets: {', '.join(sorted(PRESETS))}")
    return PRESETS[name](recipe=recipe, **overrides)
