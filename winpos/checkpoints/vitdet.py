"""Load detectron2 ViTDet, segment-anything ``ImageEncoderViT``, MAE / timm ViT, DINOv2, DINOv3, EVA-02, RoPE-ViT and
winpos's own ViTDet weights into ``winpos`` ``ViTDet``.

The format is told by ``winpos.checkpoints.formats.detect``; the per-format renaming lives in
``winpos.checkpoints.adapters`` (``detectron2``, ``sam``, ``mae``, ``winpos_native``) and every check and conversion
in ``winpos.checkpoints.convert``. What the target asks for decides the conversions:

- ``pos_embed="abs"``: the source embedding is stored as the target stores it (flat, with or without the unused cls
  row); SAM's NHWC ``(1, 64, 64, C)`` is flattened row-major (build the model with ``pretrain_img_size=1024,
  pretrain_use_cls_token=False``). The grid is never resized here: a grid mismatch is an error.
- ``pos_embed="abswin"`` / ``"abswin_recursive"``: exact projection ``abs_to_abswin`` with the target's window (the
  global part is zero for a 14x14 MAE / detectron2 grid); resizing a non-zero residual is lossy and reported.
- ``pos_embed="none"``: the source embedding is ignored (reported).
- Relpos tables are copied where the target block has them, linearly resampled when their length differs, and
  dropped where the target block has another position term (the ``paper`` recipe).
"""
from __future__ import annotations

import torch.nn as nn

from winpos.backbones.common import may_keep_init
from winpos.checkpoints.adapters import adapt
from winpos.checkpoints.convert import convert
from winpos.checkpoints.formats import Format, detect, parse_format
from winpos.checkpoints.io import unwrap_state_dict
from winpos.checkpoints.report import LoadReport
from winpos.errors import WinposError

__all__ = ["vit_format", "convert_detectron2_vit", "convert_sam_image_encoder", "convert_mae_vit",
           "convert_winpos_vitdet", "convert_to_vitdet", "load_vitdet_weights", "load_vitdet_checkpoint"]

SOURCES = ("detectron2", "sam", "mae", "winpos", "dinov2", "dinov3", "eva02", "rope_vit", "sam3")


def vit_format(state_dict) -> Format:
    """The format of a ViT-family state dict (``winpos.checkpoints.formats.detect``), refusing Hiera files."""
    fmt = detect(state_dict)
    if not fmt.is_vit or fmt == Format.LOOKHERE:
        raise WinposError(f"this is a {fmt} checkpoint ({fmt.spec.describe}): it does not load into ViTDet through "
                          "this converter; use winpos.checkpoints.load_external, which routes every format")
    return fmt


def convert_to_vitdet(state_dict, model: nn.Module, source: str = "auto"):
    """Convert a ViT-family state dict (``source`` in ``("auto",) + SOURCES``) for ``model``; returns
    ``(state_dict, LoadReport)``."""
    if not hasattr(model, "pos_embed_kind") or not hasattr(model, "blocks") or not hasattr(model, "patch_size"):
        raise WinposError(f"the target must be a winpos ViTDet, got {type(model).__name__}")
    sd = unwrap_state_dict(state_dict, source="ViT checkpoint")
    fmt = parse_format(source)
    fmt = vit_format(sd) if fmt == "auto" else fmt
    if fmt.value not in SOURCES:
        raise WinposError(f"source={source!r} is not a ViT format this converter reads; choose 'auto' or one of "
                          f"{', '.join(SOURCES)}")
    return convert(adapt(sd, fmt), model, "winpos ViTDet")


def convert_detectron2_vit(state_dict, model: nn.Module):
    """detectron2 ``ViT`` weights (``backbone.net.`` prefix optional) -> ``model``; keys outside the trunk are
    reported."""
    return convert_to_vitdet(state_dict, model, "detectron2")


def convert_mae_vit(state_dict, model: nn.Module):
    """MAE / timm-style ViT encoder weights -> ``model`` (cls token, final norm, head and decoder reported)."""
    return convert_to_vitdet(state_dict, model, "mae")


def convert_sam_image_encoder(state_dict, model: nn.Module):
    """segment-anything ``ImageEncoderViT`` weights (``image_encoder.`` prefix optional) -> ``model``."""
    return convert_to_vitdet(state_dict, model, "sam")


def convert_winpos_vitdet(state_dict, model: nn.Module):
    """A winpos ``ViTDet`` state dict (any ``pos_embed`` choice) -> ``model`` (any ``pos_embed`` choice)."""
    return convert_to_vitdet(state_dict, model, "winpos")


def load_vitdet_weights(model: nn.Module, state_dict, source: str = "auto", strict: bool = True) -> LoadReport:
    """Convert ``state_dict`` (any supported family) and load it into ``model`` in place.

    strict: refuse source keys no rule recognises and trunk weights (anything but position parameters and
    LayerScale) that the source lacks; position parameters may always be missing (they keep their init).
    """
    sd, report = convert_to_vitdet(state_dict, model, source)
    if strict:
        trunk_missing = [k for k, _ in report.missing if not may_keep_init(k)]
        if report.unknown or trunk_missing:
            raise WinposError(
                f"the {report.source} checkpoint does not fit this ViTDet: unrecognised source keys "
                f"{report.unknown[:8]}, trunk weights missing from it {trunk_missing[:8]}; check depth / sizes or "
                "pass strict=False to load what matches"
            )
    result = model.load_state_dict(sd, strict=False)
    if result.unexpected_keys:  # the converter only emits the target's keys: this is a winpos bug, not bad input
        raise RuntimeError(f"ViTDet converter emitted keys the model does not have: {result.unexpected_keys[:8]}")
    return report


def load_vitdet_checkpoint(model: nn.Module, path, source: str = "auto", strict: bool = True) -> LoadReport:
    """``load_vitdet_weights`` from a file (``.pkl``, ``.pth``, ``.safetensors``), read safely by
    ``winpos.checkpoints.io.load_checkpoint_object``."""
    from winpos.checkpoints.io import load_checkpoint_object

    return load_vitdet_weights(model, load_checkpoint_object(path), source=source, strict=strict)
