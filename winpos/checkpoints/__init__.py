"""Import the checkpoints people already have (official Hiera, SAM2, timm, SAM, MAE, detectron2 ViTDet, winpos).

Every file is read as data (``torch.load(weights_only=True)``, safetensors, or a restricted unpickler for
detectron2's ``.pkl``), then renamed and, where the target asks for it, converted (abs -> abs-win exactly, relpos
tables resampled). ``load_external`` is the one entry point; the per-family converters live in ``hiera.py`` and
``vitdet.py``. Every converter says what it did with each key in a ``LoadReport`` (``report.py``).
"""
from __future__ import annotations

import os

import torch.nn as nn

from winpos.checkpoints.io import load_checkpoint_object, load_state_dict_file, unwrap_state_dict
from winpos.checkpoints.report import LoadReport

FORMATS = ("auto", "sam2", "hiera", "timm_abswin", "winpos", "detectron2", "sam", "mae")
_HIERA_FORMATS = ("sam2", "hiera", "timm_abswin", "winpos")
_VIT_FORMATS = ("detectron2", "sam", "mae")


def _resolve_target(target, recipe, overrides) -> nn.Module:
    if isinstance(target, nn.Module):
        return target
    if isinstance(target, str):
        from winpos.backbones import create

        return create(target, recipe=recipe, **overrides)
    raise ValueError(f"target must be a preset name (see winpos.backbones.list_presets()) or a model, got {target!r}")


def load_external(path_or_state_dict, target, format: str = "auto", recipe: str = "original", strict: bool = False,
                  **overrides):
    """Convert an outside checkpoint into winpos names for ``target``.

    Args:
        path_or_state_dict: a checkpoint file, a loaded container (``{"model": ...}``) or a flat state dict.
        target: a winpos backbone (HieraDet / ViTDet) or a preset name, built with ``recipe`` and ``overrides``
            (e.g. ``pos_embed="abswin"`` to convert an absolute embedding to abs-win on import).
        format: one of ``FORMATS``; ``"auto"`` detects it from the keys.
        strict: refuse checkpoints that lack trunk weights of the target.
    Returns:
        ``(state_dict, LoadReport)``: the state dict loads into the target with ``load_state_dict(sd, strict=False)``
        and only position parameters the source lacks stay missing.
    """
    from winpos.backbones import HieraDet, ViTDet

    if format not in FORMATS:
        raise ValueError(f"unknown checkpoint format {format!r}; choose one of {', '.join(FORMATS)}")
    model = _resolve_target(target, recipe, overrides)
    obj = load_checkpoint_object(path_or_state_dict) if isinstance(path_or_state_dict, (str, os.PathLike)) \
        else path_or_state_dict
    if isinstance(model, HieraDet):
        from winpos.checkpoints.hiera import convert_hiera_checkpoint

        if format in _VIT_FORMATS:
            raise ValueError(f"format={format!r} is a plain-ViT checkpoint; it cannot load into HieraDet")
        sd, report = convert_hiera_checkpoint(obj, target=model, source=format)
    elif isinstance(model, ViTDet):
        from winpos.checkpoints.vitdet import convert_to_vitdet

        if format in _HIERA_FORMATS and format != "winpos":
            raise ValueError(f"format={format!r} is a Hiera checkpoint; it cannot load into ViTDet")
        flat = unwrap_state_dict(obj, source="ViTDet checkpoint")
        if format == "winpos":
            sd, report = flat, LoadReport("winpos", target="winpos ViTDet", matched=sorted(flat))
        else:
            sd, report = convert_to_vitdet(flat, model, source=format)
    else:
        raise ValueError(f"load_external converts into HieraDet or ViTDet, not {type(model).__name__}")
    if strict:
        fatal = [k for k, _ in report.missing if not any(s in k for s in ("pos_embed", "rel_pos", "rope", ".ls"))]
        if fatal:
            raise ValueError(f"the checkpoint lacks {len(fatal)} trunk weights of the target, e.g. {fatal[:5]}; "
                             "it was made for another architecture or size")
    return sd, report


__all__ = ["FORMATS", "LoadReport", "load_checkpoint_object", "load_external", "load_state_dict_file"]
