"""The weights of the LookHere authors' ViT-B (``{"weights": ..., "config": ...}``; the config decides how the target
is built, see ``winpos.checkpoints.lookhere``).

Block and patch-embedding tensors keep their names; the cls token and the (deleted) position embedding, the
final norm and the classifier head are reported and ignored.
"""
from __future__ import annotations

import torch

from winpos.checkpoints.convert import Adapted

DROPPED = {
    "cls_token": "ViTDet has no cls token (in the authors' model every patch also attends to it, unbiased)",
    "pos_embed": "a LookHere model adds no position embedding (the authors' LookHere deletes it)",
}


def adapt(state_dict: dict) -> Adapted:
    a = Adapted("lookhere")
    weights = state_dict.get("weights", state_dict) if isinstance(state_dict.get("weights"), dict) else state_dict
    for key, value in weights.items():
        if not isinstance(value, torch.Tensor):
            a.ignore(str(key), f"not a tensor ({type(value).__name__})", known=False)
        elif key in DROPPED:
            a.ignore(key, DROPPED[key])
        elif key.startswith("norm."):
            a.ignore(key, "final norm before the classifier; ViTDet's trunk ends at the last block")
        elif key.startswith("head."):
            a.ignore(key, "classifier head")
        else:
            a.trunk[key] = (key, value)
    return a
