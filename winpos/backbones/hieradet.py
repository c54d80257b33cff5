"""HieraDet: the hierarchical Hiera trunk used for detection (SAM2's image-encoder trunk), with every position
encoding of winpos selectable by name.

Tokens stay on the grid as ``(B, H, W, C)``. Four stages; the first block of stages 2-4 max-pools its queries 2x2
inside each window (Hiera q-pooling), doubles the channels and the heads, and pools its shortcut
``MaxPool(Linear(norm1(x)))``. Windows follow SAM2's *lag rule*: a stage's first block still windows its input with
the previous stage's window and writes its pooled output in windows of half that size.

Padding policy (any image size works, e.g. 1000x1000 -> a 250x250 token grid; SAM2 itself fails there because
its window embedding is tiled with floor division):

* the token grid after the stride-4 patch embedding is ``ceil(H/4) x ceil(W/4)``;
* inside a block, ``norm1(x)`` is zero-padded at the bottom/right (``winpos.windows.pad_to_window``) to a
  multiple of the block's window, or of the pooling stride for a global pooling block, *before* queries are
  pooled; in windows, padded tokens are unmasked keys (SAM2 / detectron2 semantics) unless ``pad_mode="mask"``;
  global attention never sees them (a global pooling block pads only so that queries pool with ceil, and masks
  the padded keys);
* a pooling block outputs ``ceil(H/2) x ceil(W/2)`` tokens: attention outputs are cropped to that size and the
  shortcut is max-pooled with ``ceil_mode`` (a border cell takes the max over its valid tokens only).
  Stage ``i`` thus has ``ceil(H / 2**(i+2))`` rows. Where every stage grid is even (any image that is a multiple
  of 32, e.g. SAM2's 1024) this is bit-compatible with SAM2, which floors instead.

Position encodings: ``pos_embed`` is one of ``POS_EMBEDS`` (added once after the patch embedding) and
``window_pos`` / ``global_pos`` are block terms from ``BLOCK_POS`` for window and global blocks. Relpos tables are
sized by the attention extent: the window for window blocks, the block's input grid at ``img_size`` for global
blocks. RoPE and LookHere in pooling blocks place each pooled query at the centre of its 2x2 key cell.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from winpos.backbones.common import (
    LOOKHERE_45, POS_EMBEDS, Attention, DropPath, LayerScale, Mlp, WindowedBackbone, add_attention_branch,
    add_mlp_branch, as_block_position, check_drop_path_rate, check_image, init_weights, make_token_embedding,
    patch_projection,
)
from winpos.backbones.registry import register_family
from winpos.errors import WinposError, as_hw, check_choice
from winpos.windows import PAD_MODES, pad_to_window

Q_STRIDE = 2


@dataclass(frozen=True)
class BlockSpec:
    """One block of the schedule: its stage (0-based), channels, heads, key window (0 = global), pooling."""

    index: int
    stage: int
    dim: int
    dim_out: int
    num_heads: int
    window: int
    q_stride: int


def block_schedule(embed_dim, num_heads, stages, window_spec, global_blocks, dim_mul=2.0, head_mul=2.0):
    """SAM2's block schedule with the lag rule, as a list of ``BlockSpec`` (validated, with fixes in errors)."""
    stages = tuple(stages)
    if len(stages) != 4 or any(not isinstance(d, int) or d < 1 for d in stages):
        raise WinposError(f"stages={stages!r} must be four positive block counts, e.g. (1, 2, 7, 2) for Hiera-T")
    if len(window_spec) != len(stages):
        raise WinposError(f"window_spec={tuple(window_spec)!r} needs one window per stage ({len(stages)}); "
                          "use 0 for a stage that attends globally, e.g. (8, 4, 14, 7)")
    if any(not isinstance(w, int) or w < 0 for w in window_spec):
        raise WinposError(f"window_spec={tuple(window_spec)!r} must hold non-negative ints (0 = global attention)")
    depth = sum(stages)
    bad = [b for b in global_blocks if not 0 <= b < depth]
    if bad:
        raise WinposError(f"global_blocks {bad} are outside the {depth} blocks of stages={stages}; "
                          f"use indices in [0, {depth - 1}]")
    stage_ends = [sum(stages[: i + 1]) - 1 for i in range(len(stages))]
    specs, dim, heads, stage = [], embed_dim, num_heads, 0
    for i in range(depth):
        window = 0 if i in global_blocks else window_spec[stage]  # read before the stage advances (lag)
        dim_out, q_stride = dim, 1
        if i - 1 in stage_ends:
            dim_out, heads, stage, q_stride = int(dim * dim_mul), int(heads * head_mul), stage + 1, Q_STRIDE
            if window % Q_STRIDE:
                raise WinposError(f"block {i} pools its queries 2x2 inside windows of {window} tokens, which 2 does "
                                  "not divide; use an even window for the stage before it")
        if heads < 1 or dim_out % heads:
            raise WinposError(f"block {i} has {dim_out} channels and {heads} heads; channels must divide by heads")
        specs.append(BlockSpec(i, stage, dim, dim_out, heads, window, q_stride))
        dim = dim_out
    return specs


class PatchEmbed(nn.Module):
    """Conv(in_chans -> C, k7, s4, p3): ``(B, 3, H, W) -> (B, ceil(H/4), ceil(W/4), C)``."""

    def __init__(self, in_chans: int, dim: int):
        super().__init__()
        self.proj = nn.Conv2d(in_chans, dim, kernel_size=7, stride=4, padding=3)

    def forward(self, x):
        # Contiguous (B, H, W, C): a permuted NCHW view would pass its channels-first strides on to every
        # residual add of the stage (elementwise ops keep the first operand's layout).
        return patch_projection(self.proj, x).permute(0, 2, 3, 1).contiguous()


class HieraBlock(nn.Module):
    """A Hiera/SAM2 ``MultiScaleBlock`` on ``(B, H, W, dim) -> (B, ceil(H/q), ceil(W/q), dim_out)``.

    ``expand_proj=False`` is timm's ``use_expand_proj=False``: the shortcut of a dim-doubling block is
    ``cat(MaxPool(x), AvgPool(x))`` of the un-normalized input instead of ``MaxPool(Linear(norm1(x)))``.
    """

    def __init__(self, spec: BlockSpec, mlp_ratio=4.0, drop_path=0.0, layer_scale_init=None, expand_proj=True,
                 norm_eps=1e-6, position="none", extent=(14, 14), num_layers=1, pad_mode="zeros"):
        super().__init__()
        self.dim, self.dim_out, self.window, self.q_stride = spec.dim, spec.dim_out, spec.window, spec.q_stride
        self.norm1 = nn.LayerNorm(spec.dim, eps=norm_eps)
        self.expand_proj = expand_proj
        if spec.dim != spec.dim_out:
            if expand_proj:
                self.proj = nn.Linear(spec.dim, spec.dim_out)
            elif spec.dim_out != 2 * spec.dim:
                raise WinposError(f"expand_proj=False concatenates max- and avg-pooled inputs, so it needs "
                                  f"dim_out = 2 * dim; block {spec.index} has {spec.dim} -> {spec.dim_out}")
        self.attn = Attention(spec.dim, spec.dim_out, spec.num_heads, window_size=spec.window,
                              q_stride=spec.q_stride, position=position, extent=extent, layer_index=spec.index,
                              num_layers=num_layers, pad_mode=pad_mode if spec.window else "mask")
        self.ls1 = LayerScale(spec.dim_out, layer_scale_init) if layer_scale_init is not None else nn.Identity()
        self.ls2 = LayerScale(spec.dim_out, layer_scale_init) if layer_scale_init is not None else nn.Identity()
        self.drop_path = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(spec.dim_out, eps=norm_eps)
        self.mlp = Mlp(spec.dim_out, int(spec.dim_out * mlp_ratio))

    def _pool(self, x, avg=False):
        s, nchw = self.q_stride, x.permute(0, 3, 1, 2)
        out = F.avg_pool2d(nchw, s, s, ceil_mode=True) if avg else F.max_pool2d(nchw, s, s, ceil_mode=True)
        return out.permute(0, 2, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, H, W, _ = x.shape
        x_norm = self.norm1(x)
        shortcut = x
        if self.dim != self.dim_out:
            shortcut = (self._pool(self.proj(x_norm)) if self.expand_proj
                        else torch.cat([self._pool(x), self._pool(x, avg=True)], dim=-1))
        # Pad after norm1 so padded tokens are exact zeros; a global pooling block pads only to the stride.
        unit = self.window or self.q_stride
        x_pad, _ = pad_to_window(x_norm, unit)
        x = add_attention_branch(x_pad, (H, W), shortcut, self.attn, self.ls1, self.drop_path)
        return add_mlp_branch(x, self.norm2, self.mlp, self.ls2, self.drop_path)


class HieraDet(WindowedBackbone):
    """Hierarchical windowed backbone (Hiera / SAM2 HieraDet) returning stride 4, 8, 16, 32 features.

    Args:
        img_size: training image side; sizes the relpos tables of global blocks (stage grid at this size).
        pretrain_img_size: image side of pretraining (224); the ``abs`` grid (56x56) and the recursive period.
        in_chans: image channels.
        embed_dim, num_heads: stage-1 channels and heads; both grow by ``dim_mul`` / ``head_mul`` per stage.
        stages: blocks per stage, e.g. (1, 2, 7, 2).
        window_spec: window per stage in that stage's tokens (0 = global); lag rule, see the module docstring.
        global_blocks: block indices that attend globally whatever their stage's window.
        mlp_ratio, drop_path_rate: MLP width and stochastic-depth rate (linear over blocks).
        layer_scale_init: LayerScale init (timm ``hiera_*_abswin``), None for none.
        expand_proj: shortcut of dim-doubling blocks; see ``HieraBlock``.
        norm_eps: LayerNorm epsilon.
        pos_embed: one of ``POS_EMBEDS``: ``"abswin"`` (SAM2), ``"abswin_recursive"`` (the paper's HieraDet),
            ``"abs"`` (official Hiera's flat (1, 3136, C) embedding, naively interpolated: the bug), ``"none"``.
        pos_global_size: abs-win global embedding grid (SAM2: 7, or 14 for B+; timm abswin: 16).
        pos_window_size: abs-win window embedding, default ``window_spec[0]``.
        pos_base_hw: period of ``abswin_recursive``, default the pretraining grid ``pretrain_img_size // 4``.
        pos_antialias: bicubic flavour of resizes (False: SAM2; True: timm abswin).
        pos_init_std: init of the token embedding, global and window parts alike (0 = SAM2's zeros).
        window_pos, global_pos: block terms from ``BLOCK_POS`` (a name, a dict or a ``BlockPosition``).
        pad_mode: ``"zeros"`` or ``"mask"`` (see ``winpos.windows``).
        weight_init: ``"default"`` (sam2: PyTorch's) or ``"trunc_normal"``; see ``common.init_weights``.
        use_checkpoint: activation checkpointing per block while gradients are recorded.
        return_interm_layers: return all four stage outputs (True) or only the last.
    Forward: ``(B, 3, H, W) -> [(B, C_i, ceil(H / s_i), ceil(W / s_i)) for s_i in strides]``.
    """

    def __init__(self, img_size=1024, pretrain_img_size=224, in_chans=3, embed_dim=96, num_heads=1,
                 stages=(2, 3, 16, 3), dim_mul=2.0, head_mul=2.0, window_spec=(8, 4, 14, 7),
                 global_blocks=(12, 16, 20), mlp_ratio=4.0, drop_path_rate=0.0, layer_scale_init=None,
                 expand_proj=True, norm_eps=1e-6, pos_embed="abswin", pos_global_size=14, pos_window_size=None,
                 pos_base_hw=None, pos_antialias=False, pos_init_std=0.02, window_pos="none", global_pos="none",
                 pad_mode="zeros", weight_init="default", use_checkpoint=False, return_interm_layers=True):
        super().__init__()
        check_choice("pos_embed", pos_embed, POS_EMBEDS)
        check_choice("pad_mode", pad_mode, PAD_MODES)
        img_hw = as_hw(img_size, "img_size")
        specs = block_schedule(embed_dim, num_heads, stages, window_spec, tuple(global_blocks), dim_mul, head_mul)
        self.in_chans, self.pos_embed_kind = in_chans, pos_embed
        self.window_spec, self.global_blocks = tuple(window_spec), tuple(global_blocks)
        self.stage_ends = [sum(stages[: i + 1]) - 1 for i in range(len(stages))]
        self.num_layers = len(specs)
        self.use_checkpoint, self.return_interm_layers = use_checkpoint, return_interm_layers
        self.patch_embed = PatchEmbed(in_chans, embed_dim)
        pre_hw = tuple(-(-s // 4) for s in as_hw(pretrain_img_size, "pretrain_img_size"))  # stride-4 tokens
        self.pos_embed = make_token_embedding(
            pos_embed, embed_dim, pretrain_hw=pre_hw, window_size=pos_window_size or window_spec[0],
            global_size=pos_global_size, base_hw=pos_base_hw or pre_hw, antialias=pos_antialias,
            init_std=pos_init_std, global_init_std=pos_init_std)
        window_pos, global_pos = as_block_position(window_pos), as_block_position(global_pos)
        dpr = torch.linspace(0, check_drop_path_rate(drop_path_rate), len(specs), device="cpu").tolist()
        self.blocks = nn.ModuleList()
        for spec, p in zip(specs, dpr):
            # The block's key grid is its input grid: the previous stage's for a pooling block.
            in_stage = spec.stage - (spec.q_stride > 1)
            extent = spec.window or tuple(-(-s // 2 ** (in_stage + 2)) for s in img_hw)
            self.blocks.append(HieraBlock(
                spec, mlp_ratio, p, layer_scale_init, expand_proj, norm_eps,
                position=window_pos if spec.window else global_pos, extent=extent,
                num_layers=len(specs), pad_mode=pad_mode))
        self.channels = [specs[e].dim_out for e in self.stage_ends]
        self.strides = [4, 8, 16, 32]
        init_weights(self, weight_init)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        check_image(x, self.in_chans, 1, "HieraDet")
        x = self.patch_embed(x)  # (B, H/4, W/4, C)
        if self.pos_embed is not None:
            x = x + self.pos_embed(tuple(x.shape[1:3]))
        outputs = []
        for i, blk in enumerate(self.blocks):
            x = self.run_block(blk, x)
            if i == self.stage_ends[-1] or (self.return_interm_layers and i in self.stage_ends):
                outputs.append(x.permute(0, 3, 1, 2))  # (B, H, W, C) -> (B, C, H, W)
        return outputs


# ----------------------------------------------------------------------------------------------- presets
# Hiera sizes (embed dims, heads and stage depths of the official Hiera T/S/B/B+/L/H models) with SAM2's window
# specs, global-attention blocks and global-embedding sizes (from its Hiera-T/S/B+/L image encoders). SAM2 defines
# no B or H: B shares B+'s depths, so it takes B+'s schedule and 14x14 global embedding; H shares L's depths and
# takes L's schedule (windows 8, 4, 16, 8). With 16-token stage-3 windows (256 px) the recursive period of the
# paper recipe is 64 tokens for L and H instead of 56, so every window grid stays aligned.
SIZES = {
    "hieradet_toy": dict(embed_dim=32, num_heads=1, stages=(1, 1, 2, 1), global_blocks=(3,), pos_global_size=7),
    "hieradet_t": dict(embed_dim=96, num_heads=1, stages=(1, 2, 7, 2), global_blocks=(5, 7, 9), pos_global_size=7),
    "hieradet_s": dict(embed_dim=96, num_heads=1, stages=(1, 2, 11, 2), global_blocks=(7, 10, 13),
                       pos_global_size=7),
    "hieradet_b": dict(embed_dim=96, num_heads=1, stages=(2, 3, 16, 3), global_blocks=(12, 16, 20),
                       pos_global_size=14),
    "hieradet_bplus": dict(embed_dim=112, num_heads=2, stages=(2, 3, 16, 3), global_blocks=(12, 16, 20),
                           pos_global_size=14),
    "hieradet_l": dict(embed_dim=144, num_heads=2, stages=(2, 6, 36, 4), global_blocks=(23, 33, 43),
                       window_spec=(8, 4, 16, 8), pos_global_size=7, pos_base_hw=64),
    "hieradet_h": dict(embed_dim=256, num_heads=4, stages=(2, 6, 36, 4), global_blocks=(23, 33, 43),
                       window_spec=(8, 4, 16, 8), pos_global_size=7, pos_base_hw=64),
}

# What the four recipes mean, the same in both families: backbones.common (next to LOOKHERE_45).
RECIPES = {
    "original": dict(pos_embed="abswin", window_pos="none", global_pos="none"),  # SAM2
    "paper": dict(pos_embed="abswin_recursive", window_pos="none", global_pos="relpos"),  # Bolya et al.
    "rope": dict(pos_embed="abswin", window_pos="rope", global_pos="rope"),
    "lookhere": dict(pos_embed="none", window_pos=LOOKHERE_45, global_pos=LOOKHERE_45),
}


register_family(HieraDet, "HieraDet", SIZES, RECIPES,
                docs={"hieradet_toy": "CPU-sized HieraDet for tests and shapes configs: 32 -> 256 channels, 5 blocks."})


__all__ = ["HieraDet", "HieraBlock", "BlockSpec", "block_schedule", "SIZES", "RECIPES"]
