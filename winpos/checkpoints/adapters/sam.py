"""segment-anything ``ImageEncoderViT`` (``image_encoder.`` prefix optional).

``pos_embed (1, 64, 64, C)`` is stored NHWC (row-major once flattened); ``mlp.lin1/lin2`` are winpos
``mlp.fc1/fc2``. The neck, the prompt encoder and the mask decoder are reported and ignored.
"""
from __future__ import annotations

from winpos.checkpoints.adapters._common import strip_prefix
from winpos.checkpoints.convert import Adapted, Position, shape_error

PREFIX = "image_encoder."


def adapt(state_dict: dict) -> Adapted:
    a = Adapted("sam")
    names = strip_prefix(a, state_dict, PREFIX, "SAM prompt encoder / mask decoder, not part of the image encoder")
    for name, key in names.items():
        value = state_dict[key]
        if name.startswith("neck."):
            a.ignore(key, "SAM neck (the detector's own pyramid replaces it)")
        elif name == "pos_embed":
            if value.dim() != 4 or value.shape[0] != 1:
                raise shape_error(f"'{key}'", ("1", "h", "w", "C"), value.shape, "SAM stores pos_embed NHWC")
            a.position = Position("abs", grid=value.permute(0, 3, 1, 2), grid_key=key, stored_shape=tuple(value.shape),
                                  layout="NHWC")
        else:
            a.trunk[name.replace(".mlp.lin1.", ".mlp.fc1.").replace(".mlp.lin2.", ".mlp.fc2.")] = (key, value)
    return a
