"""The doctor: will this model interpolate an absolute position embedding under window attention at this size?

It inspects a winpos backbone (built from a preset or from a LazyConfig's backbone node, on the meta device so
even ViT-H costs nothing) and reports, for the requested image size, whether the token embedding is naively
resized while blocks attend in windows whose period no longer matches the embedding's, which blocks are affected,
and the fix.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from winpos.posemb.abswin import AbsPosEmbed, AbsWinPosEmbed


@dataclass
class DoctorReport:
    target: str
    image_size: int
    ok: bool
    embedding: str
    grid: tuple
    pretrain_grid: tuple | None = None
    affected_blocks: list = field(default_factory=list)
    lines: list = field(default_factory=list)
    fix: str = ""

    def text(self) -> str:
        head = "OK" if self.ok else "BUG"
        out = [f"[{head}] {self.target} at {self.image_size} px: {self.embedding}"] + [f"  {ln}" for ln in self.lines]
        if self.fix:
            out.append(f"  fix: {self.fix}")
        return "\n".join(out)


def _stride(net) -> int:
    return getattr(net, "patch_size", None) or net.strides[0]


def _window_blocks(net) -> list[tuple[int, int]]:
    return [(i, blk.attn.window_size) for i, blk in enumerate(net.blocks) if blk.attn.window_size]


def diagnose_backbone(net, image_size: int, name: str = "model") -> DoctorReport:
    """Check one winpos backbone (HieraDet or ViTDet) at a square ``image_size``."""
    if image_size <= 0:
        raise ValueError(f"image_size={image_size} must be positive")
    stride = _stride(net)
    grid = (-(-image_size // stride),) * 2
    windows = _window_blocks(net)
    pe = net.pos_embed
    terms = sorted({blk.attn.position.kind for blk in net.blocks} - {"none"})
    term_note = f"block terms: {', '.join(terms)}" if terms else "no block position terms"
    if pe is None:
        return DoctorReport(name, image_size, True, f"no token embedding; {term_note}", grid,
                            lines=["nothing is interpolated: position comes only from the block terms"])
    if isinstance(pe, AbsWinPosEmbed):
        w = tuple(pe.window_embed.shape[-2:])
        return DoctorReport(name, image_size, True, f"abs-win ({pe.mode}), window embedding {w[0]}x{w[1]}; {term_note}",
                            grid, lines=[f"the window embedding is tiled, never resized: every window sees the same "
                                         f"embedding at {grid[0]}x{grid[1]} tokens"])
    if not isinstance(pe, AbsPosEmbed):
        raise ValueError(f"unknown token embedding {type(pe).__name__}; the doctor knows AbsPosEmbed and AbsWinPosEmbed")
    pre = pe.pretrain_hw
    report = DoctorReport(name, image_size, True, f"absolute embedding stored at {pre[0]}x{pre[1]} tokens, naively "
                          f"interpolated; {term_note}", grid, pretrain_grid=pre)
    if grid == pre:
        report.lines.append(f"the token grid {grid[0]}x{grid[1]} equals the pretraining grid: no interpolation")
        return report
    scale = grid[0] / pre[0]
    report.lines.append(f"interpolates {pre[0]}x{pre[1]} -> {grid[0]}x{grid[1]} tokens (x{scale:.3g}, bicubic)")
    if not windows:
        report.lines.append("every block attends globally, so no window sees a misaligned piece")
        return report
    report.ok = False
    report.affected_blocks = [i for i, _ in windows]
    sizes = sorted({w for _, w in windows})
    report.lines.append(
        f"{len(windows)} window blocks ({', '.join(str(i) for i, _ in windows)}) attend in "
        f"{'/'.join(str(s) for s in sizes)}-token windows, but the embedding's pattern is stretched by x{scale:.3g}: "
        "windows no longer see the same embedding (Bolya et al. 2024)")
    report.fix = ("use recipe='paper' (abs-win) or convert the checkpoint on import: "
                  "tools/convert_checkpoint.py --input CKPT --output OUT --to PRESET --pos-embed abswin")
    return report


def _build_from_config(path: str, overrides=()):
    """Return (winpos backbone on the meta device, default image size) from a LazyConfig file."""
    from detectron2.config import LazyConfig

    from winpos.backbones import create

    cfg = LazyConfig.apply_overrides(LazyConfig.load(path), list(overrides))
    node = cfg.model.backbone
    for attr in ("net", "bottom_up"):
        if attr in node and hasattr(node[attr], "get") and node[attr].get("recipe") is not None:
            node = node[attr]
            break
    else:
        raise ValueError(f"{path}: no winpos backbone node (model.backbone.net or model.backbone.bottom_up with "
                         "net= and recipe=) was found; the doctor checks winpos configs")
    kwargs = {k: v for k, v in node.items() if k not in ("_target_", "net", "recipe", "out_feature", "out_features",
                                                         "norm")}
    with torch.device("meta"):
        net = create(node["net"], recipe=node["recipe"], **kwargs)
    return net, int(kwargs.get("img_size", 1024)), f"{path} ({node['net']}, recipe {node['recipe']})"


def diagnose(target: str, image_size: int | None = None, recipe: str = "original", overrides=()) -> DoctorReport:
    """``target``: a LazyConfig ``.py`` file or a preset name; ``overrides``: ``key=value`` strings (config keys for a
    config, constructor arguments for a preset)."""
    if target.endswith(".py"):
        net, default_size, name = _build_from_config(target, overrides)
    else:
        from winpos.backbones import create

        kwargs = {}
        for item in overrides:
            if "=" not in item:
                raise ValueError(f"override {item!r} must look like key=value")
            k, v = item.split("=", 1)
            kwargs[k] = int(v) if v.isdigit() else v
        with torch.device("meta"):
            net = create(target, recipe=recipe, **kwargs)
        default_size, name = int(kwargs.get("img_size", 1024)), f"preset {target} (recipe {recipe})"
    return diagnose_backbone(net, image_size or default_size, name)
