"""SAM3's image encoder (``sam3.model.vitdet.ViT``), bare or inside a whole SAM3 checkpoint
(``detector.backbone.vision_backbone.trunk.``; the prefix is found by ``formats.sam3_trunk``).

The blocks already have ViTDet's names (``norm1``, ``attn.qkv``, ``attn.proj``, ``norm2``, ``mlp.fc1/fc2``) and
``ln_pre`` is ViTDet's ``ln_pre``. ``pos_embed (1, 1 + 24*24, C)`` is the 336 px pretraining grid behind a cls row
that SAM3 never adds (``retain_cls_token=False``); SAM3 tiles the grid over the image, so it is handed over as an
absolute embedding that a ``pos_embed="abswin"`` target with window 24 takes exactly as its window embedding (the
global embedding starts at zero). Each block's ``attn.freqs_cis`` is the RoPE table of the size SAM3 was built for:
winpos computes it per grid. The neck, the text encoder, the decoders and the tracker are reported and ignored.
"""
from __future__ import annotations

from winpos.checkpoints.adapters._common import FINAL_NORM, flat_abs
from winpos.checkpoints.convert import Adapted
from winpos.checkpoints.formats import sam3_trunk

OUTSIDE = "SAM3 outside its image encoder (neck, text encoder, decoders, tracker)"


def adapt(state_dict: dict) -> Adapted:
    a = Adapted("sam3")
    prefix = sam3_trunk(state_dict) or ""
    a.prefix = prefix
    for key, value in state_dict.items():
        if not key.startswith(prefix):
            a.ignore(key, OUTSIDE)
            continue
        name = key[len(prefix):]
        if name == "pos_embed":
            a.position = flat_abs(key, value, has_cls=None)
        elif name.endswith(".attn.freqs_cis"):
            a.ignore(key, "RoPE table fixed at SAM3's build size (base 10000): winpos computes it for each grid")
        elif name == "class_embedding":
            a.ignore(key, "cls token of a global-only SAM3 ViT: ViTDet keeps no cls token")
        elif name.startswith("ln_post."):
            a.ignore(key, FINAL_NORM)
        elif name.startswith(("blocks.", "patch_embed.", "ln_pre.")):
            a.trunk[name] = (key, value)
        else:
            a.ignore(key, OUTSIDE, known=False)
    return a
