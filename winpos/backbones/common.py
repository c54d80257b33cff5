"""Pieces both backbones share: the attention module with per-block position terms, the MLP, drop path, and the
validation of position-encoding choices."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from winpos.attention import PositionTerms, attention, resolve_backend
from winpos.backbones.fused import fused_enabled, linear_add, linear_gelu, residual_add
from winpos.errors import WinposError, check_choice
from winpos.posemb.abswin import AbsPosEmbed, AbsWinPosEmbed
from winpos.posemb.relpos import rel_pos_parameters
from winpos.windows import PAD_MODES, window_partition, window_unpartition

__all__ = ["BLOCK_POS", "LAYER_SCALE_KEYS", "LOOKHERE_45", "MLPS", "POSITION_KEYS", "POS_EMBEDS", "WEIGHT_INITS",
           "Attention", "BlockOptions", "BlockPosition", "DropPath", "LayerScale", "Mlp", "SwiGLU", "WindowedBackbone", "add_attention_branch",
           "add_mlp_branch", "as_block_options", "as_block_position", "check_image", "init_weights", "is_position_param",
           "make_token_embedding", "may_keep_init", "patch_projection"]

POS_EMBEDS = ("none", "abs", "abswin", "abswin_recursive")
BLOCK_POS = ("none", "relpos", "rope", "lookhere")
WEIGHT_INITS = ("trunc_normal", "default")


@dataclass
class BlockPosition:
    """The position term of one block kind (window or global).

    kind: one of ``BLOCK_POS``.
    rope: options for ``winpos.posemb.rope.RoPE`` (kind, fraction, base, shared_heads, pairing, axis_order, coords).
    lookhere: options for ``winpos.posemb.lookhere.LookHere`` (variant, global_slope).
    relpos_zero_init: detectron2's ``rel_pos_zero_init``.
    """

    kind: str = "none"
    rope: dict = field(default_factory=dict)
    lookhere: dict = field(default_factory=dict)
    relpos_zero_init: bool = True

    def __post_init__(self):
        check_choice("block position encoding", self.kind, BLOCK_POS)


MLPS = ("gelu", "swiglu")


@dataclass
class BlockOptions:
    """What a pretrained ViT's blocks have beyond detectron2's (one small set, the same for every block).

    mlp: ``"gelu"`` (``fc1 -> GELU -> fc2``) or ``"swiglu"`` (EVA-02, DINOv3 S+/H+: ``fc1`` holds the gate rows then
        the value rows, ``silu(gate) * value -> [norm] -> fc2``).
    mlp_hidden: hidden width; None: ``int(dim * mlp_ratio)``.
    mlp_norm: a LayerNorm on the SwiGLU hidden features before ``fc2`` (EVA-02 B/L's sub-LN, ``mlp.norm``).
    k_bias: False holds the key part of ``attn.qkv.bias`` at zero (EVA-02 and DINOv3 train a query and a value bias
        only); the stored key entries are masked in the forward pass, so they get no gradient either.
    """

    mlp: str = "gelu"
    mlp_hidden: int | None = None
    mlp_norm: bool = False
    k_bias: bool = True

    def __post_init__(self):
        check_choice("block mlp", self.mlp, MLPS)
        if self.mlp_norm and self.mlp != "swiglu":
            raise WinposError("mlp_norm=True is the SwiGLU sub-LN (EVA-02 B/L); set mlp='swiglu' or drop mlp_norm")
        if self.mlp_hidden is not None and (not isinstance(self.mlp_hidden, int) or self.mlp_hidden <= 0):
            raise WinposError(f"mlp_hidden={self.mlp_hidden!r} must be a positive int (or None: dim * mlp_ratio)")


def as_block_options(value) -> BlockOptions:
    if value is None:
        return BlockOptions()
    if isinstance(value, BlockOptions):
        return value
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(BlockOptions.__dataclass_fields__))
        if unknown:
            raise WinposError(f"unknown block options {unknown}; valid ones are "
                              f"{sorted(BlockOptions.__dataclass_fields__)}")
        return BlockOptions(**value)
    raise WinposError(f"block options must be a dict or a BlockOptions, got {value!r}")


def as_block_position(value) -> BlockPosition:
    if isinstance(value, BlockPosition):
        return value
    if isinstance(value, str):
        return BlockPosition(kind=value)
    if isinstance(value, dict):
        return BlockPosition(**value)
    raise WinposError(f"a block position must be a name in {BLOCK_POS}, a dict or a BlockPosition, got {value!r}")


class Attention(nn.Module):
    """Multi-head attention over a padded token grid with an optional pooled query and one position term.

    Args:
        dim, dim_out: input and output channels (they differ in Hiera's stage-transition blocks).
        num_heads: heads; ``dim_out`` must divide by it.
        window_size: key window, or 0 for global attention.
        q_stride: 2 to max-pool queries 2x2 inside windows (Hiera's q-pooling), else 1.
        position: the block's ``BlockPosition``.
        extent: attention extent used to size relpos tables (window size, or the global grid at training size).
        layer_index, num_layers: LookHere's per-layer slope schedule.
        pad_mode: ``"zeros"`` (detectron2/SAM semantics) or ``"mask"``.
    Forward: ``x (B, Hp, Wp, dim)`` padded to the window, ``valid_hw`` -> ``(B, Hp/q, Wp/q, dim_out)``.
    """

    def __init__(self, dim, dim_out, num_heads, window_size=0, q_stride=1, qkv_bias=True, position="none",
                 extent=(14, 14), layer_index=0, num_layers=1, pad_mode="zeros", k_bias=True):
        super().__init__()
        if dim_out % num_heads:
            raise WinposError(f"dim_out={dim_out} is not divisible by num_heads={num_heads}")
        self.num_heads, self.head_dim = num_heads, dim_out // num_heads
        self.window_size, self.q_stride = window_size, q_stride
        self.pad_mode = check_choice("pad_mode", pad_mode, PAD_MODES)
        self.qkv = nn.Linear(dim, dim_out * 3, bias=qkv_bias)
        if qkv_bias and not k_bias:
            # EVA-02 / DINOv3: no key bias. The key entries of qkv.bias are multiplied by 0 in the forward pass.
            mask = torch.ones(dim_out * 3)
            mask[dim_out:2 * dim_out] = 0
            self.register_buffer("qkv_bias_mask", mask, persistent=False)
        else:
            self.qkv_bias_mask = None
        self.proj = nn.Linear(dim_out, dim_out)
        self.position = as_block_position(position)
        self.rope = self.lookhere = None
        kind = self.position.kind
        if kind == "relpos":
            self.rel_pos_h, self.rel_pos_w = rel_pos_parameters(self.head_dim, extent, self.position.relpos_zero_init)
        elif kind == "rope":
            from winpos.posemb.rope import RoPE

            self.rope = RoPE(self.head_dim, num_heads, **self.position.rope)
        elif kind == "lookhere":
            from winpos.posemb.lookhere import LookHere

            self.lookhere = LookHere(num_heads, layer_index=layer_index, num_layers=num_layers, **self.position.lookhere)

    def position_terms(self) -> PositionTerms:
        rel = (self.rel_pos_h, self.rel_pos_w) if self.position.kind == "relpos" else None
        return PositionTerms(rope=self.rope, rel_pos=rel, lookhere=self.lookhere)

    def forward(self, x: torch.Tensor, valid_hw=None, residual=None) -> torch.Tensor:
        """``x (B, Hp, Wp, dim)`` -> ``(B, Hp/q, Wp/q, dim_out)``; with ``residual (B, h, w, dim_out)`` the output is
        cropped to ``h x w`` and ``residual`` added (on CPU in inference inside the projection's output pass)."""
        B, H, W, C = x.shape
        ws, s = self.window_size, self.q_stride
        zero_padded = self.pad_mode == "zeros" or valid_hw is None or tuple(valid_hw) == (H, W)
        # Project after unpartitioning, with the residual in the projection's pass, where nothing is cropped (a
        # cropped grid is strided: the projection would copy it and add its bias separately).
        fuse = (residual is not None and fused_enabled(x, self.proj)
                and tuple(residual.shape[1:3]) == (H // s, W // s))
        # Whether the kernels may run decides how to window; attention() itself still takes "auto", because on CUDA
        # it sends inputs the kernels do not take fast (fp32, some head dims; known only after the projection,
        # under autocast too) to the reference.
        if ws and zero_padded and resolve_backend("auto", x.device) != "triton":
            # Partition x once, before the projections (as SAM2 does): every position term of a window block is
            # window-local, so each window is a small global attention with the same terms. One copy of x and one
            # of the output, instead of one per q, k and v and one of the output. (The Triton kernel windows the
            # grid in-kernel and needs no copy at all.)
            xw = window_partition(x, ws).reshape(-1, ws, ws, C)
            out = self._attend(xw, window=None, valid_hw=None, project=not fuse)
            out = window_unpartition(out.flatten(1, 2), ws // s, (H // s, W // s))
        else:
            out = self._attend(x, window=ws or None, valid_hw=valid_hw, project=not fuse)
        if residual is None:
            return out
        out = out[:, : residual.shape[1], : residual.shape[2]]
        return linear_add(out, self.proj, residual) if fuse else residual_add(residual, out)

    def _attend(self, x: torch.Tensor, window, valid_hw, project=True) -> torch.Tensor:
        B, H, W, _ = x.shape
        if self.qkv_bias_mask is None:
            qkv = self.qkv(x)
        else:
            w = self.qkv.weight  # x in its dtype (a no-op but in a float16 export graph, whose weights are float16)
            qkv = F.linear(x.to(w.dtype), w, (self.qkv.bias * self.qkv_bias_mask).to(w.dtype))
        qkv = qkv.reshape(B, H, W, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.unbind(3)  # each (B, H, W, heads, head_dim)
        if self.q_stride > 1:
            # Max-pool queries inside windows; windows are even so pooling the padded grid pools each window.
            s = self.q_stride
            q = F.max_pool2d(q.flatten(3).permute(0, 3, 1, 2), kernel_size=s, stride=s, ceil_mode=False)
            q = q.permute(0, 2, 3, 1).reshape(B, H // s, W // s, self.num_heads, self.head_dim)
        out = attention(q, k, v, window=window, pos=self.position_terms(), valid_hw=valid_hw, pad_mode=self.pad_mode)
        return self.proj(out.flatten(-2)) if project else out.flatten(-2)


def add_attention_branch(x_pad, valid_hw, shortcut, attn: Attention, layer_scale: nn.Module, drop_path: "DropPath"):
    """``shortcut + drop_path(layer_scale(attn(x_pad)))``, the attention output cropped to ``shortcut``'s grid; where
    the branch is just the attention (no LayerScale, no active drop path) the residual goes into the projection."""
    if isinstance(layer_scale, nn.Identity) and drop_path.is_identity():
        return attn(x_pad, valid_hw=valid_hw, residual=shortcut)
    out = attn(x_pad, valid_hw=valid_hw)[:, : shortcut.shape[1], : shortcut.shape[2]]
    return residual_add(shortcut, drop_path(layer_scale(out)))


class Mlp(nn.Module):
    def __init__(self, dim, hidden, out=None, act=nn.GELU):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = act()
        self.fc2 = nn.Linear(hidden, out or dim)

    def forward(self, x, residual=None):
        """``fc2(act(fc1(x)))``, plus ``residual`` if given (fused on CPU in inference: ``winpos.backbones.fused``)."""
        h = linear_gelu(x, self.fc1, self.act)
        return self.fc2(h) if residual is None else linear_add(h, self.fc2, residual)


class SwiGLU(nn.Module):
    """``fc2([norm](silu(gate) * value))`` with ``fc1`` holding the gate rows then the value rows (EVA-02 / DINOv3
    SwiGLU; timm's packed ``GluMlp`` layout)."""

    def __init__(self, dim, hidden, norm: bool = False, norm_eps: float = 1e-6):
        super().__init__()
        self.fc1 = nn.Linear(dim, 2 * hidden)
        self.norm = nn.LayerNorm(hidden, eps=norm_eps) if norm else nn.Identity()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x, residual=None):
        gate, value = self.fc1(x).chunk(2, dim=-1)
        out = self.fc2(self.norm(F.silu(gate) * value))
        return out if residual is None else residual + out


def add_mlp_branch(x, norm, mlp: Mlp, layer_scale: nn.Module, drop_path: "DropPath"):
    """``x + drop_path(layer_scale(mlp(norm(x))))``, the residual added inside ``fc2``'s output pass where the
    branch is just the MLP (no LayerScale, no active drop path), which is the same function."""
    if isinstance(layer_scale, nn.Identity) and drop_path.is_identity():
        return mlp(norm(x), residual=x)
    return x + drop_path(layer_scale(mlp(norm(x))))


class DropPath(nn.Module):
    """Stochastic depth per sample (identity at eval or p=0)."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        self.p = p

    def is_identity(self) -> bool:
        return self.p == 0.0 or not self.training

    def forward(self, x):
        if self.is_identity():
            return x
        keep = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(1 - self.p)
        return x * keep / (1 - self.p)


class LayerScale(nn.Module):
    def __init__(self, dim, layer_scale_init):
        super().__init__()
        self.gamma = nn.Parameter(layer_scale_init * torch.ones(dim))

    def forward(self, x):
        return x * self.gamma


def patch_projection(conv: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """``conv(x)``, the patch embedding's convolution, in float32 even under autocast (its output then float32).

    Measured on the dtype matrix (tests/backbones/test_dtype_matrix.py), bf16 autocast against float32: with the
    stem in bf16 the HieraDet LookHere recipe's gradients were off by 9.5e-2 (relative L2) against 1.6e-2 with
    it in float32, and the DINOv3 and RoPE-ViT layouts' outputs by 2.9e-3 against 5e-4; every other case gained a
    little. The stem is a small share of the FLOPs (ViTDet-B: under 1%)."""
    device = x.device.type
    if torch.is_autocast_enabled(device):
        with torch.autocast(device, enabled=False):
            return conv(x.float())
    return conv(x)


def check_image(x: torch.Tensor, in_chans: int, stride: int, name: str) -> None:
    """Validate a backbone input ``(B, C, H, W)``."""
    if x.dim() != 4:
        raise WinposError(f"{name} expects images as (B, C, H, W), got shape {tuple(x.shape)}")
    if x.shape[1] != in_chans:
        raise WinposError(f"{name} expects {in_chans} input channels, got {x.shape[1]}; convert the image to RGB")
    if x.shape[-1] == 0 or x.shape[-2] == 0 or x.shape[0] == 0:
        raise WinposError(f"{name} got an empty input of shape {tuple(x.shape)}; images must have nonzero size")
    if x.shape[-1] % stride or x.shape[-2] % stride:
        raise WinposError(
            f"image size {x.shape[-2]}x{x.shape[-1]} is not a multiple of the patch stride {stride}; pad it to "
            f"{-(-x.shape[-2] // stride) * stride}x{-(-x.shape[-1] // stride) * stride} (detectron2 adapters do this "
            "via size_divisibility)"
        )


# ---------------------------------------------------------------------------------------- shared by both models
def make_token_embedding(kind: str, dim: int, *, pretrain_hw, window_size, global_size, base_hw, antialias: bool,
                         init_std: float, global_init_std: float, has_cls: bool = False) -> nn.Module | None:
    """The token embedding named by ``kind`` (one of ``POS_EMBEDS``), added once after the patch embedding.

    Args:
        dim: channels.
        pretrain_hw: token grid of pretraining: where ``abs`` is stored.
        window_size: abs-win window embedding size (the first stage's window).
        global_size: abs-win global embedding grid.
        base_hw: the period of ``abswin_recursive``.
        antialias: bicubic flavour of every resize of the embedding.
        init_std: trunc-normal std of ``abs`` and of the abs-win window embedding (0: zeros).
        global_init_std: the same for the abs-win global embedding.
        has_cls: ``abs`` keeps an (unused) cls row in front, as MAE / detectron2 store it.
    Returns ``None`` for ``"none"``, else a module ``hw -> (1, H, W, dim)``.
    """
    check_choice("pos_embed", kind, POS_EMBEDS)
    if kind == "none":
        return None
    if kind == "abs":
        return AbsPosEmbed(dim, pretrain_hw=pretrain_hw, has_cls=has_cls, antialias=antialias, init_std=init_std)
    if not window_size:
        raise WinposError(f"pos_embed={kind!r} tiles a window embedding, but the window size is 0 (global "
                          "attention): give the backbone a window (window_size / window_spec / pos_window_size, "
                          "e.g. 8 or 14) or use pos_embed='abs'")
    mode = "recursive" if kind == "abswin_recursive" else "single"
    emb = AbsWinPosEmbed(dim, window_size, global_size, mode=mode, base_hw=base_hw, antialias=antialias, init_std=0.0)
    if global_init_std > 0:
        nn.init.trunc_normal_(emb.global_embed, std=global_init_std)
    if init_std > 0:
        nn.init.trunc_normal_(emb.window_embed, std=init_std)
    return emb


def init_weights(model: nn.Module, weight_init: str) -> None:
    """``"trunc_normal"`` (detectron2's ViT, timm): Linear weights ~ trunc-normal(0.02) with zero bias, LayerNorms
    at (1, 0); ``"default"`` (sam2's Hiera): PyTorch's own initialization, left as built."""
    check_choice("weight_init", weight_init, WEIGHT_INITS)
    if weight_init == "trunc_normal":
        model.apply(_trunc_normal_init)  # children first, as detectron2 (the order the random draws are made in)


def _trunc_normal_init(m: nn.Module) -> None:
    if isinstance(m, nn.Linear):
        nn.init.trunc_normal_(m.weight, std=0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.LayerNorm):
        nn.init.ones_(m.weight)
        nn.init.zeros_(m.bias)


# The one rule for "position parameter": token embeddings, relpos tables and learned RoPE frequencies. It decides
# what may keep its initialization on import (``may_keep_init``) and what ``no_weight_decay`` lists (for optimizers
# outside detectron2). The detector configs do not use it for weight decay: ``winpos.d2.optim`` follows detectron2's
# rule there (only what a config's ``overrides`` names, e.g. ``pos_embed``, is exempt; relpos tables decay).
POSITION_KEYS = ("pos_embed", "rel_pos", "rope")


def is_position_param(name: str, position_keys=POSITION_KEYS) -> bool:
    """Whether parameter ``name`` is a position parameter (its name holds one of ``position_keys``)."""
    return any(k in name for k in position_keys)


# The recipes mean the same in both families: "original" = the model as its upstream ships it (detectron2's ViTDet:
# abs + relpos everywhere; SAM2's HieraDet: abs-win), "paper" = Bolya et al.'s fix (abs-win, relpos kept only in the
# global blocks), "rope" = abs-win + axial RoPE in every block, "lookhere" = no token embedding, LookHere-45 in every
# block. LookHere-45 uses winpos's spread head layout, which earlier recipe models were trained with: the authors'
# layout for 12 heads, different at 16 (ViT-L/H, Hiera-B+/L's last stage; build with layout="official" for theirs).
LOOKHERE_45 = {"kind": "lookhere", "lookhere": {"variant": "45", "layout": "spread"}}

LAYER_SCALE_KEYS = (".ls1.", ".ls2.")


def may_keep_init(name: str) -> bool:
    """Whether a parameter a checkpoint lacks may keep its initialization on import: position parameters (new in
    many recipes) and LayerScale gains (absent from checkpoints trained without them). Any other missing
    parameter is a trunk weight: a strict import refuses the checkpoint."""
    return is_position_param(name) or any(k in name for k in LAYER_SCALE_KEYS)


class WindowedBackbone(nn.Module):
    """What ViTDet and HieraDet share besides attention: the position-parameter rule and the block step."""

    use_checkpoint: bool = False

    def no_weight_decay(self) -> set[str]:
        """Names of position parameters (token embeddings, relpos tables, learned RoPE frequencies)."""
        return {n for n, _ in self.named_parameters() if is_position_param(n)}

    def run_block(self, blk: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """``blk(x)``, with activation checkpointing when ``use_checkpoint`` is set and gradients are on."""
        if self.use_checkpoint and torch.is_grad_enabled():
            return checkpoint(blk, x, use_reentrant=False)
        return blk(x)


def check_drop_path_rate(rate) -> float:
    """``rate`` as a float in [0, 1): stochastic depth keeps a block with probability ``1 - rate``, and the last block
    gets the full rate, so 1 (or more) would drop it always and divide by 0; a negative rate is no probability."""
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate < 1:
        raise WinposError(f"drop_path_rate={rate!r} must be a number in [0, 1) (the last block's probability of being "
                          "dropped); use e.g. 0.1 (ViTDet-B), 0.4 (L) or 0.0 to turn stochastic depth off")
    return float(rate)
