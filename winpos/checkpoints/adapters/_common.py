"""Helpers the adapters share: container prefixes, flat absolute embeddings and abs-win pairs, and the one block
vocabulary of the RoPE-pretrained ViTs (DINOv3, EVA-02, RoPE-ViT)."""
from __future__ import annotations

import re

import torch

from winpos.checkpoints.convert import Adapted, Position
from winpos.errors import WinposError
from winpos.posemb.interp import split_flat_embedding


def strip_prefix(adapted: Adapted, state_dict: dict, prefix: str, outside: str) -> dict[str, str]:
    """``{name inside the prefix: file key}``; when no key has ``prefix`` every key is inside (a bare trunk).

    Keys outside the prefix are reported with the reason ``outside`` and the prefix is recorded, so that a tensor
    under its own name inside the container counts as matched.
    """
    if not any(k.startswith(prefix) for k in state_dict):
        return {k: k for k in state_dict}
    adapted.prefix = prefix
    for k in state_dict:
        if not k.startswith(prefix):
            adapted.ignore(k, outside)
    return {k[len(prefix):]: k for k in state_dict if k.startswith(prefix)}


def flat_abs(key: str, value: torch.Tensor, has_cls: bool | None = None) -> Position:
    """``Position`` of a flat absolute embedding ``(1, [1+]N, C)`` stored under ``key`` (a cls row split off;
    ``has_cls`` None: detected from N)."""
    grid, cls = split_flat_embedding(value, key, has_cls=has_cls)
    return Position("abs", grid=grid, cls=cls, grid_key=key, stored_shape=tuple(value.shape))


def abswin_pair(found: dict[str, tuple[str, torch.Tensor]], antialias: bool) -> Position:
    """``Position`` of an abs-win pair found as ``{"global": (key, t), "window": (key, t)}``; both are required."""
    if "window" not in found or "global" not in found:
        have, lack = ("global", "window") if "global" in found else ("window", "global")
        raise WinposError(f"the checkpoint has the {have} part of an abs-win embedding ('{found[have][0]}') but no "
                          f"{lack} part; the file is incomplete")
    (gkey, g), (wkey, w) = found["global"], found["window"]
    return Position("abswin", global_embed=g, window_embed=w, global_key=gkey, window_key=wkey, antialias=antialias)


# Why the three RoPE-pretrained families' prefix tokens do not load (their adapters report it with each key).
CLS_TOKEN = ("ViTDet keeps no cls token (detectron2 drops MAE's the same way): in window blocks a token outside the "
             "grid has no window")
REGISTER_TOKENS = ("ViTDet keeps no register / storage tokens: a window block has no place for a token outside the "
                   "grid (every window would have to attend to them, an attention term the kernels do not have); the "
                   "patch tokens no longer attend to them, which changes the trunk's features: a loss")
FINAL_NORM = "final norm of the pretraining model; ViTDet's trunk ends at the last block"


def fold_qkv(adapted: Adapted, block: str, q, k, v, q_bias=None, v_bias=None, bias_mask=None) -> None:
    """Store a block's query / key / value projections as one ``attn.qkv`` (rows q, k, v, as ``nn.Linear(dim,
    3 dim)`` splits them). ``q`` / ``k`` / ``v``: ``(file key, weight)`` or None when the weight is already fused in
    ``q``. A query / value bias without a key bias gets zeros in the key rows (the target holds them at zero with
    ``BlockOptions(k_bias=False)``); ``bias_mask``: DINOv3's ``(file key, mask)`` on a fused bias."""
    if k is None:
        key, weight = q
    else:
        key = q[0]
        weight = torch.cat([q[1], k[1], v[1]], dim=0)
    adapted.trunk[f"{block}.attn.qkv.weight"] = (key, weight)
    if q_bias is not None and v_bias is not None:
        adapted.trunk[f"{block}.attn.qkv.bias"] = (q_bias[0], torch.cat([q_bias[1], torch.zeros_like(q_bias[1]),
                                                                          v_bias[1]]))
    elif q_bias is not None:  # a fused bias (q_bias holds all three parts)
        key, bias = q_bias
        if bias_mask is not None and torch.isfinite(bias_mask[1]).all():
            bias = bias * bias_mask[1].to(bias.dtype)
        adapted.trunk[f"{block}.attn.qkv.bias"] = (key, bias)


def fold_swiglu(adapted: Adapted, block: str, gate, value) -> None:
    """A SwiGLU's gate and value projections ``(file key, tensor)`` as winpos's packed ``mlp.fc1`` (gate rows
    first)."""
    for part in ("weight", "bias"):
        if part in gate:
            adapted.trunk[f"{block}.mlp.fc1.{part}"] = (gate[part][0], torch.cat([gate[part][1], value[part][1]]))


_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)$")
# One block vocabulary for DINOv3, EVA-02 and RoPE-ViT, in their authors' names and timm's: -> winpos's name.
_SAME = {"norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias", "attn.proj.weight", "attn.proj.bias",
         "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias", "ls1.gamma", "ls2.gamma"}
_RENAMED = {"gamma_1": "ls1.gamma", "gamma_2": "ls2.gamma", "mlp.w12.weight": "mlp.fc1.weight",
            "mlp.w12.bias": "mlp.fc1.bias", "mlp.w3.weight": "mlp.fc2.weight", "mlp.w3.bias": "mlp.fc2.bias",
            "mlp.ffn_ln.weight": "mlp.norm.weight", "mlp.ffn_ln.bias": "mlp.norm.bias",
            "mlp.norm.weight": "mlp.norm.weight", "mlp.norm.bias": "mlp.norm.bias"}
_GATE = {"mlp.w1": "gate", "mlp.fc1_g": "gate", "mlp.w2": "value", "mlp.fc1_x": "value"}
_ATTN = {"attn.qkv.weight", "attn.qkv.bias", "attn.qkv.bias_mask", "attn.q_bias", "attn.v_bias", "attn.k_bias",
         "attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight", "attn.q_proj.bias", "attn.v_proj.bias"}


def rope_vit_blocks(adapted: Adapted, blocks: dict[str, dict[str, tuple[str, torch.Tensor]]]) -> None:
    """The blocks of a DINOv3 / EVA-02 / RoPE-ViT file (``{"blocks.N": {rest of the key: (file key, tensor)}}``) in
    winpos ViTDet names: LayerScale ``gamma_1`` -> ``ls1.gamma``; separate or fused q / k / v and a query / value
    bias -> ``attn.qkv``; SwiGLU ``w1`` + ``w2`` (or timm's ``fc1_g`` + ``fc1_x``) -> packed ``mlp.fc1``, ``w3`` ->
    ``mlp.fc2``, the sub-LN ``ffn_ln`` -> ``mlp.norm``. An attention-output LN (EVA-02 CLIP) is refused."""
    for block, parts in blocks.items():
        attn, swiglu = {}, {"gate": {}, "value": {}}
        for rest, (key, value) in parts.items():
            if rest in _SAME:
                adapted.trunk[f"{block}.{rest}"] = (key, value)
            elif rest in _RENAMED:
                adapted.trunk[f"{block}.{_RENAMED[rest]}"] = (key, value)
            elif rest in _ATTN:
                attn[rest] = (key, value)
            elif rest.rpartition(".")[0] in _GATE:
                head, _, part = rest.rpartition(".")
                swiglu[_GATE[head]][part] = (key, value)
            elif rest.startswith(("attn.inner_attn_ln.", "attn.norm.")):
                raise WinposError(f"'{key}' is a LayerNorm on the attention output (EVA-02 CLIP towers); winpos's "
                                  "ViTDet block has none: convert an EVA-02 MIM or detection checkpoint instead")
            elif "rope" in rest:
                adapted.ignore(key, "fixed RoPE buffer; winpos computes the rotation from its options")
            else:
                adapted.ignore(key, "not part of a ViT block winpos knows", known=False)
        if swiglu["gate"] or swiglu["value"]:
            if set(swiglu["gate"]) != set(swiglu["value"]):
                raise WinposError(f"{block} has a SwiGLU gate without its value projection (or the reverse); the file "
                                  "is incomplete")
            fold_swiglu(adapted, block, swiglu["gate"], swiglu["value"])
        if "attn.qkv.weight" in attn:
            fold_qkv(adapted, block, attn["attn.qkv.weight"], None, None,
                     q_bias=attn.get("attn.q_bias", attn.get("attn.qkv.bias")), v_bias=attn.get("attn.v_bias"),
                     bias_mask=attn.get("attn.qkv.bias_mask"))
        elif "attn.q_proj.weight" in attn:
            fold_qkv(adapted, block, attn["attn.q_proj.weight"], attn["attn.k_proj.weight"],
                     attn["attn.v_proj.weight"], q_bias=attn.get("attn.q_bias", attn.get("attn.q_proj.bias")),
                     v_bias=attn.get("attn.v_bias", attn.get("attn.v_proj.bias")))
        for rest in ("attn.qkv.bias_mask", "attn.k_bias"):
            if rest in attn:
                adapted.ignore(attn[rest][0], "fixed key-bias mask / zero key bias: the target holds the key bias "
                                              "at zero (BlockOptions(k_bias=False))")


def split_blocks(state_dict: dict, prefix: str = "") -> tuple[dict, dict]:
    """``(blocks, others)``: ``{"blocks.N": {rest: (file key, tensor)}}`` for the block keys under ``prefix`` and
    ``{name: file key}`` for the other keys under it."""
    blocks, others = {}, {}
    for key in state_dict:
        if not key.startswith(prefix):
            continue
        name = key[len(prefix):]
        m = _BLOCK.match(name)
        if m:
            blocks.setdefault(f"blocks.{m.group(1)}", {})[m.group(2)] = (key, state_dict[key])
        else:
            others[name] = key
    return blocks, others


def rope_vit_top_level(adapted: Adapted, name: str, key: str, value: torch.Tensor, family: str) -> None:
    """The keys outside the blocks that DINOv3, EVA-02 and RoPE-ViT files share: the cls token (dropped), the final
    norms and classifier (ignored), the patch embedding (kept); any other key is reported as unknown."""
    if name == "cls_token":
        adapted.ignore(key, CLS_TOKEN)
    elif name.startswith(("norm.", "fc_norm.")):
        adapted.ignore(key, FINAL_NORM)
    elif name.startswith("head."):
        adapted.ignore(key, "classifier head")
    elif name.startswith("patch_embed."):
        adapted.trunk[name] = (key, value)
    else:
        adapted.ignore(key, f"not part of the {family} trunk", known=False)
