"""RoPE-ViT (Heo et al., naver-ai ``rope_{axial,mixed}[_ape]_deit_*_patch16_LS``, and timm's
``vit_*_patch16_rope[_mixed][_ape]_224``).

DeiT-III blocks (LayerScale ``gamma_1`` / ``gamma_2``, ``attn.qkv`` with bias). The mixed variants learn one
frequency vector pair per block and head: the authors store ``freqs (2, depth, heads * D/2)``, timm ``rope.freqs
(2, depth, heads, D/2)``, both as ``(f_x, f_y)``; winpos keeps them per block as ``blocks.N.attn.rope.freqs (2,
heads, D/2)`` in ``(f_y, f_x)`` order (the convert step lays the authors' flat heads out on the target's heads).
The ``_ape`` variants add ``pos_embed (1, N, C)`` (no cls row); the coordinate buffers ``freqs_t_x`` / ``freqs_t_y``
are computed, not loaded; the cls token is dropped like MAE's.
"""
from __future__ import annotations

from winpos.checkpoints.adapters._common import flat_abs, rope_vit_blocks, rope_vit_top_level, split_blocks
from winpos.checkpoints.convert import Adapted


def adapt(state_dict: dict) -> Adapted:
    a = Adapted("rope_vit")
    blocks, others = split_blocks(state_dict)
    for name, key in others.items():
        value = state_dict[key]
        if name == "pos_embed":
            a.position = flat_abs(key, value, has_cls=False)
        elif name in ("freqs", "rope.freqs"):
            for i in range(value.shape[1]):
                a.trunk[f"blocks.{i}.attn.rope.freqs"] = (key, value[:, i].flip(0))  # (f_x, f_y) -> (f_y, f_x)
        elif name in ("freqs_t_x", "freqs_t_y"):
            a.ignore(key, "token coordinate buffer, computed by winpos's RoPE")
        else:
            rope_vit_top_level(a, name, key, value, "RoPE-ViT")
    rope_vit_blocks(a, blocks)
    return a
