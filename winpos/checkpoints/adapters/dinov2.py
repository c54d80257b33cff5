"""DINOv2 (Meta's layout, timm's ``vit_*_patch14[_reg4]_dinov2``): LayerScale blocks and a learned absolute embedding.

``pos_embed`` is the 37 x 37 grid of 518 px pretraining, behind a cls row in Meta's files (``(1, 1 + 1369, C)``) and
without one in timm's (``(1, 1369, C)``); it is handed over as an absolute embedding (``abs``, or split exactly into
an abs-win target's window and global parts). Blocks as ``_common.rope_vit_blocks`` reads them (``ls1.gamma`` /
``ls2.gamma``, a fused ``qkv``, ``mlp.fc1`` / ``fc2``). The cls token and the mask token of pretraining are dropped;
register tokens (``register_tokens``, timm's ``reg_token``) are dropped too and reported as lost.
"""
from __future__ import annotations

from winpos.checkpoints.adapters._common import (REGISTER_TOKENS, flat_abs, rope_vit_blocks, rope_vit_top_level,
                                                 split_blocks)
from winpos.checkpoints.convert import Adapted


def adapt(state_dict: dict) -> Adapted:
    a = Adapted("dinov2")
    blocks, others = split_blocks(state_dict)
    for name, key in others.items():
        value = state_dict[key]
        if name in ("register_tokens", "reg_token"):
            a.ignore(key, REGISTER_TOKENS, lost=value.numel() > 0)
        elif name == "mask_token":
            a.ignore(key, "masked-token embedding of pretraining")
        elif name == "pos_embed":
            a.position = flat_abs(key, value)
        else:  # cls token, final norms, classifier, patch embedding: as the RoPE families' files
            rope_vit_top_level(a, name, key, value, "DINOv2")
    rope_vit_blocks(a, blocks)
    return a
