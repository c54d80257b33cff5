import torch

from detectron2.config import LazyCall as L

from winpos.d2.optim import get_optimizer_params

# params.model is set to the model by the trainer before instantiation.
AdamW = L(torch.optim.AdamW)(
    params=L(get_optimizer_params)(
        base_lr="${..lr}",
        weight_decay_norm=0.0,  # and every position parameter (pos_embed, rel_pos, rope): always 0
        lr_decay_rate=1.0,  # layer-wise lr decay (ViTDet-B 0.7, L 0.8, H 0.9)
    ),
    lr=1e-4,
    betas=(0.9, 0.999),
    weight_decay=0.1,
)
