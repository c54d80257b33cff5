"""DINOv3 (Meta's layout and timm's ``vit_*_patch16_dinov3``).

Blocks as ``_common.rope_vit_blocks`` reads them (LayerScale ``ls1.gamma`` / timm ``gamma_1``; a fused ``qkv`` with
Meta's masked key bias ``qkv.bias`` * ``qkv.bias_mask`` or timm's ``q_bias`` / ``v_bias``; SwiGLU ``w1`` / ``w2`` /
``w3`` in S+ and H+). The file has no position embedding: DINOv3 rotates q and k (axial RoPE, base 100, on centered
coordinates in [-1, 1]); its ``periods`` buffer is computed, not loaded. The cls token is dropped like MAE's; the
four storage (register) tokens are dropped too and reported as lost (see ``_common.REGISTER_TOKENS``).
"""
from __future__ import annotations

from winpos.checkpoints.adapters._common import (FINAL_NORM, REGISTER_TOKENS, rope_vit_blocks, rope_vit_top_level,
                                                 split_blocks)
from winpos.checkpoints.convert import Adapted


def adapt(state_dict: dict) -> Adapted:
    a = Adapted("dinov3")
    blocks, others = split_blocks(state_dict)
    for name, key in others.items():
        if name in ("storage_tokens", "reg_token"):
            a.ignore(key, REGISTER_TOKENS, lost=state_dict[key].numel() > 0)  # (1, 0, C): a model without any
        elif name == "mask_token":
            a.ignore(key, "masked-token embedding of pretraining")
        elif name.startswith("local_cls_norm."):
            a.ignore(key, FINAL_NORM)
        elif name.startswith("projectors."):
            a.ignore(key, "distillation head")
        elif name.startswith("rope_embed.") or name.endswith(".periods"):
            a.ignore(key, "fixed RoPE periods (base 100), computed by winpos's RoPE")
        else:
            rope_vit_top_level(a, name, key, state_dict[key], "DINOv3")
    rope_vit_blocks(a, blocks)
    return a
