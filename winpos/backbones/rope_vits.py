"""ViTDet presets for the ViTs pretrained with RoPE: DINOv3, EVA-02 and RoPE-ViT, each size timm defines up to L.

Each family is the one ``ViTDet`` with the block its checkpoints need (``BlockOptions``: SwiGLU, sub-LN, no key bias;
LayerScale) and its own RoPE convention as the ``rope`` options of its recipes (``winpos.posemb.rope.RoPE``):

==========  ==================================================================================================
family      position convention (the ``original`` recipe; every option can be overridden per recipe)
==========  ==================================================================================================
DINOv3      no token embedding; axial RoPE, base 100, rotate-half pairs, on centered coordinates
            ``2 (t + 0.5) / size - 1`` of the attention extent with DINOv3's periods (``coords="centered"``)
EVA-02      absolute embedding (the 16 x 16 pretraining grid, bicubic-resized to the grid as EVA-02's own detector
            does: the abs-win bug; ``paper`` tiles it instead) plus axial RoPE, base 10000, interleaved pairs, y then
            x, on positions rescaled into the 16 x 16 pretraining grid (``coords="normalized"``)
RoPE-ViT    axial RoPE, base 100, x then y, on integer positions that extrapolate (``original``), or the learned
            mixed frequencies per block and head (``mixed``); ``*_ape`` add the absolute embedding of 224 px
==========  ==================================================================================================

Window blocks see their window as the attention extent (window-local coordinates): every window gets the positions
one pretraining image of the window's size had (EVA-02: the whole pretraining grid; DINOv3: [-1, 1]).

Two choices hold for every family (the importers in ``winpos.checkpoints.adapters`` say them with each key):

- **Prefix tokens are dropped on import.** A window block has no place for a token outside the grid, so the cls
  token (as detectron2 drops MAE's) and DINOv3's four storage tokens do not load; the patch tokens stop attending
  to them. Dropping the storage tokens changes the trunk's features and is reported as a loss.
- **Patch 14 becomes stride 16.** detectron2's simple feature pyramid builds strides 4-32 from a stride-16 map, so
  EVA-02's 14 px kernel is resampled to 16 px on import (``convert.resample_patch_kernel``); its pretraining grid
  (16 x 16 at 224 px) is then the grid of a 256 px image (``pretrain_img_size=256``), which the RoPE reference grid
  and the absolute embedding keep. A ``patch_size=14`` ViTDet (``create(..., patch_size=14)``) runs the original
  stride for parity checks.
"""
from __future__ import annotations

from winpos.backbones.registry import register_family
from winpos.backbones.vitdet import ViTDet

__all__ = ["FAMILIES"]

_B_GLOBAL, _L_GLOBAL = (2, 5, 8, 11), (5, 11, 17, 23)


def _rope(**options) -> dict:
    return {"kind": "rope", "rope": {"fraction": 1.0, **options}}


def _blocks(rope: dict, pos_embed: str = "none") -> dict:
    return dict(pos_embed=pos_embed, window_pos=rope, global_pos=rope)


def _sizes(prefix: str, common: dict, sizes: dict) -> dict:
    return {f"{prefix}_{name}": {**common, **size} for name, size in sizes.items()}


_S = dict(embed_dim=384, depth=12, num_heads=6, global_blocks=_B_GLOBAL, drop_path_rate=0.1)
_B = dict(embed_dim=768, depth=12, num_heads=12, global_blocks=_B_GLOBAL, drop_path_rate=0.1)
_L = dict(embed_dim=1024, depth=24, num_heads=16, global_blocks=_L_GLOBAL, drop_path_rate=0.4)
_T = dict(embed_dim=192, depth=12, num_heads=3, global_blocks=_B_GLOBAL, drop_path_rate=0.1)

DINOV3_ROPE = _rope(kind="axial", base=100.0, pairing="half", axis_order="yx", coords="centered")
DINOV3 = (
    _sizes("vitdet_dinov3", dict(norm_eps=1e-5, layer_scale_init=1e-5, qkv_bias=False, block={"k_bias": False},
                                 window_size=14, pretrain_img_size=224), {
        "t": dict(_T, qkv_bias=True), "s": _S, "splus": dict(_S, block={"k_bias": False, "mlp": "swiglu"}),
        "b": _B, "l": _L}),
    {"original": _blocks(DINOV3_ROPE)},
)

EVA02_ROPE = _rope(kind="axial", base=10000.0, pairing="interleaved", axis_order="yx", coords="normalized",
                   ref_hw=(16, 16))
_SWIGLU, _SWIGLU_LN = {"mlp": "swiglu", "k_bias": False}, {"mlp": "swiglu", "mlp_norm": True, "k_bias": False}
EVA02 = (
    _sizes("vitdet_eva02", dict(mlp_ratio=4 * 2 / 3, norm_eps=1e-6, qkv_bias=True, window_size=16,
                                pretrain_img_size=256, pretrain_use_cls_token=False), {
        "t": dict(_T, block=_SWIGLU), "s": dict(_S, block=_SWIGLU), "b": dict(_B, block=_SWIGLU_LN),
        "l": dict(_L, block=_SWIGLU_LN)}),
    {"original": _blocks(EVA02_ROPE, "abs"), "paper": _blocks(EVA02_ROPE, "abswin")},
)

ROPE_VIT_AXIAL = _rope(kind="axial", base=100.0, pairing="interleaved", axis_order="xy", coords="integer")
ROPE_VIT_MIXED = _rope(kind="mixed", shared_heads=False, mixed_init_base=10.0, pairing="interleaved",
                       axis_order="xy", coords="integer")
ROPE_VIT = (
    _sizes("vitdet_ropevit", dict(norm_eps=1e-6, layer_scale_init=1e-5, qkv_bias=True, window_size=14,
                                  pretrain_img_size=224, pretrain_use_cls_token=False), {"s": _S, "b": _B, "l": _L}),
    {"original": _blocks(ROPE_VIT_AXIAL), "mixed": _blocks(ROPE_VIT_MIXED),
     "axial_ape": _blocks(ROPE_VIT_AXIAL, "abs"), "mixed_ape": _blocks(ROPE_VIT_MIXED, "abs")},
)

FAMILIES = {"ViTDet-DINOv3": DINOV3, "ViTDet-EVA02": EVA02, "ViTDet-RoPE-ViT": ROPE_VIT}
for _family, (_sizes_table, _recipes) in FAMILIES.items():
    register_family(ViTDet, _family, _sizes_table, _recipes)
