# detectron2's ViTDet optimizer (its projects/ViTDet COCO configs, B and L): AdamW, lr 1e-4, betas (0.9, 0.999),
# weight decay 0.1 on every parameter except torch's norm layers (0) and the token embedding (`pos_embed`: 0);
# relpos tables and the pyramid / head LayerNorms (detectron2's `layers.LayerNorm`) take 0.1 as there. Layer-wise
# lr decay is set per size (`lr_decay_rate`: ViTDet-B 0.7, L 0.8, H 0.9).
# Every position recipe (original, paper, rope, lookhere) trains with this one rule, so comparing recipes compares
# position encodings only. The one exemption detectron2 has no counterpart for: learned RoPE frequencies (`rope`,
# present only when a rope recipe learns them) take no weight decay either (winpos's choice, unverified).
# tests/d2/test_optim_parity.py checks the groups parameter by parameter against detectron2's own functions.
import torch

from detectron2.config import LazyCall as L

from winpos.d2.optim import get_optimizer_params

# params.model is set to the model by the trainer before instantiation.
AdamW = L(torch.optim.AdamW)(
    params=L(get_optimizer_params)(
        base_lr="${..lr}",
        weight_decay_norm=0.0,
        lr_decay_rate=1.0,
        overrides={"pos_embed": {"weight_decay": 0.0}, "rope": {"weight_decay": 0.0}},
    ),
    lr=1e-4,
    betas=(0.9, 0.999),
    weight_decay=0.1,
)
