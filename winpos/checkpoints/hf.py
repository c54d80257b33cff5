"""Hugging Face ``transformers`` checkpoints: told apart by their names and read through the family's own adapter.

The Hub's copies of SAM, SAM2, SAM3, Hiera, ViTDet, DINOv2, DINOv3 and ViT / ViT-MAE are mostly saved by ``transformers``
(``model.safetensors`` beside a ``config.json``), under names the authors' code never used
(``vision_encoder.layers.0.layer_norm1`` for SAM's ``image_encoder.blocks.0.norm1``). ``hf_family`` names the family a
flat state dict belongs to by keys only ``transformers`` writes; ``to_native`` renames it into the layout the family's
adapter already reads (its authors', or timm's for ViT), fusing the separate query / key / value projections of ViT
SAM3 and DINOv2 into one ``qkv``; ``adapt`` runs that adapter and gives every entry of the result its file key back, so a
load report names the keys of the file on disk. Nothing about the weights changes: a renamed tensor is the same
tensor, a fused one the rows of its parts in the order ``nn.Linear(dim, 3 * dim)`` splits them.

=============  ====================================================  =============================================
family         recognised by (under any prefix)                      read as
=============  ====================================================  =============================================
SAM            ``vision_encoder.layers.N.attn.qkv`` +                ``sam`` (``image_encoder.``)
               ``vision_encoder.patch_embed.projection``             (``SamModel``, ``SamVisionModel``)
SAM2           ``blocks.N.mlp.proj_in`` + ``pos_embed_window`` +     ``sam2`` (``image_encoder.trunk.``)
               ``patch_embed.projection`` (``Sam2Model``)
SAM3           ``embeddings.patch_embeddings.projection`` +          ``sam3`` (the file's prefix kept)
               ``layers.N.layer_norm1`` + ``layer_norm`` (ln_pre)
Hiera          ``encoder.stages.S.layers.L.attn.qkv``                ``hiera`` (official names, blocks numbered
                                                                     over the stages)
ViTDet         ``embeddings.projection`` +                           ``detectron2`` (``backbone.net.``)
               ``encoder.layer.N.attention.qkv``
DINOv3         ``embeddings.patch_embeddings`` as a bare conv +      ``dinov3`` (Meta's names; SwiGLU ``w1-w3``)
               ``[model.]layer.N.layer_scale1.lambda1``
DINOv2         ``embeddings.patch_embeddings.projection`` +          ``dinov2`` (Meta's names; SwiGLU ``w12`` / ``w3``)
               ``layer_scale1.lambda1`` and ``position_embeddings``
ViT, ViT-MAE   ``embeddings.patch_embeddings.projection`` + the      ``mae`` (timm's names)
               ``layernorm_before`` of ``encoder.layer.N`` (files
               of transformers 4) or ``layers.N`` (5)
=============  ====================================================  =============================================
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import torch

from winpos.errors import WinposError

__all__ = ["HF_FAMILIES", "HF_NOTE", "Translation", "adapt", "hf_family", "to_native"]

HF_NOTE = "Hugging Face transformers names"
# the families hf_family names, each read by the adapter of the format of the same name in formats.HF_FORMATS
HF_FAMILIES = ("sam", "sam2", "sam3", "hiera", "vitdet", "dinov3", "dinov2", "vit")


@dataclass
class Translation:
    """A state dict in its family's native names, and where each native key came from in the file."""

    state_dict: dict[str, torch.Tensor]
    origin: dict[str, str] = field(default_factory=dict)  # native key -> file key (fused: the three file keys)


def _prefix_of(sd: dict, pattern: str) -> str | None:
    """The prefix before the first key matching ``^(prefix)pattern$`` (``""`` for a bare model), or None."""
    rx = re.compile(rf"^(.*?){pattern}$")
    for key in sd:
        m = rx.match(key)
        if m:
            return m.group(1)
    return None


def _has(sd: dict, prefix: str, *names: str) -> bool:
    return all(f"{prefix}{n}" in sd for n in names)


# family -> (anchor pattern, the other keys that must exist under the same prefix)
_RULES = (
    ("sam", r"vision_encoder\.patch_embed\.projection\.weight", ("vision_encoder.layers.0.attn.qkv.weight",)),
    ("sam2", r"patch_embed\.projection\.weight", ("pos_embed_window", "blocks.0.mlp.proj_in.weight")),
    ("sam3", r"embeddings\.patch_embeddings\.projection\.weight", ("layer_norm.weight",
                                                                    "layers.0.layer_norm1.weight",
                                                                    "layers.0.attention.q_proj.weight")),
    ("hiera", r"embeddings\.patch_embeddings\.projection\.weight", ("encoder.stages.0.layers.0.attn.qkv.weight",)),
    ("vitdet", r"embeddings\.projection\.weight", ("encoder.layer.0.attention.qkv.weight",)),
)


def _dinov3_prefix(sd: dict) -> str | None:
    prefix = _prefix_of(sd, r"embeddings\.patch_embeddings\.weight")
    if prefix is None:
        return None
    if any(k.startswith(f"{prefix}{layer}0.layer_scale1.lambda1") for layer in ("layer.", "model.layer.")
           for k in sd) and f"{prefix}embeddings.position_embeddings" not in sd:
        return prefix
    return None


def _projection_prefix(sd: dict, block_key: str) -> str | None:
    """The prefix of a ViT with ``embeddings.patch_embeddings.projection`` and ``position_embeddings`` whose first
    block has ``block_key`` (transformers 4's ``encoder.layer.0.`` or 5's ``layers.0.``), or None."""
    prefix = _prefix_of(sd, r"embeddings\.patch_embeddings\.projection\.weight")
    if prefix is None or f"{prefix}embeddings.position_embeddings" not in sd:
        return None
    if _has(sd, prefix, f"encoder.layer.0.{block_key}") or _has(sd, prefix, f"layers.0.{block_key}"):
        return prefix
    return None


def _vit_prefix(sd: dict) -> str | None:
    return _projection_prefix(sd, "layernorm_before.weight")


def _dinov2_prefix(sd: dict) -> str | None:
    return _projection_prefix(sd, "layer_scale1.lambda1")


def hf_family(sd: dict) -> str | None:
    """The family (``"sam"``, ``"sam2"``, ``"sam3"``, ``"hiera"``, ``"vitdet"``, ``"dinov3"``, ``"dinov2"``,
    ``"vit"``) whose ``transformers`` names ``sd`` has, or None."""
    for family, anchor, others in _RULES:
        prefix = _prefix_of(sd, anchor)
        if prefix is not None and _has(sd, prefix, *others):
            return family
    if _dinov3_prefix(sd) is not None:
        return "dinov3"
    if _dinov2_prefix(sd) is not None:
        return "dinov2"
    if _vit_prefix(sd) is not None:
        return "vit"
    return None


# ---- renaming, one table per family: (pattern on the name under the prefix, replacement) -------------------------
_SAM = ((r"^patch_embed\.projection\.", "patch_embed.proj."), (r"^layers\.(\d+)\.layer_norm1\.", r"blocks.\1.norm1."),
        (r"^layers\.(\d+)\.layer_norm2\.", r"blocks.\1.norm2."), (r"^layers\.(\d+)\.", r"blocks.\1."),
        (r"^neck\.conv1\.", "neck.0."), (r"^neck\.layer_norm1\.", "neck.1."), (r"^neck\.conv2\.", "neck.2."),
        (r"^neck\.layer_norm2\.", "neck.3."))
_SAM2 = ((r"^patch_embed\.projection\.", "patch_embed.proj."), (r"\.layer_norm1\.", ".norm1."),
         (r"\.layer_norm2\.", ".norm2."), (r"\.mlp\.proj_in\.", ".mlp.layers.0."),
         (r"\.mlp\.proj_out\.", ".mlp.layers.1."))
_SAM3 = ((r"^embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
         (r"^embeddings\.position_embeddings$", "pos_embed"), (r"^layer_norm\.", "ln_pre."),
         (r"^layers\.(\d+)\.layer_norm1\.", r"blocks.\1.norm1."), (r"^layers\.(\d+)\.layer_norm2\.", r"blocks.\1.norm2."),
         (r"^layers\.(\d+)\.attention\.o_proj\.", r"blocks.\1.attn.proj."), (r"^layers\.(\d+)\.mlp\.", r"blocks.\1.mlp."))
_VITDET = ((r"^embeddings\.projection\.", "patch_embed.proj."), (r"^embeddings\.position_embeddings$", "pos_embed"),
           (r"^encoder\.layer\.(\d+)\.attention\.", r"blocks.\1.attn."), (r"^encoder\.layer\.(\d+)\.", r"blocks.\1."))
_DINOV3 = ((r"^embeddings\.patch_embeddings\.", "patch_embed.proj."), (r"^embeddings\.cls_token$", "cls_token"),
           (r"^embeddings\.mask_token$", "mask_token"), (r"^embeddings\.register_tokens$", "storage_tokens"),
           (r"^rope_embeddings\.", "rope_embed."),
           (r"^(?:model\.)?layer\.(\d+)\.layer_scale1\.lambda1$", r"blocks.\1.ls1.gamma"),
           (r"^(?:model\.)?layer\.(\d+)\.layer_scale2\.lambda1$", r"blocks.\1.ls2.gamma"),
           (r"^(?:model\.)?layer\.(\d+)\.attention\.o_proj\.", r"blocks.\1.attn.proj."),
           (r"^(?:model\.)?layer\.(\d+)\.attention\.([qv])_proj\.", r"blocks.\1.attn.\2_proj."),
           (r"^(?:model\.)?layer\.(\d+)\.attention\.k_proj\.weight$", r"blocks.\1.attn.k_proj.weight"),
           (r"^(?:model\.)?layer\.(\d+)\.attention\.k_proj\.bias$", r"blocks.\1.attn.k_bias"),
           (r"^(?:model\.)?layer\.(\d+)\.mlp\.gate_proj\.", r"blocks.\1.mlp.w1."),
           (r"^(?:model\.)?layer\.(\d+)\.mlp\.down_proj\.", r"blocks.\1.mlp.DOWN."),
           (r"^(?:model\.)?layer\.(\d+)\.mlp\.up_proj\.", r"blocks.\1.mlp.UP."),
           (r"^(?:model\.)?layer\.(\d+)\.", r"blocks.\1."))
_LAYER = r"^(?:encoder\.layer|layers)\.(\d+)\."
_DINOV2 = ((r"^embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
           (r"^embeddings\.position_embeddings$", "pos_embed"), (r"^embeddings\.cls_token$", "cls_token"),
           (r"^embeddings\.mask_token$", "mask_token"), (r"^embeddings\.register_tokens$", "register_tokens"),
           (r"^layernorm\.", "norm."), (_LAYER + r"layer_scale1\.lambda1$", r"blocks.\1.ls1.gamma"),
           (_LAYER + r"layer_scale2\.lambda1$", r"blocks.\1.ls2.gamma"),
           (_LAYER + r"attention\.(?:output\.dense|o_proj)\.", r"blocks.\1.attn.proj."),
           (_LAYER + r"mlp\.weights_in\.", r"blocks.\1.mlp.w12."), (_LAYER + r"mlp\.weights_out\.", r"blocks.\1.mlp.w3."),
           (_LAYER + r"mlp\.gate_proj\.", r"blocks.\1.mlp.w1."), (_LAYER + r"mlp\.up_proj\.", r"blocks.\1.mlp.w2."),
           (_LAYER + r"mlp\.down_proj\.", r"blocks.\1.mlp.w3."), (_LAYER, r"blocks.\1."))
_VIT = ((r"^embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
        (r"^embeddings\.position_embeddings$", "pos_embed"), (r"^embeddings\.cls_token$", "cls_token"),
        (r"^embeddings\.mask_token$", "mask_token"), (r"^layernorm\.", "norm."), (r"^pooler\.", "head.pooler."),
        (r"^(?:encoder\.layer|layers)\.(\d+)\.layernorm_before\.", r"blocks.\1.norm1."),
        (r"^(?:encoder\.layer|layers)\.(\d+)\.layernorm_after\.", r"blocks.\1.norm2."),
        (r"^(?:encoder\.layer|layers)\.(\d+)\.attention\.(?:output\.dense|o_proj)\.", r"blocks.\1.attn.proj."),
        (r"^(?:encoder\.layer|layers)\.(\d+)\.(?:intermediate\.dense|mlp\.fc1)\.", r"blocks.\1.mlp.fc1."),
        (r"^(?:encoder\.layer|layers)\.(\d+)\.(?:output\.dense|mlp\.fc2)\.", r"blocks.\1.mlp.fc2."))
_TABLES = {"sam": _SAM, "sam2": _SAM2, "sam3": _SAM3, "vitdet": _VITDET, "dinov3": _DINOV3, "dinov2": _DINOV2,
           "vit": _VIT}
# the prefix the family's adapter expects in place of the file's (None: keep the file's)
_NATIVE_PREFIX = {"sam": "image_encoder.", "sam2": "image_encoder.trunk.", "sam3": None, "hiera": "",
                  "vitdet": "backbone.net.", "dinov3": "", "dinov2": "", "vit": ""}
# outside the prefix: keys renamed so the adapter names them (a ViT classifier is timm's ``head``)
_OUTSIDE = {"vit": ((r"^classifier\.", "head."),), "hiera": ((r"^classifier\.", "head."),),
            "dinov2": ((r"^classifier\.", "head."),)}
_QKV = {  # families whose query / key / value are separate in transformers and fused in the native layout
    "sam3": re.compile(r"^layers\.(\d+)\.attention\.([qkv])_proj\.(weight|bias)$"),
    "vit": re.compile(r"^(?:encoder\.layer|layers)\.(\d+)\.attention\.(?:attention\.)?(q|k|v|query|key|value)"
                      r"(?:_proj)?\.(weight|bias)$"),
}
_QKV["dinov2"] = _QKV["vit"]


def _rename(name: str, table) -> str | None:
    for pattern, repl in table:
        new, n = re.subn(pattern, repl, name, count=1)
        if n:
            return new
    return None


def _hiera_names(names: list[str]) -> dict[str, str]:
    """Official Hiera numbers its blocks over the stages; transformers numbers them per stage."""
    rx = re.compile(r"^encoder\.stages\.(\d+)\.layers\.(\d+)\.(.+)$")
    depth: dict[int, int] = {}
    for name in names:
        m = rx.match(name)
        if m:
            s, i = int(m.group(1)), int(m.group(2))
            depth[s] = max(depth.get(s, 0), i + 1)
    start, first = 0, {}
    for s in sorted(depth):
        first[s] = start
        start += depth[s]
    out = {}
    for name in names:
        m = rx.match(name)
        if m:
            rest = m.group(3).replace("layernorm_before.", "norm1.").replace("layernorm_after.", "norm2.")
            out[name] = f"blocks.{first[int(m.group(1))] + int(m.group(2))}.{rest}"
        elif name.startswith("embeddings.patch_embeddings.projection."):
            out[name] = "patch_embed.proj." + name.rpartition(".")[2]
        elif name == "embeddings.position_embeddings":
            out[name] = "pos_embed"
        elif name.startswith("pooler."):
            out[name] = "norm." + name.rpartition(".")[2] if name.startswith("pooler.layernorm.") else name
    return out


def to_native(sd: dict, family: str | None = None) -> Translation:
    """``sd`` (``transformers`` names of ``family``; default ``hf_family(sd)``) in the family's native names."""
    family = family or hf_family(sd)
    if family is None:
        raise WinposError("the checkpoint is not in Hugging Face transformers names (no SAM, SAM2, SAM3, Hiera, ViTDet, "
                          "DINOv2, DINOv3 or ViT layout found)")
    anchors = {f: a for f, a, _ in _RULES}
    if family == "dinov3":
        prefix = _dinov3_prefix(sd)
    elif family == "vit":
        prefix = _vit_prefix(sd)
    elif family == "dinov2":
        prefix = _dinov2_prefix(sd)
    else:
        prefix = _prefix_of(sd, anchors[family])
    if family == "sam":
        prefix += "vision_encoder."
    native_prefix = prefix if _NATIVE_PREFIX[family] is None else _NATIVE_PREFIX[family]
    inside = [k[len(prefix):] for k in sd if k.startswith(prefix)]
    hiera = _hiera_names(inside) if family == "hiera" else {}
    out, origin, parts = {}, {}, {}
    for key, value in sd.items():
        if not key.startswith(prefix):
            new = _rename(key, _OUTSIDE.get(family, ())) or key
            out[new], origin[new] = value, key
            continue
        name = key[len(prefix):]
        qkv = _QKV.get(family)
        m = qkv.match(name) if qkv else None
        if m:
            parts.setdefault((m.group(1), m.group(3)), {})[m.group(2)[0]] = (key, value)
            continue
        new = hiera.get(name) if family == "hiera" else _rename(name, _TABLES[family])
        new = native_prefix + (new or name)
        if family == "dinov3":
            new = _dinov3_mlp(new, sd, key)
        if new in out:
            raise WinposError(f"'{key}' and '{origin[new]}' both map to '{new}'; the file mixes two layouts")
        out[new], origin[new] = value, key
    for (block, part), found in sorted(parts.items()):
        if set(found) != {"q", "k", "v"}:
            raise WinposError(f"block {block} has the {part} of its {'/'.join(sorted(found))} projection but not all "
                              "three of query / key / value; the file is incomplete")
        new = f"{native_prefix}blocks.{block}.attn.qkv.{part}"
        out[new] = torch.cat([found["q"][1], found["k"][1], found["v"][1]], dim=0)
        origin[new] = " + ".join(found[c][0] for c in "qkv")
    if family == "dinov3":
        _check_key_bias(out, origin)
    return Translation(out, origin)


def _dinov3_mlp(new: str, sd: dict, key: str) -> str:
    """DINOv3's MLP: ``up_proj`` / ``down_proj`` are ``fc1`` / ``fc2``; with a ``gate_proj`` (SwiGLU, S+ and H+) they
    are Meta's ``w2`` / ``w3`` (``w1`` the gate)."""
    if ".mlp.UP." not in new and ".mlp.DOWN." not in new:
        return new
    gated = key.replace(".up_proj.", ".gate_proj.").replace(".down_proj.", ".gate_proj.") in sd
    if ".mlp.UP." in new:
        return new.replace(".mlp.UP.", ".mlp.w2." if gated else ".mlp.fc1.")
    return new.replace(".mlp.DOWN.", ".mlp.w3." if gated else ".mlp.fc2.")


def _check_key_bias(out: dict, origin: dict) -> None:
    """DINOv3 trains no key bias (Meta masks it; transformers writes ``k_proj.bias`` only when asked): a non-zero
    one would be dropped by the target, which holds the key bias at zero, so it is refused."""
    for key, value in out.items():
        if key.endswith(".attn.k_bias") and bool(value.abs().max() > 0):
            raise WinposError(f"'{origin[key]}' is a non-zero key bias; winpos's DINOv3 block holds the key bias at zero "
                              "(as DINOv3 trains it), so this file's attention cannot be reproduced")


def adapt(sd: dict, fmt, native_adapt):
    """``native_adapt`` (the family's adapter) on ``sd`` in native names, every file key in the result given back
    as it is in the file; ``source`` says the names were transformers'."""
    tr = to_native(sd)
    a = native_adapt(tr.state_dict)

    def back(key: str) -> str:
        return tr.origin.get(key, key)

    a.trunk = {name: (back(key), value) for name, (key, value) in a.trunk.items()}
    a.ignored = [(back(key), why, known) for key, why, known in a.ignored]
    a.lost = [(back(key), why) for key, why in a.lost]
    a.prefix = ""  # every key of the file is renamed: none counts as matched under a prefix
    if a.position is not None:
        p = a.position
        a.position = replace(p, grid_key=back(p.grid_key) if p.grid_key else "",
                             global_key=back(p.global_key) if p.global_key else "",
                             window_key=back(p.window_key) if p.window_key else "")
    a.source = f"{fmt} ({HF_NOTE})"
    return a
