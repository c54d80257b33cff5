"""The position encodings winpos implements, each a plain ``nn.Module`` or function on the token grid.

Modules:

    coords              token coordinates on query and key grids (where pooled queries sit)
    interp              naive absolute-embedding interpolation: the behaviour that shows the window bug
    abswin              absolute-win (Bolya et al., ICLR 2024): a tiled window embedding plus a global one
    rope                2D rotary position embedding for vision tokens, applied to q and k
    relpos              decomposed relative position bias (MViTv2 / ViTDet / SAM semantics)
    lookhere            LookHere (Fuller et al., NeurIPS 2024): per-head fields of view and distance penalties
    lookhere_layouts    LookHere head layouts and slopes
"""
