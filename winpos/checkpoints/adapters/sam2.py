"""SAM2 / SAM2.1 checkpoints (``{"model": {"image_encoder.trunk.*": ...}}``) or a bare sam2 ``Hiera`` trunk.

``pos_embed (1, C, gh, gw)`` + ``pos_embed_window (1, C, 8, 8)`` are abs-win (resized without antialias);
MLPs are ``mlp.layers.0/1`` (winpos ``mlp.fc1/fc2``); the rest of the model (neck, prompt encoder, mask decoder,
memory) is reported and ignored.
"""
from __future__ import annotations

from winpos.checkpoints.adapters._common import abswin_pair, strip_prefix
from winpos.checkpoints.convert import Adapted

PREFIX = "image_encoder.trunk."
_POS = {"pos_embed": "global", "pos_embed_window": "window"}


def adapt(state_dict: dict) -> Adapted:
    a = Adapted("sam2")
    names = strip_prefix(a, state_dict, PREFIX, "outside the image-encoder trunk (neck, prompt encoder, mask "
                                               "decoder, memory)")
    pos = {}
    for name, key in names.items():
        if name in _POS:
            pos[_POS[name]] = (key, state_dict[key])
        elif name.startswith(("patch_embed.", "blocks.")):
            a.trunk[name.replace(".mlp.layers.0.", ".mlp.fc1.").replace(".mlp.layers.1.", ".mlp.fc2.")] = \
                (key, state_dict[key])
        else:
            a.ignore(key, "not part of the HieraDet trunk (classifier head or final norm)")
    a.position = abswin_pair(pos, antialias=False) if pos else None
    return a
