"""timm ``hiera_*_abswin``: ``pos_embed (1, C, gh, gw)`` + ``pos_embed_win (1, C, 8, 8)`` (resized antialiased)."""
from __future__ import annotations

from winpos.checkpoints.adapters._common import abswin_pair
from winpos.checkpoints.convert import Adapted

_POS = {"pos_embed": "global", "pos_embed_win": "window"}


def adapt(state_dict: dict) -> Adapted:
    a = Adapted("timm_abswin")
    pos = {}
    for key, value in state_dict.items():
        if key in _POS:
            pos[_POS[key]] = (key, value)
        elif key.startswith(("patch_embed.", "blocks.")):
            a.trunk[key] = (key, value)
        else:
            a.ignore(key, "not part of the HieraDet trunk (classifier head or final norm)")
    a.position = abswin_pair(pos, antialias=True) if pos else None
    return a
