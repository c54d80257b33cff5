"""ViTDet presets for DINOv2 (Oquab et al., 2023; Darcet et al., 2024 for the register variants): a plain ViT with
LayerScale and a learned absolute embedding, trained at 518 px with patch 14 (a 37 x 37 grid).

The trunk is detectron2's ViTDet with DINOv2's block (LayerScale, ``norm_eps=1e-6``, query / key / value biases)
at S, B and L (width 384 / 768 / 1024, 12 / 12 / 24 blocks) and g (width 1536, 40 blocks, 24 heads, a SwiGLU MLP
of hidden width 4096 whose packed ``fc1`` holds the gate rows first, as Meta's ``w12`` and timm's ``SwiGLUPacked``;
global attention in blocks 9, 19, 29 and 39, every tenth as ViTDet-H's every eighth of 32). The four recipes are ViTDet's own
(``winpos.backbones.vitdet.RECIPES``): ``original`` interpolates the absolute embedding to the grid under window
attention (what a detector built from DINOv2 does: the abs-win bug), ``paper`` tiles it as the abs-win window
embedding with an interpolated global part (37 x 37, ``pos_global_size=37``, so that the import is exact), ``rope``
and ``lookhere`` replace it. Relpos tables, where a recipe has
them, start at zero (DINOv2 has none), as detectron2 starts them from MAE.

As for EVA-02 (``winpos.backbones.rope_vits``), patch 14 becomes stride 16 on import (the kernel resampled by
``winpos.checkpoints.convert.resample_patch_kernel``: detectron2's simple feature pyramid builds strides 4-32 from a
stride-16 map), so the 37 x 37 pretraining grid is the grid of a 592 px image (``pretrain_img_size=592``); a
``patch_size=14`` ViTDet (``create(..., patch_size=14, pretrain_img_size=518)``) runs the original stride. The cls
token and the register tokens of the ``*_reg`` checkpoints do not load (a window block has no place for a token
outside the grid); dropping the registers changes the trunk's features and is reported as a loss.
"""
from __future__ import annotations

from winpos.backbones.registry import register_family
from winpos.backbones.vitdet import RECIPES, ViTDet

__all__ = ["SIZES"]

_COMMON = dict(norm_eps=1e-6, layer_scale_init=1e-5, qkv_bias=True, window_size=14, pretrain_img_size=592,
               pretrain_use_cls_token=True, pos_global_size=37)
SIZES = {
    "vitdet_dinov2_s": dict(_COMMON, embed_dim=384, depth=12, num_heads=6, global_blocks=(2, 5, 8, 11),
                            drop_path_rate=0.1),
    "vitdet_dinov2_b": dict(_COMMON, embed_dim=768, depth=12, num_heads=12, global_blocks=(2, 5, 8, 11),
                            drop_path_rate=0.1),
    "vitdet_dinov2_l": dict(_COMMON, embed_dim=1024, depth=24, num_heads=16, global_blocks=(5, 11, 17, 23),
                            drop_path_rate=0.4),
    "vitdet_dinov2_g": dict(_COMMON, embed_dim=1536, depth=40, num_heads=24, global_blocks=(9, 19, 29, 39),
                            block={"mlp": "swiglu", "mlp_hidden": 4096}, drop_path_rate=0.5),
}

register_family(ViTDet, "ViTDet-DINOv2", SIZES, RECIPES, docs={
    name: f"DINOv2 ViT-{name[-1].upper()}/14 as a stride-16 ViTDet (LayerScale; the 37 x 37 pretraining grid at 592 px)"
    for name in SIZES})
