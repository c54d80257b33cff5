"""Official Hiera (``{"model_state": ...}``) and timm's plain Hiera: a flat ``pos_embed (1, N, C)`` in row-major order.

Hiera computes in an *unrolled* token order, but no parameter depends on it: the weights load unchanged, and
HieraDet's features equal Hiera's intermediates after ``Reroll``. The classifier head, the final norm and an MAE
decoder are reported and ignored. Video checkpoints (``pos_embed_spatial``, 3D patch embedding) are refused:
HieraDet is an image backbone.
"""
from __future__ import annotations

from winpos.checkpoints.adapters._common import flat_abs
from winpos.checkpoints.convert import Adapted
from winpos.errors import WinposError


def refuse_video(state_dict: dict) -> None:
    if "pos_embed_spatial" in state_dict or getattr(state_dict.get("patch_embed.proj.weight"), "ndim", 4) == 5:
        raise WinposError("this is a video Hiera checkpoint (sep_pos_embed / 3D patch embedding); HieraDet is an "
                          "image backbone: use an image checkpoint such as hiera_base_224")


def adapt(state_dict: dict) -> Adapted:
    refuse_video(state_dict)
    a = Adapted("hiera")
    for key, value in state_dict.items():
        if key == "pos_embed":
            a.position = flat_abs(key, value, has_cls=False)
        elif key.startswith(("patch_embed.", "blocks.")):
            a.trunk[key] = (key, value)
        else:
            a.ignore(key, "not part of the HieraDet trunk (classifier head, final norm or MAE decoder)")
    return a
