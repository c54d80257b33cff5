"""winpos's own HieraDet / ViTDet files, backbone-only (``load_external`` finds the trunk inside a whole detector).

Every ``pos_embed`` choice converts into every other: ``pos_embed.pos_embed`` (flat, with a cls row for a ViTDet
built with ``pretrain_use_cls_token``) or ``pos_embed.global_embed`` + ``pos_embed.window_embed``; a file without
either had ``pos_embed="none"``. All other tensors keep their names.
"""
from __future__ import annotations

from winpos.checkpoints.adapters._common import abswin_pair, flat_abs
from winpos.checkpoints.convert import Adapted

_POS = {"pos_embed.global_embed": "global", "pos_embed.window_embed": "window"}


def adapt(state_dict: dict) -> Adapted:
    a = Adapted("winpos")
    pair = {}
    for key, value in state_dict.items():
        if key == "pos_embed.pos_embed":
            a.position = flat_abs(key, value)
        elif key in _POS:
            pair[_POS[key]] = (key, value)
        else:
            a.trunk[key] = (key, value)
    if pair:
        a.position = abswin_pair(pair, antialias=False)
    return a


_FOREIGN_PREFIXES = ("image_encoder.trunk.", "image_encoder.")  # SAM2 / SAM containers, read by their adapters


def trunk_prefix(flat: dict, vit: bool = False) -> str:
    """The key prefix of a winpos backbone inside a whole-detector checkpoint (``backbone.net.`` for HieraDet,
    ``backbone.net.net.`` for ViTDet), or ``""`` when the trunk is at the top level or the file is not winpos's.
    ``vit``: the target is a ViTDet, so ``backbone.net.`` with a flat ``pos_embed`` is detectron2's layout."""
    if "patch_embed.proj.weight" in flat:
        return ""
    prefixes = {k[:-len("patch_embed.proj.weight")] for k in flat if k.endswith(".patch_embed.proj.weight")}
    if len(prefixes) != 1:
        return ""
    (prefix,) = prefixes
    if prefix in _FOREIGN_PREFIXES:
        return ""
    if vit and not any(k.startswith(prefix + "pos_embed.") for k in flat) and prefix == "backbone.net.":
        return ""  # detectron2's ViTDet names (flat backbone.net.pos_embed): the detectron2 adapter reads them
    return prefix
