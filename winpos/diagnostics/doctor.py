"""The doctor: will this model interpolate an absolute position embedding under window attention at this size?

It inspects a winpos backbone (built from a preset or from a LazyConfig's backbone node, on the meta device so
even ViT-H costs nothing) and reports, for the requested image size, whether the token embedding is naively
resized while blocks attend in windows whose period no longer matches the embedding's, which blocks are affected,
and the fix.

This module needs no detectron2: it checks a built backbone or a preset. ``winpos.d2.doctor.diagnose`` adds
LazyConfig targets, loaded with winpos's strict override loader (an override that names no key, or gives a value
of the wrong type, is an error, never silently ignored). Every bad input raises a ``WinposError`` naming it and
the fix.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from winpos.errors import WinposError, as_hw
from winpos.posemb.abswin import AbsPosEmbed, AbsWinPosEmbed

__all__ = ["build_checked", "check_image_size", "diagnose_backbone", "diagnose_preset", "DoctorReport", "fix_text"]


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


def fix_text(preset: str | None = None, config: str | None = None, recipe_key: str | None = None) -> str:
    """The fix for an interpolated absolute embedding, as things to paste: the config override (or the doctor's
    ``--recipe`` for a preset) that selects the abs-win recipe, and the converter command with the preset filled in
    (CKPT / OUT are the user's files)."""
    to = preset or "PRESET"
    convert = f"winpos-convert --input CKPT --output OUT.safetensors --to {to} --recipe paper"
    if config and recipe_key:
        use = (f"add the override {recipe_key}=paper (abs-win), e.g. winpos-train --config-file {config} "
               f"{recipe_key}=paper")
    elif preset:
        use = f"build it with recipe paper (abs-win): winpos-posemb doctor {preset} --recipe paper"
    else:
        use = "build it with recipe='paper' (abs-win)"
    return f"{use}\n       and convert its checkpoint on import: {convert}"


def diagnose_backbone(net, image_size: int, name: str = "model", fix: str | None = None) -> DoctorReport:
    """Check one winpos backbone (HieraDet or ViTDet) at a square ``image_size``. ``fix``: the fix to print when the
    bug is present (``fix_text``; default: the generic one)."""
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size <= 0:
        raise WinposError(f"image_size={image_size!r} must be a positive number of pixels, e.g. 1024")
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
        raise WinposError(f"unknown token embedding {type(pe).__name__}; the doctor knows AbsPosEmbed and AbsWinPosEmbed")
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
    report.fix = fix or fix_text()
    return report


def build_checked(create, preset, recipe, kwargs, where):
    """``create(preset, recipe=recipe, **kwargs)``; an argument the backbone does not take is a WinposError."""
    try:
        return create(preset, recipe=recipe, **kwargs)
    except TypeError as e:  # an argument the backbone does not take
        raise WinposError(f"{where}: {e}; remove that argument or check its spelling") from e


def _parse_value(text: str):
    """A preset override value: int, float, true/false/none, a (h, w) pair ``224,320``, or a string."""
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str) and "," in value:
        parts = [_parse_value(p.strip()) for p in value.split(",")]
        return tuple(parts) if all(isinstance(p, int) for p in parts) else value
    return value


def diagnose_preset(preset: str, image_size: int | None = None, recipe: str = "original",
                    overrides=()) -> DoctorReport:
    """Check backbone preset ``preset`` (``winpos.backbones.create``) built with ``recipe`` and ``overrides``
    (``key=value`` constructor arguments) at ``image_size`` (None: the model's own size). A LazyConfig target
    goes through ``winpos.d2.doctor.diagnose``, which loads the config with detectron2."""
    import os

    from winpos.backbones import create
    from winpos.backbones.registry import PRESETS, _import_models

    check_image_size(image_size)
    _import_models()
    if preset not in PRESETS and (os.path.exists(preset) or os.sep in preset or "." in preset):
        raise WinposError(f"{preset!r} is neither a LazyConfig .py file nor a backbone preset; pass a config "
                          f"such as configs/COCO/mask_rcnn_vitdet_b_100ep.py or a preset "
                          f"({', '.join(sorted(PRESETS))})")
    kwargs = {}
    for item in overrides:
        if "=" not in item or not item.split("=", 1)[0]:
            raise WinposError(f"override {item!r} must look like key=value, e.g. img_size=448")
        k, v = item.split("=", 1)
        kwargs[k] = _parse_value(v)
    with torch.device("meta"):
        net = build_checked(create, preset, recipe, kwargs, f"preset {preset}")
    default_size = max(as_hw(kwargs.get("img_size", 1024), "img_size"))
    return diagnose_backbone(net, image_size or default_size, f"preset {preset} (recipe {recipe})",
                             fix=fix_text(preset))


def check_image_size(image_size) -> None:
    """``image_size`` must be None (the model's own size) or a positive int."""
    if image_size is not None and (isinstance(image_size, bool) or not isinstance(image_size, int) or
                                   image_size <= 0):
        raise WinposError(f"--image-size {image_size!r} must be a positive number of pixels, e.g. 1024 (leave it out "
                          "for the model's own size)")


if __name__ == "__main__":  # a library module: name the command instead of exiting 0 having done nothing
    print("error: winpos.diagnostics.doctor is a library module, not a command; run winpos-posemb doctor (--help "
          "says how)", file=__import__("sys").stderr)
    raise SystemExit(2)
