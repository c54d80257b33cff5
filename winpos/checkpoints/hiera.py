"""Load Hiera-family checkpoints (SAM2, official Hiera, timm's Hiera and abs-win Hiera, winpos) into
``winpos.backbones.HieraDet``.

The format is told by ``winpos.checkpoints.formats.detect``; the per-format renaming lives in
``winpos.checkpoints.adapters`` (``sam2``, ``hiera``, ``timm_abswin``, ``winpos_native``) and every check and
position conversion in ``winpos.checkpoints.convert`` (abs -> abs-win is the exact projection with the target's
window, so a target with a 56x56 global grid reproduces an official Hiera at 224 px; abs-win -> abs materializes
the embedding on the target's grid).

HieraDet always pools at all three stage transitions (``q_pool=3``); Hiera MAE checkpoints (``q_pool=2``) load,
but their last stage was pretrained without pooling. Video checkpoints (``sep_pos_embed``) are refused.
"""
from __future__ import annotations

import os

import torch.nn as nn

from winpos.backbones.common import may_keep_init
from winpos.checkpoints.adapters import adapt
from winpos.checkpoints.adapters.hiera import refuse_video
from winpos.checkpoints.convert import convert
from winpos.checkpoints.formats import HIERA_FORMATS, Format, detect, parse_format
from winpos.checkpoints.io import load_checkpoint_object, unwrap_state_dict
from winpos.errors import WinposError

SOURCES = ("auto",) + tuple(f.value for f in HIERA_FORMATS) + (Format.WINPOS.value,)


def hiera_format(state_dict: dict) -> Format:
    """The format of a Hiera-family state dict (``detect``), refusing video Hiera and plain-ViT checkpoints."""
    refuse_video(state_dict)
    fmt = detect(state_dict)
    if not fmt.is_hiera:
        raise WinposError(f"this is a {fmt} checkpoint ({fmt.spec.describe}), a plain ViT: it loads into ViTDet, not "
                          "HieraDet; pick a vitdet_* preset")
    return fmt


def convert_hiera_checkpoint(checkpoint, target: nn.Module | None = None, source: str = "auto"):
    """Convert a Hiera-family checkpoint to ``HieraDet`` names.

    Args:
        checkpoint: a path (read safely by ``winpos.checkpoints.io``), a container (``{"model": ...}``,
            ``{"model_state": ...}``) or a flat state dict.
        target: the ``HieraDet`` to convert for: it decides the form of the position embedding and every shape is
            checked against it. None keeps the source's form (renamed, unchecked).
        source: ``"auto"`` or one of ``SOURCES``.
    Returns:
        ``(state_dict, LoadReport)``; load with ``model.load_state_dict(state_dict, strict=False)`` or use
        ``load_hiera_checkpoint``.
    Raises:
        WinposError (a ValueError): unknown format, video checkpoint, or a shape that differs from the target
        (naming the key, the expected and the found shape).
    """
    if isinstance(checkpoint, (str, os.PathLike)):
        checkpoint = load_checkpoint_object(checkpoint)
    state_dict = unwrap_state_dict(checkpoint, source="Hiera checkpoint")
    fmt = parse_format(source)
    if fmt != "auto" and fmt.value not in SOURCES:
        raise WinposError(f"source={source!r} is not a Hiera format; choose one of {', '.join(SOURCES)}")
    fmt = hiera_format(state_dict) if fmt == "auto" else fmt
    return convert(adapt(state_dict, fmt), target, "winpos HieraDet")


def load_hiera_checkpoint(model: nn.Module, checkpoint, source: str = "auto", strict: bool = True):
    """Convert ``checkpoint`` for ``model`` and load it; returns the ``LoadReport``.

    With ``strict`` a missing trunk weight (anything but position parameters and LayerScale) is an error.
    """
    state_dict, report = convert_hiera_checkpoint(checkpoint, target=model, source=source)
    fatal = [k for k, _ in report.missing if not may_keep_init(k)]
    if strict and fatal:
        raise WinposError(f"the checkpoint lacks {len(fatal)} trunk weights of the model, e.g. {fatal[:5]}; it is "
                          "for a different architecture (check stages / expand_proj), or pass strict=False")
    model.load_state_dict(state_dict, strict=False)
    return report


__all__ = ["SOURCES", "convert_hiera_checkpoint", "hiera_format", "load_hiera_checkpoint"]
