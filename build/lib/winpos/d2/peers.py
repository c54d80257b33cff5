"""detectron2's own models, built for comparison (``winpos.bench.peers`` times them next to winpos's): the one place
a benchmark reaches detectron2's model code, so detectron2 stays imported only under ``winpos.d2``."""
from __future__ import annotations

from functools import partial

import torch.nn as nn


def detectron2_vit_b(img_size=1024, use_rel_pos=True):
    """detectron2's ViT-B backbone as its ViTDet-B config builds it (window 14, global blocks 2/5/8/11,
    relpos in every block when ``use_rel_pos``), with its own random init."""
    from detectron2.modeling.backbone.vit import ViT

    return ViT(img_size=img_size, patch_size=16, embed_dim=768, depth=12, num_heads=12, drop_path_rate=0.0,
               window_size=14, mlp_ratio=4, qkv_bias=True, norm_layer=partial(nn.LayerNorm, eps=1e-6),
               window_block_indexes=[0, 1, 3, 4, 6, 7, 9, 10], residual_block_indexes=[], use_rel_pos=use_rel_pos,
               out_feature="last_feat")
