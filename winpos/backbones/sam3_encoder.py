"""ViTDet presets for SAM3's image encoder (Meta, 2025): a windowed ViT-L/14 that already has both of this project's
ideas, built as the one ``ViTDet`` with SAM3's own settings as its ``original`` recipe.

SAM3's encoder (``sam3.model.vitdet.ViT`` as SAM3's model builder makes it) at its own size, 1008 px:

- patch 14 without a bias, 72 x 72 tokens; 32 blocks of width 1024, 16 heads, MLP ratio 4.625, LayerNorm eps
  1e-5, a LayerNorm after the token embedding (``ln_pre``) and none at the end; no LayerScale;
- 24 x 24 windows in every block but 7, 15, 23 and 31, which attend globally;
- its absolute embedding (24 x 24, the 336 px pretraining grid, plus a cls row it never uses) is **tiled** over the
  grid instead of interpolated (``tile_abs_pos``: the abs-win fix without a global part). Here it is the abs-win
  window embedding (``pos_embed="abswin"``, window 24) with a zero global embedding, which equals SAM3's tiling at
  any size and leaves a global embedding to learn in finetuning;
- axial RoPE on every head dim (base 10000, interleaved pairs, x then y) whose positions are **rescaled into the
  24 x 24 window** (``use_interp_rope`` with ``rope_pt_size`` = the window): window blocks see window-local
  positions 0..23, global blocks see ``t * 24 / 72`` at 1008 px (``coords="normalized"``, ``ref_hw=(24, 24)``).

SAM3 fixes its RoPE tables at build, so its encoder runs only at the size it was built for; winpos computes them per
grid, so one model runs at any multiple of 14 px (a grid the windows do not tile is padded, as SAM3 pads).
``tests/checkpoints/test_sam3_encoder.py`` proves the equality against ``sam3.model.vitdet.ViT``.

Patch 14 stays stride 14 here (the checkpoint's own kernel, no resampling), as SAM3's own detector keeps it: images
are multiples of 14 px (1008 = 72 x 14), and anything else is refused, never cropped.
"""
from __future__ import annotations

from winpos.backbones.registry import register_family
from winpos.backbones.vitdet import ViTDet

__all__ = ["SAM3_ROPE", "SIZES", "RECIPES"]

SAM3_ROPE = {"kind": "rope", "rope": {"kind": "axial", "fraction": 1.0, "base": 10000.0, "pairing": "interleaved",
                                      "axis_order": "xy", "coords": "normalized", "ref_hw": (24, 24)}}
"""SAM3's RoPE: positions of every block rescaled into the 24 x 24 window (window blocks: 0..23 as they are)."""

_ENCODER = dict(patch_size=14, img_size=1008, pretrain_img_size=336, pretrain_use_cls_token=True, window_size=24,
                mlp_ratio=4.625, norm_eps=1e-5, qkv_bias=True, ln_pre=True, patch_bias=False, pos_global_size=14)

SIZES = {
    "vitdet_sam3": dict(_ENCODER, embed_dim=1024, depth=32, num_heads=16, global_blocks=(7, 15, 23, 31),
                        drop_path_rate=0.1),
    # The same block kinds at CPU size (head dim 64 as in SAM3): tests and quick experiments.
    "vitdet_sam3_toy": dict(_ENCODER, embed_dim=128, depth=4, num_heads=2, global_blocks=(1, 3), drop_path_rate=0.0),
}

RECIPES = {
    "original": dict(pos_embed="abswin", window_pos=SAM3_ROPE, global_pos=SAM3_ROPE),
}

register_family(ViTDet, "ViTDet-SAM3", SIZES, RECIPES, docs={
    "vitdet_sam3": "SAM3's image encoder (ViT-L/14, 1008 px, 24 px windows, tiled abs + interpolated RoPE)",
    "vitdet_sam3_toy": "SAM3's encoder settings at CPU size (width 128, 4 blocks, 2 heads of 64)",
})
