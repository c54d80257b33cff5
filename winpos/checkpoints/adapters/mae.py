"""MAE / timm-style ViT encoders (``{"model": ...}`` optional).

``pos_embed (1, 1+N, C)`` is the sin-cos (or learned) grid behind a cls row; ``cls_token``, the final ``norm`` /
``fc_norm``, a classifier ``head`` and the MAE decoder are reported and ignored. Relpos tables are then missing
(zero init, as detectron2 starts from MAE).
"""
from __future__ import annotations

from winpos.checkpoints.adapters._common import flat_abs
from winpos.checkpoints.convert import Adapted


def adapt(state_dict: dict) -> Adapted:
    a = Adapted("mae")
    for key, value in state_dict.items():
        if key == "cls_token":
            a.ignore(key, "ViTDet uses no cls token")
        elif key.startswith(("norm.", "fc_norm.")):
            a.ignore(key, "final norm of the pretraining encoder; ViTDet's trunk ends at the last block")
        elif key.startswith("head."):
            a.ignore(key, "classifier head")
        elif key.startswith(("decoder", "mask_token")):
            a.ignore(key, "MAE decoder")
        elif key == "pos_embed":
            a.position = flat_abs(key, value)
        else:
            a.trunk[key] = (key, value)
    return a
