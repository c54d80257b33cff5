"""Which winpos presets a checkpoint's trunk fits: its embedding width and depth against the preset tables
(``winpos.backbones.hieradet.SIZES`` / ``vitdet.SIZES``, and for DINOv3 / EVA-02 / RoPE-ViT files their family's in
``winpos.backbones.rope_vits``, for DINOv2 files ``winpos.backbones.dinov2``), for the ``--to`` a tool's advice fills in."""
from __future__ import annotations

import torch

from winpos.checkpoints.formats import Format

__all__ = ["matching_presets", "trunk_width_depth"]


def trunk_width_depth(trunk: dict) -> tuple[int | None, int | None]:
    """``(embedding width, number of blocks)`` of a trunk state dict in winpos names (None where not told)."""
    patch = trunk.get("patch_embed.proj.weight")
    width = int(patch.shape[0]) if isinstance(patch, torch.Tensor) and patch.dim() == 4 else None
    blocks = {int(k.split(".")[1]) for k in trunk if k.startswith("blocks.") and k.split(".")[1].isdigit()}
    return width, (max(blocks) + 1 if blocks else None)


def matching_presets(fmt: Format, width: int | None, depth: int | None) -> list[str]:
    """Presets of the checkpoint's architecture with embedding width ``width`` (and ``depth`` blocks, when known)."""
    from winpos.backbones import dinov2, hieradet, rope_vits, vitdet

    if width is None:
        return []
    tables = [t for t, ok in ((hieradet.SIZES, fmt.is_hiera), (vitdet.SIZES, fmt.is_vit)) if ok]
    family = {Format.DINOV3: rope_vits.DINOV3[0], Format.EVA02: rope_vits.EVA02[0], Format.ROPE_VIT: rope_vits.ROPE_VIT[0],
              Format.DINOV2: dinov2.SIZES}
    if fmt in family:  # the family's own presets first: they hold its LayerScale, SwiGLU and frequencies
        tables.insert(0, family[fmt])
    found = []
    for table in tables:
        for name, size in table.items():
            d = size.get("depth") or sum(size.get("stages", ()))
            if size["embed_dim"] == width and (depth is None or d == depth):
                found.append(name)
    return found
