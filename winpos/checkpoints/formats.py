"""The one vocabulary of checkpoint formats, and ``detect``: which format a loaded checkpoint is.

Every place that needs to know where a checkpoint came from (``load_external``, ``tools/convert_checkpoint.py
--format``, ``tools/posemb_viz.py --format``, the position-embedding diagnostics and the detectron2 checkpointer's
``train.init_checkpoint``) asks ``detect`` and speaks in ``Format`` names. Each format also carries what the
diagnostics need to rebuild the embedding the model adds: its attention window, patch stride and resize flavour.

========================  ==========================================================================================
format                    recognised by
========================  ==========================================================================================
``sam2``                  SAM2 / SAM2.1 (``image_encoder.trunk.*``, or a bare trunk): ``pos_embed (1, C, h, w)`` +
                          ``pos_embed_window (1, C, 8, 8)``, MLPs ``mlp.layers.0/1``
``hiera``                 official Hiera (``{"model_state": ...}``): flat ``pos_embed (1, N, C)`` at stride 4 (video
                          files: ``pos_embed_spatial``)
``timm_hiera``            timm's plain Hiera: as ``hiera``, classifier renamed ``head.fc``; timm resizes antialiased
``timm_abswin``           timm ``hiera_*_abswin``: ``pos_embed (1, C, h, w)`` + ``pos_embed_win (1, C, 8, 8)``
``sam``                   segment-anything ``ImageEncoderViT``: NHWC ``pos_embed (1, 64, 64, C)``, ``mlp.lin1/2``
``mae``                   MAE / timm ViT: ``cls_token``, flat ``pos_embed (1, 1+N, C)`` at stride 16
``detectron2``            detectron2 ViTDet (``backbone.net.*``, ``.pkl`` or ``.pth``): flat ``pos_embed (1, 1+N, C)``
``winpos``                winpos's own HieraDet / ViTDet, backbone-only or a whole detector: ``pos_embed.pos_embed``
                          or ``pos_embed.global_embed`` + ``pos_embed.window_embed`` (or no embedding at all)
``lookhere``              the LookHere authors' ViT-B: ``{"weights": ..., "config": {"head_directions": ...}}``
``dinov2``                DINOv2 (Meta's or timm's): LayerScale ``blocks.0.ls1.gamma`` beside a flat ``pos_embed`` and a
                          14 px patch kernel
``dinov3``                DINOv3: ``storage_tokens`` (Meta's layout) or timm's ``reg_token (1, 4, C)`` beside a
                          ``cls_token`` and no ``pos_embed``
``eva02``                 EVA-02 (MIM, timm or ``backbone.net.``): a query / value bias without a key bias
                          (``attn.q_bias``, ``attn.q_proj``) or a SwiGLU MLP (``mlp.w12`` / ``w1`` / ``fc1_g``,
                          ``ffn_ln``)
``sam3``                  SAM3's image encoder (bare, or under ``detector.backbone.vision_backbone.trunk.`` in a whole
                          SAM3 file): ``ln_pre`` beside ``patch_embed.proj`` and ``blocks.0.attn.qkv`` (``sam3_trunk``)
``rope_vit``              RoPE-ViT (naver-ai, timm): learned mixed frequencies (``freqs`` / ``rope.freqs``), or DeiT-III
                          LayerScale (``blocks.N.gamma_1``) with a ``cls_token`` and no cls row in an optional
                          ``pos_embed`` (a DeiT-III file has the same keys: name ``--format mae`` for it)
========================  ==========================================================================================

The same families saved by Hugging Face ``transformers`` (``model.safetensors``, other names) are detected as the
format they are renamed into (``winpos.checkpoints.hf``).

``parse_format`` also accepts the names older winpos versions used in the diagnostics (``timm_hiera_abswin``,
``vitdet``).
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

import torch

from winpos.errors import WinposError

__all__ = ["Format", "FormatSpec", "FORMATS", "HIERA_FORMATS", "VIT_FORMATS", "detect", "hf_format", "is_dinov2", "parse_format",
           "check_named_family", "rope_family", "sam3_trunk"]


@dataclass(frozen=True)
class FormatSpec:
    """What a format's model does with its position embedding."""

    architecture: str  # "hiera", "vit" or "any" (winpos's own files hold either)
    window: int  # attention window in tokens (stage 1 for Hiera-like models)
    stride: int  # patch stride in px
    antialias: bool  # the format's own bicubic resize: antialiased (timm's Hiera models) or plain
    ceil_grid: bool  # stride-4 conv stems (kernel 7, pad 3) give ceil(px / 4) tokens; ViT stems floor(px / 16)
    describe: str


class Format(str, enum.Enum):
    """A checkpoint format; compares equal to its name (``Format.SAM2 == "sam2"``)."""

    SAM2 = "sam2"
    HIERA = "hiera"
    TIMM_HIERA = "timm_hiera"
    TIMM_ABSWIN = "timm_abswin"
    SAM = "sam"
    MAE = "mae"
    DETECTRON2 = "detectron2"
    WINPOS = "winpos"
    LOOKHERE = "lookhere"
    DINOV2 = "dinov2"
    DINOV3 = "dinov3"
    EVA02 = "eva02"
    ROPE_VIT = "rope_vit"
    SAM3 = "sam3"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def spec(self) -> FormatSpec:
        return _SPECS[self]

    @property
    def is_hiera(self) -> bool:
        return self.spec.architecture in ("hiera", "any")

    @property
    def is_vit(self) -> bool:
        return self.spec.architecture in ("vit", "any")


_SPECS = {
    Format.SAM2: FormatSpec("hiera", 8, 4, False, True, "SAM2 HieraDet trunk (pos_embed + pos_embed_window)"),
    Format.HIERA: FormatSpec("hiera", 8, 4, False, True, "official Hiera (model_state/pos_embed (1, N, C), 8x8-token "
                                                         "mask units)"),
    Format.TIMM_HIERA: FormatSpec("hiera", 8, 4, True, True, "timm Hiera (pos_embed (1, N, C))"),
    Format.TIMM_ABSWIN: FormatSpec("hiera", 8, 4, True, True, "timm Hiera abs-win (pos_embed + pos_embed_win)"),
    Format.SAM: FormatSpec("vit", 14, 16, False, False, "SAM v1 image encoder (pos_embed (1, 64, 64, C) NHWC)"),
    Format.MAE: FormatSpec("vit", 14, 16, False, False, "MAE / timm ViT (pos_embed (1, 1+N, C) with a cls row)"),
    Format.DETECTRON2: FormatSpec("vit", 14, 16, False, False, "detectron2 ViTDet (backbone.net.pos_embed (1, 1+N, "
                                                               "C))"),
    Format.WINPOS: FormatSpec("any", 8, 4, False, True, "winpos backbone (pos_embed.pos_embed, or "
                                                        "pos_embed.global_embed + pos_embed.window_embed)"),
    Format.LOOKHERE: FormatSpec("vit", 14, 16, False, False, "LookHere authors' ViT-B (weights + config, no "
                                                             "position embedding)"),
    Format.DINOV2: FormatSpec("vit", 14, 14, False, False, "DINOv2 ViT (patch 14, LayerScale, pos_embed (1, [1+]N, "
                                                           "C) of the 37x37 grid at 518 px, optional register tokens)"),
    Format.DINOV3: FormatSpec("vit", 14, 16, False, False, "DINOv3 ViT (RoPE on centered coordinates, storage "
                                                           "tokens, LayerScale; no position embedding)"),
    Format.EVA02: FormatSpec("vit", 16, 14, False, False, "EVA-02 ViT (patch 14, RoPE rescaled to the pretraining "
                                                          "grid, SwiGLU, pos_embed (1, 1+N, C))"),
    Format.SAM3: FormatSpec("vit", 24, 14, False, False, "SAM3 image encoder (ViT-L/14, windows of 24, tiled abs "
                                                         "embedding, RoPE rescaled into the window)"),
    Format.ROPE_VIT: FormatSpec("vit", 14, 16, False, False, "RoPE-ViT (axial or mixed RoPE on integer positions, "
                                                             "LayerScale, optional pos_embed (1, N, C))"),
}
FORMATS: tuple[str, ...] = tuple(f.value for f in Format)
HIERA_FORMATS = tuple(f for f in Format if f.spec.architecture == "hiera")
VIT_FORMATS = tuple(f for f in Format if f.spec.architecture == "vit")
_ALIASES = {"timm_hiera_abswin": Format.TIMM_ABSWIN, "vitdet": Format.DETECTRON2}

WINPOS_POSITION_KEYS = ("pos_embed.pos_embed", "pos_embed.global_embed", "pos_embed.window_embed")


def parse_format(name: str | Format, allow_auto: bool = True) -> Format | str:
    """``name`` as a ``Format`` (``"auto"`` stays ``"auto"`` when allowed); a WinposError names the choices."""
    if isinstance(name, Format):
        return name
    if allow_auto and name == "auto":
        return "auto"
    if isinstance(name, str) and name in _ALIASES:
        return _ALIASES[name]
    try:
        return Format(name)
    except ValueError:
        choices = (("auto",) if allow_auto else ()) + FORMATS
        raise WinposError(f"unknown checkpoint format {name!r}; choose one of {', '.join(choices)}") from None


def _last(key: str) -> str:
    return key.rpartition(".")[2]


def _square(n: int) -> bool:
    s = math.isqrt(n)
    return s > 0 and s * s == n


def _flat_embedding(sd: dict) -> tuple[str, torch.Tensor] | tuple[None, None]:
    for key in ("pos_embed", "pos_embed_spatial", "position_embeddings"):
        if isinstance(sd.get(key), torch.Tensor):
            return key, sd[key]
    return None, None


def is_lookhere_container(obj: Any) -> bool:
    """Whether a loaded checkpoint has the LookHere authors' layout: a ``weights`` dict and a ``config`` with
    ``head_directions``."""
    return (isinstance(obj, dict) and isinstance(obj.get("weights"), dict) and isinstance(obj.get("config"), dict)
            and "head_directions" in obj["config"])


def sam3_trunk(sd: dict) -> str | None:
    """The prefix of SAM3's image encoder in ``sd`` (``""`` for a bare encoder), or None. Told by a ``ln_pre`` norm
    beside ``patch_embed.proj`` and ``blocks.0.attn.qkv`` under one prefix: no other supported ViT has ``ln_pre``."""
    for key in sd:
        if key.endswith("ln_pre.weight"):
            prefix = key[: -len("ln_pre.weight")]
            if f"{prefix}patch_embed.proj.weight" in sd and f"{prefix}blocks.0.attn.qkv.weight" in sd:
                return prefix
    return None


def rope_family(sd: dict) -> Format | None:
    """The RoPE-pretrained ViT family a flat state dict belongs to (DINOv3, EVA-02, RoPE-ViT), in either its authors'
    layout or timm's, or None. Each is told by keys no other supported format has."""
    keys = set(sd)
    stripped = {k[len("backbone.net."):] if k.startswith("backbone.net.") else k for k in keys}
    reg = sd.get("reg_token")
    if "storage_tokens" in stripped and not any(k.endswith(".attn.wq.weight") for k in stripped):
        return Format.DINOV3
    if (isinstance(reg, torch.Tensor) and reg.dim() == 3 and reg.shape[1] == 4 and "cls_token" in keys
            and "pos_embed" not in keys):
        return Format.DINOV3
    if any(k.endswith(_EVA02_KEYS) for k in stripped) and not is_dinov2(sd):  # DINOv2-g's SwiGLU is Meta's w12 too
        return Format.EVA02
    freqs = sd.get("freqs")
    if "rope.freqs" in keys or (isinstance(freqs, torch.Tensor) and freqs.dim() == 3 and freqs.shape[0] == 2):
        return Format.ROPE_VIT
    if "cls_token" in keys and "blocks.0.gamma_1" in keys and "blocks.0.attn.qkv.weight" in keys:
        pos = sd.get("pos_embed")
        if pos is None or (isinstance(pos, torch.Tensor) and pos.dim() == 3 and _square(pos.shape[1])):
            return Format.ROPE_VIT
    return None


# the format whose adapter reads each family of winpos.checkpoints.hf once renamed
HF_FORMATS = {"sam": Format.SAM, "sam2": Format.SAM2, "sam3": Format.SAM3, "hiera": Format.HIERA,
              "vitdet": Format.DETECTRON2, "dinov3": Format.DINOV3, "dinov2": Format.DINOV2, "vit": Format.MAE}


def hf_format(sd: dict) -> Format | None:
    """The ``Format`` whose adapter reads ``sd`` once renamed from Hugging Face transformers names
    (``winpos.checkpoints.hf.hf_family``), or None for a file not in those names."""
    from winpos.checkpoints.hf import hf_family

    family = hf_family(sd)
    return None if family is None else HF_FORMATS[family]


def is_dinov2(sd: dict) -> bool:
    """DINOv2 in Meta's or timm's names: LayerScale ``blocks.0.ls1.gamma`` (DeiT-III and RoPE-ViT name it
    ``gamma_1``) with a flat ``pos_embed`` and a 14 px patch kernel (DINOv3 has no ``pos_embed``, EVA-02 no
    ``ls1``). Meta's ViT-g/14 names its SwiGLU ``mlp.w12`` / ``w3`` as EVA-02 does: LayerScale tells them apart."""
    pos, patch = sd.get("pos_embed"), sd.get("patch_embed.proj.weight")
    return ("blocks.0.ls1.gamma" in sd and isinstance(pos, torch.Tensor) and pos.dim() == 3
            and isinstance(patch, torch.Tensor) and patch.dim() == 4 and patch.shape[-1] == 14)


def check_named_family(obj: Any, fmt: Format) -> None:
    """Refuse a file named as one RoPE-pretrained family (``--format dinov3 / eva02 / rope_vit``) whose keys are
    another's or none of theirs: each adapter would read it into a broken trunk."""
    from winpos.checkpoints.io import unwrap_state_dict

    if fmt not in _ROPE_FAMILIES or is_lookhere_container(obj):
        return
    sd = unwrap_state_dict(obj, source="checkpoint")
    found = hf_format(sd) or rope_family(sd)
    if found != fmt:
        seen = f"format {found} ({found.spec.describe})" if found else "none of dinov3 / eva02 / rope_vit"
        raise WinposError(f"--format {fmt} (format={str(fmt)!r}) names a {fmt} checkpoint, but by its keys the file is "
                          f"{seen}; pass --format {found or 'auto'}")


_ROPE_FAMILIES = (Format.DINOV3, Format.EVA02, Format.ROPE_VIT)
_EVA02_KEYS = (".attn.q_bias", ".attn.q_proj.weight", ".mlp.w12.weight", ".mlp.w1.weight", ".mlp.fc1_g.weight",
               ".mlp.ffn_ln.weight")


def detect(obj: Any) -> Format:
    """The format of a loaded checkpoint (a container such as ``{"model": ...}`` or a flat state dict).

    The rules, first match wins: the LookHere authors' container; winpos's own embedding names anywhere (so a whole
    winpos detector is ``winpos``); Hugging Face transformers names (``winpos.checkpoints.hf``: the family they are
    renamed into); the RoPE-pretrained families' own keys (``rope_family``); DINOv2's (``is_dinov2``); SAM2's trunk
    names; timm's ``pos_embed_win``; SAM v1's names or NHWC embedding; detectron2's ``backbone.net.`` prefix; then by the
    flat ``pos_embed``: a ``cls_token``, a cls row or a patch kernel of 14 px or more is a ViT (``mae``), a square
    grid behind a stride-4 stem is Hiera (``timm_hiera`` when the classifier is ``head.fc``); a trunk without any
    token embedding is winpos's (``pos_embed="none"``).

    Raises:
        WinposError: nothing matched; the message lists a sample of the keys and the formats to name by hand.
    """
    from winpos.checkpoints.io import unwrap_state_dict

    if is_lookhere_container(obj):
        return Format.LOOKHERE
    sd = unwrap_state_dict(obj, source="checkpoint")
    keys = set(sd)
    lasts = {_last(k) for k in keys}
    if any(k.endswith(WINPOS_POSITION_KEYS) for k in keys):
        return Format.WINPOS
    hf = hf_format(sd)
    if hf is not None:
        return hf
    if sam3_trunk(sd) is not None:
        return Format.SAM3
    family = rope_family(sd)
    if family is not None:
        return family
    if is_dinov2(sd):
        return Format.DINOV2
    if any(k.startswith("image_encoder.trunk.") or ".mlp.layers." in k for k in keys) or "pos_embed_window" in lasts:
        return Format.SAM2
    if "pos_embed_win" in lasts:
        return Format.TIMM_ABSWIN
    pos_key, pos = _flat_embedding(sd)
    if any(k.startswith(("image_encoder.", "neck.")) or ".mlp.lin1." in k for k in keys) or (
            pos is not None and pos.dim() == 4 and pos.shape[1] == pos.shape[2] and pos.shape[3] != pos.shape[1]):
        return Format.SAM
    if isinstance(sd.get("backbone.net.pos_embed"), torch.Tensor):
        return Format.DETECTRON2
    patch = sd.get("patch_embed.proj.weight")
    kernel = int(patch.shape[-1]) if isinstance(patch, torch.Tensor) and patch.dim() >= 4 else None
    if pos is not None:
        if pos_key == "pos_embed_spatial" or (patch is not None and patch.dim() == 5):
            return Format.HIERA  # a video Hiera: the importer refuses it by name, the diagnostics read its grid
        if pos.dim() == 3:
            n = pos.shape[1]
            if "cls_token" in keys or (kernel is not None and kernel >= 14) or (not _square(n) and _square(n - 1)):
                return Format.MAE
            if _square(n):
                return Format.TIMM_HIERA if "head.fc.weight" in keys else Format.HIERA
    elif any(k.endswith(".attn.qkv.weight") for k in keys):
        return Format.WINPOS  # a winpos trunk built with pos_embed="none"
    pos_like = [f"{k} {tuple(v.shape)}" for k, v in sd.items() if "pos" in k.lower()][:6]
    raise WinposError(
        f"could not tell the checkpoint's format from its {len(sd)} tensors (e.g. {sorted(keys)[:6]}; position-like keys: "
        f"{pos_like or 'none'}); name it (format= in load_external / effective_embeddings, --format in the tools) as "
        f"one of {', '.join(FORMATS)}, or check that it is a checkpoint of a Hiera or ViT backbone (Hugging Face "
        "transformers names are read for SAM, SAM2, SAM3, Hiera, ViTDet, DINOv2, DINOv3 and ViT / ViT-MAE)")
