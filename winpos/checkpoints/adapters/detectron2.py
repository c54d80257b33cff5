"""detectron2 ViTDet (``backbone.net.`` prefix optional; ``.pkl`` of numpy arrays or ``.pth``).

The trunk has winpos's names; ``pos_embed (1, 1+N, C)`` is flat with a cls row (pretrained 224 px: 14x14). Keys
outside ``backbone.net.`` (pyramid, RPN, ROI heads, pixel statistics) are reported and ignored.
"""
from __future__ import annotations

from winpos.checkpoints.adapters._common import flat_abs, strip_prefix
from winpos.checkpoints.convert import Adapted

PREFIX = "backbone.net."


def adapt(state_dict: dict) -> Adapted:
    a = Adapted("detectron2")
    names = strip_prefix(a, state_dict, PREFIX, "detector part outside the ViT trunk (pyramid, RPN, ROI heads, "
                                               "pixel statistics)")
    for name, key in names.items():
        value = state_dict[key]
        if name == "pos_embed":
            a.position = flat_abs(key, value)
        else:
            a.trunk[name] = (key, value)
    return a
