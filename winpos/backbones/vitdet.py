"""ViTDet (Li et al., ECCV 2022): a plain ViT whose blocks attend in 14x14 windows, except a few global blocks.

Layout and semantics follow detectron2's ``modeling/backbone/vit.py`` so its checkpoints load unchanged
(``winpos.checkpoints.vitdet``): ``patch_embed.proj`` (Conv k16 s16), ``blocks.{i}.{norm1, attn.qkv, attn.proj,
attn.rel_pos_h, attn.rel_pos_w, norm2, mlp.fc1, mlp.fc2}``, LayerNorm eps 1e-6, tokens ``(B, H, W, C)`` between
blocks, window grids zero-padded at the bottom/right after ``norm1`` with the padded tokens left unmasked
(``pad_mode="mask"`` hides them instead).

Position encoding is chosen by ``pos_embed`` (a token embedding added once after the patch embedding) and by
``window_pos`` / ``global_pos`` (the per-block term of window and global blocks):

- ``"abs"``: detectron2's ``pos_embed`` stored at the pretraining grid (14x14 plus a cls row) and naively
  bicubic-interpolated to the token grid at every size, exactly like ``get_abs_pos`` (the buggy baseline).
- ``"abswin"``: window embedding of the window size (14x14 = the 224 px pretraining grid, so a converted MAE /
  detectron2 embedding is *tiled*, not stretched) plus a zero-initialized global embedding (default 14x14)
  interpolated to the grid.
- ``"abswin_recursive"``: the HieraDet recipe's recursive form with period = the pretraining grid. ViTDet has one
  window size equal to that grid, so this is a purely periodic embedding ``Tile(Resize(G -> 14) + Wn)``: identical
  to ``"abswin"`` at 224 px and after checkpoint conversion (G = 0); it differs only once G is trained, by having
  no image-wide component.
- ``"none"``.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn

from winpos.backbones.common import (
    LOOKHERE_45, POS_EMBEDS, Attention, DropPath, LayerScale, Mlp, SwiGLU, WindowedBackbone, add_attention_branch,
    add_mlp_branch, as_block_options, as_block_position, check_drop_path_rate, check_image, init_weights,
    make_token_embedding, patch_projection,
)
from winpos.backbones.registry import register_family
from winpos.errors import WinposError, as_hw, check_choice
from winpos.windows import PAD_MODES, pad_to_window

__all__ = ["ViTDet", "ViTDetBlock", "RECIPES", "SIZES"]


class PatchEmbed(nn.Module):
    """Non-overlapping patch projection: ``(B, in_chans, H, W) -> (B, H/p, W/p, dim)`` (detectron2 layout)."""

    def __init__(self, patch_size: int, in_chans: int, dim: int, bias: bool = True):
        super().__init__()
        self.proj = nn.Conv2d(in_chans, dim, kernel_size=patch_size, stride=patch_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Contiguous (B, H, W, C): a permuted NCHW view would hand its channels-first strides to every residual
        # add after it (elementwise ops keep the first operand's layout), and each LayerNorm would copy it back.
        return patch_projection(self.proj, x).permute(0, 2, 3, 1).contiguous()


class ViTDetBlock(nn.Module):
    """Pre-norm transformer block attending in ``window_size`` windows (0 = globally).

    Args:
        dim, num_heads, mlp_ratio, qkv_bias: the usual ViT block sizes.
        drop_path: stochastic-depth rate of both residual branches.
        norm_eps: LayerNorm epsilon (1e-6 in detectron2's ViTDet configs).
        window_size: window side in tokens, or 0 for global attention.
        position: the block's position term (``BlockPosition``, a name in ``BLOCK_POS`` or a dict).
        extent: ``(h, w)`` attention extent that sizes relpos tables (window, or global grid at ``img_size``).
        layer_index, num_layers: LookHere's per-layer slope schedule.
        pad_mode: ``"zeros"`` (detectron2) or ``"mask"``.
        layer_scale_init: initial LayerScale value, or None for no LayerScale (detectron2 has none).
        options: ``BlockOptions`` (or a dict of its fields): SwiGLU MLP, its hidden width and sub-LN, no key bias.
    Forward: ``(B, H, W, dim) -> (B, H, W, dim)``.
    """

    def __init__(self, dim, num_heads, mlp_ratio=4.0, qkv_bias=True, drop_path=0.0, norm_eps=1e-6, window_size=0,
                 position="none", extent=(14, 14), layer_index=0, num_layers=1, pad_mode="zeros",
                 layer_scale_init=None, options=None):
        super().__init__()
        opts = as_block_options(options)
        self.window_size = window_size
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = Attention(dim, dim, num_heads, window_size=window_size, qkv_bias=qkv_bias, position=position,
                              extent=extent, layer_index=layer_index, num_layers=num_layers, pad_mode=pad_mode,
                              k_bias=opts.k_bias)
        self.drop_path = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        hidden = opts.mlp_hidden or int(dim * mlp_ratio)
        self.mlp = SwiGLU(dim, hidden, opts.mlp_norm, norm_eps) if opts.mlp == "swiglu" else Mlp(dim, hidden)
        self.ls1 = LayerScale(dim, layer_scale_init) if layer_scale_init is not None else nn.Identity()
        self.ls2 = LayerScale(dim, layer_scale_init) if layer_scale_init is not None else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        x = self.norm1(x)
        H, W = x.shape[1], x.shape[2]
        if self.window_size:
            # Zeros after norm1: padded tokens carry only the qkv bias, as in detectron2 and SAM.
            x, _ = pad_to_window(x, self.window_size)
        x = add_attention_branch(x, (H, W), shortcut, self.attn, self.ls1, self.drop_path)
        return add_mlp_branch(x, self.norm2, self.mlp, self.ls2, self.drop_path)


class ViTDet(WindowedBackbone):
    """Plain ViT backbone of ViTDet with selectable position encodings.

    Args:
        img_size: training image side (int or (h, w)); sizes the global blocks' relpos tables as
            ``img_size / patch_size`` (64 at 1024, detectron2's ``input_size``). Any input whose sides are
            multiples of ``patch_size`` runs; relpos tables are resampled to other grids like detectron2 does.
        patch_size: patch stride (16).
        in_chans: image channels.
        embed_dim, depth, num_heads, mlp_ratio, qkv_bias: ViT sizes.
        drop_path_rate: stochastic depth, rising linearly from 0 at block 0 to this value at the last block.
        norm_eps: LayerNorm epsilon.
        window_size: window side of window blocks (14); 0 makes every block global.
        global_blocks: indexes of the global-attention blocks (ViT-B: 2, 5, 8, 11).
        pos_embed: token embedding, one of ``POS_EMBEDS`` (see module docstring).
        window_pos, global_pos: position term of window / global blocks: a name in ``BLOCK_POS``, a dict of
            ``BlockPosition`` fields, or a ``BlockPosition``.
        pretrain_img_size: image side of the pretraining run; the ``abs`` embedding is stored at
            ``pretrain_img_size / patch_size`` (14 for MAE at 224, 64 for SAM at 1024).
        pretrain_use_cls_token: the ``abs`` embedding keeps a (unused) cls row in front, as MAE / detectron2 do.
        pos_global_size: grid of the abswin global embedding (zero-initialized, so a converted checkpoint starts
            exactly at its pretrained embedding tiled over the grid).
        pos_antialias: antialiased bicubic for resizing the token embedding (detectron2: False).
        pos_init_std: trunc-normal init of the ``abs`` embedding and of the abswin window embedding.
        pad_mode: ``"zeros"`` (detectron2 / SAM semantics) or ``"mask"`` (padded keys hidden).
        layer_scale_init: LayerScale init value, or None (detectron2 has no LayerScale).
        block: ``BlockOptions`` of every block (a dict of its fields): what RoPE-pretrained ViTs add to detectron2's
            block (SwiGLU MLP and its width and sub-LN, no key bias); None: detectron2's block.
        weight_init: ``"trunc_normal"`` (detectron2) or ``"default"`` (PyTorch's); see ``common.init_weights``.
        use_checkpoint: activation checkpointing per block while gradients are recorded.
        ln_pre: a LayerNorm (``norm_eps``) on the tokens after the token embedding, before the first block (SAM3's
            encoder, ``ln_pre``); False: detectron2's ViT, which has none.
        patch_bias: the patch projection has a bias (detectron2, MAE); SAM3's encoder has none.
    Forward: ``(B, in_chans, H, W) -> (B, embed_dim, H/16, W/16)``.
    """

    def __init__(self, img_size=1024, patch_size=16, in_chans=3, embed_dim=768, depth=12, num_heads=12,
                 mlp_ratio=4.0, qkv_bias=True, drop_path_rate=0.0, norm_eps=1e-6, window_size=14,
                 global_blocks=(2, 5, 8, 11), pos_embed="abs", window_pos="relpos", global_pos="relpos",
                 pretrain_img_size=224, pretrain_use_cls_token=True, pos_global_size=14, pos_antialias=False,
                 pos_init_std=0.02, pad_mode="zeros", layer_scale_init=None, weight_init="trunc_normal",
                 use_checkpoint=False, block=None, ln_pre=False, patch_bias=True):
        super().__init__()
        self._validate(embed_dim, depth, num_heads, patch_size, window_size, global_blocks, pos_embed, pad_mode)
        img_hw = as_hw(img_size, "img_size")
        pre_hw = as_hw(pretrain_img_size, "pretrain_img_size")
        for name, hw in (("img_size", img_hw), ("pretrain_img_size", pre_hw)):
            if hw[0] % patch_size or hw[1] % patch_size:
                raise WinposError(f"{name}={hw} is not a multiple of patch_size={patch_size}; use e.g. "
                                  f"{-(-hw[0] // patch_size) * patch_size}")
        self.embed_dim, self.depth, self.num_layers, self.num_heads = embed_dim, depth, depth, num_heads
        self.patch_size, self.in_chans, self.window_size = patch_size, in_chans, window_size
        self.global_blocks = tuple(sorted(set(int(i) for i in global_blocks)))
        self.pos_embed_kind, self.pad_mode, self.use_checkpoint = pos_embed, pad_mode, use_checkpoint
        self.window_pos, self.global_pos = as_block_position(window_pos), as_block_position(global_pos)
        self.block_options = as_block_options(block)
        self.pretrain_hw = (pre_hw[0] // patch_size, pre_hw[1] // patch_size)
        self.grid_hw = (img_hw[0] // patch_size, img_hw[1] // patch_size)

        self.patch_embed = PatchEmbed(patch_size, in_chans, embed_dim, bias=patch_bias)
        # ViTDet has one window, the pretraining grid: it sizes the abs-win window embedding and is the period.
        self.pos_embed = make_token_embedding(
            pos_embed, embed_dim, pretrain_hw=self.pretrain_hw, window_size=window_size, global_size=pos_global_size,
            base_hw=self.pretrain_hw, antialias=pos_antialias, init_std=pos_init_std, global_init_std=0.0,
            has_cls=pretrain_use_cls_token)
        self.ln_pre = nn.LayerNorm(embed_dim, eps=norm_eps) if ln_pre else None
        # device explicit: works under a meta device
        dpr = torch.linspace(0, check_drop_path_rate(drop_path_rate), depth, device="cpu").tolist()
        self.blocks = nn.ModuleList()
        for i in range(depth):
            is_global = window_size == 0 or i in self.global_blocks
            self.blocks.append(ViTDetBlock(
                embed_dim, num_heads, mlp_ratio, qkv_bias, dpr[i], norm_eps,
                window_size=0 if is_global else window_size,
                position=copy.deepcopy(self.global_pos if is_global else self.window_pos),
                extent=self.grid_hw if is_global else (window_size, window_size),
                layer_index=i, num_layers=depth, pad_mode=pad_mode, layer_scale_init=layer_scale_init,
                options=self.block_options,
            ))
        init_weights(self, weight_init)

    @staticmethod
    def _validate(embed_dim, depth, num_heads, patch_size, window_size, global_blocks, pos_embed, pad_mode):
        check_choice("pos_embed", pos_embed, POS_EMBEDS)
        check_choice("pad_mode", pad_mode, PAD_MODES)
        for name, v in (("embed_dim", embed_dim), ("depth", depth), ("num_heads", num_heads),
                        ("patch_size", patch_size)):
            if not isinstance(v, int) or v <= 0:
                raise WinposError(f"{name}={v!r} must be a positive int")
        if embed_dim % num_heads:
            raise WinposError(f"embed_dim={embed_dim} is not divisible by num_heads={num_heads}; "
                              "choose heads that divide it")
        if not isinstance(window_size, int) or window_size < 0:
            raise WinposError(f"window_size={window_size!r} must be an int >= 0 (0: every block global)")
        bad = [i for i in global_blocks if not 0 <= int(i) < depth]
        if bad:
            raise WinposError(f"global_blocks {bad} are outside 0..{depth - 1} for depth={depth}; "
                              "list block indexes of this model")
        if pos_embed.startswith("abswin") and window_size == 0:
            raise WinposError(f"pos_embed={pos_embed!r} tiles a window embedding, but window_size=0 has no windows; "
                              "set window_size (e.g. 14) or use pos_embed='abs'")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, in_chans, H, W)`` with H, W multiples of 16 -> stride-16 features ``(B, embed_dim, H/16, W/16)``."""
        check_image(x, self.in_chans, self.patch_size, "ViTDet")
        x = self.patch_embed(x)  # (B, H, W, C)
        if self.pos_embed is not None:
            x = x + self.pos_embed((x.shape[1], x.shape[2]))
        if self.ln_pre is not None:
            x = self.ln_pre(x)
        for blk in self.blocks:
            x = self.run_block(blk, x)
        return x.permute(0, 3, 1, 2)  # (B, C, H, W)


# Sizes of detectron2's ViTDet-B/L/H configs (embed dim, depth, heads, global-attention blocks, drop-path rate)
# plus a CPU-sized one for tests and shapes configs.
SIZES = {
    "vitdet_toy": dict(embed_dim=96, depth=4, num_heads=3, global_blocks=(1, 3), drop_path_rate=0.0),
    "vitdet_b": dict(embed_dim=768, depth=12, num_heads=12, global_blocks=(2, 5, 8, 11), drop_path_rate=0.1),
    "vitdet_l": dict(embed_dim=1024, depth=24, num_heads=16, global_blocks=(5, 11, 17, 23), drop_path_rate=0.4),
    "vitdet_h": dict(embed_dim=1280, depth=32, num_heads=16, global_blocks=(7, 15, 23, 31), drop_path_rate=0.5),
}


# What the four recipes mean, the same in both families: backbones.common (next to LOOKHERE_45).
RECIPES = {
    "original": dict(pos_embed="abs", window_pos="relpos", global_pos="relpos"),
    "paper": dict(pos_embed="abswin", window_pos="none", global_pos="relpos"),
    "rope": dict(pos_embed="abswin", window_pos="rope", global_pos="rope"),
    "lookhere": dict(pos_embed="none", window_pos=LOOKHERE_45, global_pos=LOOKHERE_45),
}


register_family(ViTDet, "ViTDet", SIZES, RECIPES)
