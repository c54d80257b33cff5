"""The build a checkpoint records, and the settings without tensors in which a model differs from it.

``winpos-convert`` writes the preset, recipe and constructor arguments its output was converted for into the file
(safetensors metadata, or top-level entries of a ``.pth``: ``winpos_preset``, ``winpos_recipe``, ``winpos_kwargs``
as JSON), and a ``winpos-train`` checkpoint has its run's ``config.yaml`` beside it. Some of those arguments carry no
tensor: RoPE's base, pairing, axis order, coordinates and fraction, LookHere's directions and slopes, LayerNorm's
eps. Weights loaded into a model built with other values of them load by name and shape without a complaint, and
the model then computes something the weights were never trained for (a LookHere file into the recipe's default
slopes, a DINOv3 trunk under RoPE base 10000 instead of 100). ``settings_differences`` names each such setting in
which a model differs from the recorded build, so a loader can refuse it (``train.init_checkpoint`` does, unless
told ``?allow_other_settings=True``; ``load_external`` with ``allow_other_settings=True``).

A different position encoding altogether (RoPE in the file's build, relpos in the model) is not a difference of
settings: it changes tensors, and the load report says what converted, what is new and what is lost.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from winpos.errors import WinposError

__all__ = ["RecordedBuild", "UnbuildableRecord", "recorded_build", "settings_differences", "describe_differences",
           "compare_with_record"]

# Scalar attributes of these modules decide how the loaded weights are used; none is a tensor. RoPE's
# mixed_init_base only initializes learned frequencies, which the checkpoint then replaces: not compared.
_SETTINGS = {
    "RoPE": ("kind", "pairing", "axis_order", "coords", "fraction", "base", "ref_hw", "shared_heads"),
    "LookHere": ("variant", "layout", "global_slope", "layer_slopes", "shorthand"),
    "LayerNorm": ("eps",),
}


def _kind(module: nn.Module) -> str | None:
    from winpos.posemb.lookhere import LookHere
    from winpos.posemb.rope import RoPE

    for cls, kind in ((RoPE, "RoPE"), (LookHere, "LookHere"), (nn.LayerNorm, "LayerNorm")):
        if isinstance(module, cls):
            return kind
    return None


class UnbuildableRecord(WinposError):
    """The recorded build cannot be made by this winpos (a preset or argument it does not know): the settings
    cannot be compared. Loaders say so in their report and load as before; it is not a refusal."""


@dataclass
class RecordedBuild:
    """How the model a checkpoint's weights belong to is built: ``create(preset, recipe=recipe, **kwargs)``;
    ``where`` says where that was read (the file's metadata, or the run's config.yaml)."""

    preset: str
    recipe: str
    kwargs: dict = field(default_factory=dict)
    where: str = ""

    def create_line(self) -> str:
        args = "".join(f", {k}={v!r}" for k, v in self.kwargs.items())
        return f"create({self.preset!r}, recipe={self.recipe!r}{args})"

    def build_meta(self) -> nn.Module:
        """The recorded build on the meta device (no memory, no initialization cost)."""
        from winpos.backbones import create

        with torch.device("meta"):
            return create(self.preset, recipe=self.recipe, **self.kwargs)


def _from_entries(entries: dict, where: str) -> RecordedBuild | None:
    preset = entries.get("winpos_preset")
    if not isinstance(preset, str) or not preset:
        return None
    recipe = entries.get("winpos_recipe") or "original"
    raw = entries.get("winpos_kwargs") or "{}"
    try:
        kwargs = json.loads(raw) if isinstance(raw, str) else dict(raw)
    except (ValueError, TypeError) as e:
        raise WinposError(f"{where}: winpos_kwargs is not the JSON object winpos-convert writes ({e}); convert the "
                          "file again with winpos-convert") from e
    if not isinstance(kwargs, dict):
        raise WinposError(f"{where}: winpos_kwargs is a {type(kwargs).__name__}, not the JSON object winpos-convert "
                          "writes; convert the file again with winpos-convert")
    return RecordedBuild(preset, str(recipe), kwargs, where)


def recorded_build(path, obj=None) -> RecordedBuild | None:
    """The build winpos-convert recorded in ``path``: its safetensors metadata, or the loaded ``.pth`` object
    ``obj``'s top-level ``winpos_*`` keys; None when it records none (a run's checkpoint has its ``config.yaml``
    beside it instead: ``winpos.d2.checkpoint`` reads that)."""
    from winpos.checkpoints.io import safetensors_metadata

    found = _from_entries(safetensors_metadata(path), f"{path} (safetensors metadata)")
    if found is None and isinstance(obj, dict):
        found = _from_entries(obj, f"{path} (its winpos_* entries)")
    return found


def _settings(net: nn.Module) -> dict[str, tuple[str, dict]]:
    out = {}
    for name, module in net.named_modules():
        kind = _kind(module)
        if kind is not None:
            out[name] = (kind, {a: getattr(module, a, None) for a in _SETTINGS[kind]})
    return out


def settings_differences(net: nn.Module, build: RecordedBuild) -> list[tuple[str, str, object, object, list[str]]]:
    """The settings without tensors in which ``net`` differs from ``build``: ``(module kind, setting, recorded
    value, model value, module names)``, one entry per distinct difference, over the modules both have under the
    same name and kind (a module only one of them has is a change of encoding, which the load report covers).
    Raises ``UnbuildableRecord`` when this winpos cannot make the recorded build."""
    try:
        reference = build.build_meta()
    except (WinposError, TypeError, ValueError) as e:  # e.g. an argument an older winpos took: nothing to compare
        raise UnbuildableRecord(f"settings not compared: the build {build.where} records, {build.create_line()}, "
                                f"cannot be made by this winpos ({str(e).splitlines()[0][:200]})") from e
    want, have = _settings(reference), _settings(net)
    grouped: dict[tuple, list[str]] = {}
    for name, (kind, values) in want.items():
        if name not in have or have[name][0] != kind:
            continue
        for attr, value in values.items():
            other = have[name][1][attr]
            if _normal(value) != _normal(other):
                grouped.setdefault((kind, attr, _normal(value), _normal(other)), []).append(name)
    return [(k, a, v, o, names) for (k, a, v, o), names in grouped.items()]


def _normal(value):  # a list read from JSON or YAML equals the tuple the constructor keeps
    if isinstance(value, (list, tuple)):
        return tuple(_normal(v) for v in value)
    return value


def describe_differences(differences) -> str:
    """One clause per difference: ``RoPE base 100.0 in the recorded build, 10000.0 in this model (12 modules:
    blocks.0.attn.rope, ...)``."""
    parts = []
    for kind, attr, recorded, model, names in differences:
        shown = ", ".join(names[:2]) + (", ..." if len(names) > 2 else "")
        parts.append(f"{kind} {attr} {recorded!r} in the recorded build, {model!r} in this model "
                     f"({len(names)} module{'s' if len(names) > 1 else ''}: {shown})")
    return "; ".join(parts)


def compare_with_record(net: nn.Module, build: RecordedBuild, allowed: bool, refusal) -> tuple[str, str]:
    """The one check both loaders make: ``("", "")`` when ``net`` has the recorded settings, ``("not compared",
    why)`` when this winpos cannot make the recorded build (not a refusal), ``("allowed", the differences)`` when
    they differ and ``allowed``; otherwise raises ``WinposError(refusal(the differences))`` (the caller's words:
    what to build and how to allow it)."""
    try:
        differences = settings_differences(net, build)
    except UnbuildableRecord as e:
        return "not compared", str(e)
    if not differences:
        return "", ""
    said = describe_differences(differences)
    if allowed:
        return "allowed", said
    raise WinposError(refusal(said))
