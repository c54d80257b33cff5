"""The position encodings winpos implements, each a plain ``nn.Module`` or function on the token grid; their main
names are importable from here (``__all__``).

Modules:

    coords              token coordinates on query and key grids (where pooled queries sit)
    interp              naive absolute-embedding interpolation: the behaviour that shows the window bug
    abswin              absolute-win (Bolya et al., ICLR 2024): a tiled window embedding plus a global one
    rope                2D rotary position embedding for vision tokens, applied to q and k
    relpos              decomposed relative position bias (MViTv2 / ViTDet / SAM semantics)
    lookhere            LookHere (Fuller et al., NeurIPS 2024): per-head fields of view and distance penalties
    lookhere_layouts    LookHere head layouts and slopes
"""
from winpos.posemb.abswin import AbsPosEmbed, AbsWinPosEmbed, abs_to_abswin, abswin_embedding, tile_to_grid
from winpos.posemb.coords import query_key_coords
from winpos.posemb.interp import interpolate_abs, resample_flat, resize_grid, split_flat_embedding
from winpos.posemb.lookhere import LookHere
from winpos.posemb.lookhere_layouts import head_names, head_slopes
from winpos.posemb.relpos import RelPosTables, rel_bias_dense, rel_terms, resample_rel_table
from winpos.posemb.rope import RoPE, RopeTables, apply_rope, rope_on_grid

__all__ = [
    "AbsPosEmbed", "AbsWinPosEmbed", "abs_to_abswin", "abswin_embedding", "tile_to_grid", "query_key_coords",
    "interpolate_abs", "resample_flat", "resize_grid", "split_flat_embedding", "LookHere", "head_names",
    "head_slopes", "RelPosTables", "rel_bias_dense", "rel_terms", "resample_rel_table", "RoPE",
    "RopeTables", "apply_rope", "rope_on_grid",
]
