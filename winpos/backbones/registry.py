"""Named backbone presets (``vitdet_b``, ``hieradet_b``, ...) and the one ``create`` entry point.

A preset is a factory ``factory(recipe: str = "original", **overrides) -> nn.Module`` registered with
``@register_preset("name")`` in the model's own file. The factory owns its recipes (named sets of position
encodings such as ``original`` / ``paper`` / ``rope`` / ``lookhere``) and validates the recipe name; ``overrides``
are constructor arguments applied on top of the preset and the recipe.

This module imports no model file at import time; ``create`` and ``list_presets`` import them lazily so every
preset is registered before it is looked up.
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import Callable

import torch.nn as nn

PRESETS: dict[str, Callable[..., nn.Module]] = {}

# Model files that register presets when imported.
_MODEL_MODULES = ("winpos.backbones.vitdet", "winpos.backbones.hieradet")


def register_preset(name: str):
    """Decorator registering ``factory(recipe="original", **overrides) -> nn.Module`` under ``name``."""

    def decorator(factory: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        if name in PRESETS and PRESETS[name] is not factory:
            existing = PRESETS[name]
            # Reloading a module re-registers the same function name; anything else is a clash.
            if getattr(existing, "__qualname__", None) != getattr(factory, "__qualname__", None) or \
                    getattr(existing, "__module__", None) != getattr(factory, "__module__", None):
                raise ValueError(f"backbone preset {name!r} is already registered by {existing.__module__}; "
                                 "pick a different name")
        PRESETS[name] = factory
        return factory

    return decorator


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
        raise ValueError(f"unknown backbone preset {name!r}; available presets: {', '.join(sorted(PRESETS))}")
    return PRESETS[name](recipe=recipe, **overrides)
