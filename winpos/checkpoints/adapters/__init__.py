"""One adapter per checkpoint format: a flat source state dict -> ``convert.Adapted`` (winpos trunk names plus the
token position embedding in one form).

An adapter only renames and sorts; every check and conversion is ``winpos.checkpoints.convert.convert``. Adding a
checkpoint format is one new file here with an ``adapt(state_dict) -> Adapted`` function, its name in
``formats.Format`` (with a rule in ``formats.detect``) and one line in ``ADAPTERS`` below.

Modules:

    _common         what the adapters share: container prefixes, flat and abs-win embeddings, the block renamer
    hiera           official Hiera and timm's plain Hiera (a flat row-major ``pos_embed``)
    timm_abswin     timm ``hiera_*_abswin`` (global plus window embedding)
    sam2            SAM2 / SAM2.1 checkpoints or a bare sam2 ``Hiera`` trunk
    sam             segment-anything ``ImageEncoderViT``
    sam3            SAM3's image encoder, bare or inside a whole SAM3 checkpoint
    mae             MAE / timm-style ViT encoders
    detectron2      detectron2 ViTDet (``.pkl`` of numpy arrays or ``.pth``)
    dinov2          DINOv2 (Meta's layout and timm's)
    dinov3          DINOv3 (Meta's layout and timm's)
    eva02           EVA-02 (MIM, detection and timm checkpoints)
    rope_vit        RoPE-ViT (naver-ai's and timm's)
    lookhere        the LookHere authors' ViT-B weights
    winpos_native   winpos's own HieraDet / ViTDet files, backbone-only

The same families saved by Hugging Face ``transformers`` are renamed into these layouts first
(``winpos.checkpoints.hf``).
"""
from __future__ import annotations

from winpos.checkpoints.adapters import (detectron2, dinov2, dinov3, eva02, hiera, lookhere, mae, rope_vit, sam, sam2, sam3,
                                        timm_abswin, winpos_native)
from winpos.checkpoints.convert import Adapted
from winpos.checkpoints.formats import Format

ADAPTERS = {
    Format.SAM2: sam2.adapt,
    Format.HIERA: hiera.adapt,
    Format.TIMM_HIERA: hiera.adapt,
    Format.TIMM_ABSWIN: timm_abswin.adapt,
    Format.SAM: sam.adapt,
    Format.MAE: mae.adapt,
    Format.DETECTRON2: detectron2.adapt,
    Format.WINPOS: winpos_native.adapt,
    Format.LOOKHERE: lookhere.adapt,
    Format.DINOV2: dinov2.adapt,
    Format.DINOV3: dinov3.adapt,
    Format.EVA02: eva02.adapt,
    Format.ROPE_VIT: rope_vit.adapt,
    Format.SAM3: sam3.adapt,
}


def adapt(state_dict: dict, fmt: Format) -> Adapted:
    """The ``Adapted`` form of a flat state dict of format ``fmt`` (``report.source`` is the format's name). A file in
    Hugging Face transformers names is renamed into the format's own first (``winpos.checkpoints.hf``) and its
    report names the file's keys."""
    from winpos.checkpoints import hf
    from winpos.checkpoints.formats import hf_format

    if hf_format(state_dict) == Format(fmt):
        return hf.adapt(state_dict, Format(fmt).value, ADAPTERS[Format(fmt)])
    adapted = ADAPTERS[Format(fmt)](state_dict)
    adapted.source = Format(fmt).value
    return adapted


__all__ = ["ADAPTERS", "adapt"]
