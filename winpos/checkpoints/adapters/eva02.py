"""EVA-02 (the authors' MIM checkpoints, their detection checkpoints under ``backbone.net.``, and timm's
``eva02_*_patch14_*``).

Blocks as ``_common.rope_vit_blocks`` reads them: q / k / v (separate in B / L, fused in T / S) with a query and a
value bias and no key bias -> ``attn.qkv``; SwiGLU ``w12`` (T / S, packed) or ``w1`` / ``w2`` / ``ffn_ln`` / ``w3``
(B / L, with a sub-LN) -> ``mlp.fc1`` / ``mlp.norm`` / ``mlp.fc2``. ``pos_embed (1, 1+N, C)`` is the absolute
embedding on the pretraining grid (16 x 16 at 224 px with patch 14). The RoPE tables (``rope.freqs_cos`` / ``sin``)
are buffers winpos computes; the cls token is dropped like MAE's; the MIM head, mask token and final norm are
reported and ignored.
"""
from __future__ import annotations

from winpos.checkpoints.adapters._common import flat_abs, rope_vit_blocks, rope_vit_top_level, split_blocks
from winpos.checkpoints.convert import Adapted

PREFIX = "backbone.net."


def adapt(state_dict: dict) -> Adapted:
    a = Adapted("eva02")
    prefix = PREFIX if any(k.startswith(PREFIX) for k in state_dict) else ""
    if prefix:
        a.prefix = prefix
        for k in state_dict:
            if not k.startswith(prefix):
                a.ignore(k, "detector part outside the ViT trunk (pyramid, RPN, ROI heads)")
    blocks, others = split_blocks(state_dict, prefix)
    for name, key in others.items():
        if name == "pos_embed":
            a.position = flat_abs(key, state_dict[key])
        elif name == "mask_token" or name.startswith("lm_head."):
            a.ignore(key, "masked-image-modeling token / head of pretraining")
        elif name.startswith(("rope.", "rope_win.", "rope_glb.")):  # MIM; the detector's window / global tables
            a.ignore(key, "fixed RoPE table, computed by winpos's RoPE")
        else:
            rope_vit_top_level(a, name, key, state_dict[key], "EVA-02")
    rope_vit_blocks(a, blocks)
    return a
