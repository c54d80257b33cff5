"""The doctor: what does each position term of this model see at this image size?

It inspects a winpos backbone (built from a preset or from a LazyConfig's backbone node, on the meta device so
even ViT-H costs nothing) and reports, for the requested image size:

* the token embedding: whether it is naively resized while blocks attend in windows whose period no longer matches
  the embedding's ([BUG], exit status 1), which blocks are affected, and the fix;
* the block terms (``winpos.diagnostics.terms``): RoPE positions and rotation angles per block kind against the
  trained range (extrapolation, compression, aliasing), and how relpos tables are resampled ([WARN] where the
  blocks see what training never showed them; a warning is not a bug and keeps exit status 0);
* what padding the token grid to whole windows costs (``window_padding``): extra tokens per window size, and the
  window sizes that would tile the grid (a cost, never part of the verdict).

This module needs no detectron2: it checks a built backbone or a preset. ``winpos.d2.doctor.diagnose`` adds
LazyConfig targets, loaded with winpos's strict override loader (an override that names no key, or gives a value
of the wrong type, is an error, never silently ignored). Every bad input raises a ``WinposError`` naming it and
the fix.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from winpos.errors import WinposError, as_hw
from winpos.diagnostics.terms import block_grids, token_stride
from winpos.posemb.abswin import AbsPosEmbed, AbsWinPosEmbed

__all__ = ["build_checked", "check_image_size", "diagnose_backbone", "diagnose_preset", "doctor_json", "DoctorReport",
           "fix_text", "JSON_SCHEMA_VERSION", "keeps_block_terms", "load_state", "window_padding"]


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
    terms: list = field(default_factory=list)  # winpos.diagnostics.terms.TermReport per (term, block kind)
    window_sizes: list = field(default_factory=list)  # of the affected window blocks (the bug's figure draws them)
    padding: list = field(default_factory=list)  # window_padding's findings: cost, never a verdict

    @property
    def warn(self) -> bool:
        """A block term sees what training never showed it (not a bug: exit status 0)."""
        return any(t.level == "WARN" for t in self.terms)

    @property
    def verdict(self) -> str:
        """``"BUG"`` (exit status 1), ``"WARN"`` or ``"OK"`` (both exit status 0): the first line's bracket."""
        return "BUG" if not self.ok else "WARN" if self.warn else "OK"

    def to_dict(self) -> dict:
        """The report as plain JSON values: what ``text`` prints, with each block term's numbers
        (``TermReport.to_dict``); grids are ``[h, w]`` token counts, ``pretrain_grid`` None without an absolute
        embedding, ``fix`` one line per step without the printed indent ("" when there is no bug)."""
        return {"target": self.target, "image_size": int(self.image_size), "verdict": self.verdict,
                "embedding": self.embedding, "grid": [int(g) for g in self.grid],
                "pretrain_grid": None if self.pretrain_grid is None else [int(g) for g in self.pretrain_grid],
                "affected_blocks": [int(i) for i in self.affected_blocks],
                "window_sizes": [int(w) for w in self.window_sizes], "lines": list(self.lines),
                "fix": "\n".join(line.strip() for line in self.fix.splitlines()),
                "padding": list(self.padding), "terms": [t.to_dict() for t in self.terms]}

    def text(self) -> str:
        out = [f"[{self.verdict}] {self.target} at {self.image_size} px: {self.embedding}"] + [f"  {ln}" for ln in self.lines]
        if self.fix:
            out.append(f"  fix: {self.fix}")
        for term in self.terms:  # each: a [LEVEL] header, then its findings
            out += [f"  {ln}" for ln in term.text(indent="  ").split("\n")]
        out += [f"  padding: {ln}" for ln in self.padding]
        return "\n".join(out)


def _window_blocks(net) -> list[tuple[int, int]]:
    return [(i, blk.attn.window_size) for i, blk in enumerate(net.blocks) if blk.attn.window_size]


def window_padding(net, image_size: int) -> list[str]:
    """What padding the token grid to whole windows costs at a square ``image_size``, per (grid, window) of the
    window blocks: the padded grid, the share of extra tokens the attention computes on (the blocks pad before
    partitioning and crop after, so only attention pays), and the nearest window sizes that tile the grid exactly.
    A pooling block hands the next blocks a grid halved (rounded up), as in the model."""
    groups: dict = {}
    for i, (blk, grid) in enumerate(zip(net.blocks, block_grids(net, image_size))):
        if blk.attn.window_size:
            groups.setdefault((grid, blk.attn.window_size), []).append(i)
    lines = []
    for (g, ws), blocks in groups.items():
        where = f"blocks {_ranges(blocks)}: {g}x{g} tokens"
        padded = -(-g // ws) * ws
        if padded == g:
            lines.append(f"{where} tile {ws}-token windows exactly (no padding)")
            continue
        extra = padded * padded / (g * g) - 1
        tiling = sorted((d for d in range(2, g + 1) if g % d == 0 and ws / 2 <= d <= 2 * ws),
                        key=lambda d: (abs(d - ws), d))[:2]
        alt = (f"; windows of {' or '.join(map(str, tiling))} tokens would tile it exactly" if tiling else
               f"; no window between {ws // 2} and {2 * ws} tokens tiles {g}")
        lines.append(f"{where} padded to {padded}x{padded} for {ws}-token windows: attention computes on "
                     f"{extra:+.1%} tokens{alt}")
    return lines


def _ranges(blocks) -> str:
    """``[0, 1, 2, 4]`` -> ``"0-2, 4"``."""
    runs, start = [], blocks[0]
    for prev, cur in zip(blocks, blocks[1:] + [None]):
        if cur != prev + 1:
            runs.append(f"{start}-{prev}" if prev > start else str(start))
            start = cur
    return ", ".join(runs)


def keeps_block_terms(net) -> bool:
    """Whether the fix must keep the model's block terms: RoPE or LookHere in some block (recipe ``paper`` would
    replace them), as in EVA-02's detection backbone (an absolute embedding plus RoPE)."""
    return any(blk.attn.position.kind in ("rope", "lookhere") for blk in net.blocks)


def fix_text(preset: str | None = None, config: str | None = None, recipe_key: str | None = None,
             recipe: str | None = None, keep_terms: bool = False) -> str:
    """The fix for an interpolated absolute embedding, as things to paste: the config override (or the doctor's
    ``--recipe`` for a preset) that selects the abs-win recipe, and the converter command with the preset filled in
    (CKPT / OUT are the user's files). ``keep_terms`` (``keeps_block_terms``): only the token embedding becomes
    abs-win (``pos_embed=abswin``) and ``recipe`` with its block terms stays."""
    to = preset or "PRESET"
    if keep_terms:
        key = f"{recipe_key.rsplit('.', 1)[0]}.pos_embed" if recipe_key else "pos_embed"
        convert = (f"winpos-convert --input CKPT --output OUT.safetensors --to {to} --recipe {recipe or 'RECIPE'} "
                   "--pos-embed abswin")
        if config and recipe_key:
            use = (f"keep the block terms and tile the embedding: add the override {key}=abswin, e.g. winpos-train "
                   f"--config-file {config} {key}=abswin")
        else:
            use = (f"keep the block terms and tile the embedding: winpos-posemb doctor {to} pos_embed=abswin "
                   f"--recipe {recipe or 'RECIPE'}")
        return f"{use}\n       and convert its checkpoint on import: {convert}"
    convert = f"winpos-convert --input CKPT --output OUT.safetensors --to {to} --recipe paper"
    if config and recipe_key:
        use = (f"add the override {recipe_key}=paper (abs-win), e.g. winpos-train --config-file {config} "
               f"{recipe_key}=paper")
    elif preset:
        use = f"build it with recipe paper (abs-win): winpos-posemb doctor {preset} --recipe paper"
    else:
        use = "build it with recipe='paper' (abs-win)"
    return f"{use}\n       and convert its checkpoint on import: {convert}"


def diagnose_backbone(net, image_size: int, name: str = "model", fix: str | None = None,
                      trained_size: int | None = None, checkpoint=None) -> DoctorReport:
    """Check one winpos backbone (HieraDet or ViTDet) at a square ``image_size``: its token embedding, then its block
    terms (``winpos.diagnostics.terms.position_terms``). ``fix``: the fix to print when the bug is present
    (``fix_text``; default: the generic one). ``trained_size``: the image size (px) the RoPE was trained at
    (default: the model's pretraining size). ``checkpoint``: a winpos checkpoint of this model (path or state
    dict) whose learned RoPE frequencies and relpos table lengths are read instead of the model's."""
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size <= 0:
        raise WinposError(f"image_size={image_size!r} must be a positive number of pixels, e.g. 1024")
    check_image_size(trained_size, "--rope-trained-size")
    from winpos.diagnostics.terms import position_terms

    report = _embedding_report(net, image_size, name, fix)
    report.terms = position_terms(net, image_size, trained_size, state=load_state(checkpoint))
    report.padding = window_padding(net, image_size)
    return report


def load_state(checkpoint):
    """``checkpoint``: None, a state dict, or a checkpoint file read as data (``winpos.checkpoints.io``); one in
    Hugging Face transformers names is renamed into its family's own (``winpos.checkpoints.hf``)."""
    if checkpoint is None:
        return None
    from winpos.checkpoints.hf import hf_family, to_native
    from winpos.checkpoints.io import load_checkpoint_object, unwrap_state_dict

    if isinstance(checkpoint, dict):
        sd = checkpoint
    else:
        try:
            sd = unwrap_state_dict(load_checkpoint_object(checkpoint), f"--checkpoint {checkpoint}")
        except FileNotFoundError as e:
            raise WinposError(f"--checkpoint {checkpoint} does not exist; check the path") from e
    # transformers names (vision_encoder.layers.N.attn.rel_pos_h): the tables are read under the family's own names
    return to_native(sd).state_dict if hf_family(sd) else sd


def _embedding_report(net, image_size: int, name: str, fix: str | None) -> DoctorReport:
    stride = token_stride(net)
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
    sizes = report.window_sizes = sorted({w for _, w in windows})
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
                    overrides=(), trained_size: int | None = None, checkpoint=None) -> DoctorReport:
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
                             fix=fix_text(preset, recipe=recipe, keep_terms=keeps_block_terms(net)),
                             trained_size=trained_size, checkpoint=checkpoint)


CONFIG_SUFFIXES = (".py", ".yaml", ".yml")  # a target with one of these is a config (LazyConfig or a run's config.yaml)


def diagnose_each(diagnose, targets, *args):
    """``diagnose(target, *args)`` for each target in one process; yields ``(target, DoctorReport or None, error
    message or None)``: a target that cannot be checked gets its one-line error and the others are still checked."""
    for target in targets:
        try:
            yield target, diagnose(target, *args), None
        except (WinposError, OSError) as e:
            yield target, None, f"{target}: {' '.join(str(e).split())}"


def diagnose_presets(presets, image_size: int | None = None, recipe: str | None = None, overrides=(),
                     trained_size: int | None = None, checkpoint=None):
    """``diagnose_preset`` for each of ``presets`` (``recipe`` None: ``"original"``), as ``diagnose_each`` yields;
    needs no detectron2 (``winpos.d2.doctor.diagnose_many`` takes configs too)."""
    return diagnose_each(lambda preset: diagnose_preset(preset, image_size, recipe or "original", overrides,
                                                        trained_size, checkpoint), presets)


JSON_SCHEMA_VERSION = 1  # of doctor_json's document; raised when a field changes meaning or goes away


def doctor_json(results, exit_status: int) -> dict:
    """The document ``winpos-posemb doctor --json`` writes for ``results`` (``diagnose_each``'s ``(target, report,
    error)``): the schema version, the command's exit status, one record per report (``argument``: the target as
    given, then ``DoctorReport.to_dict``) and one per target that could not be checked (``argument``, ``error``)."""
    return {"schema_version": JSON_SCHEMA_VERSION, "exit_status": int(exit_status),
            "reports": [{"argument": target, **report.to_dict()} for target, report, _ in results if report],
            "errors": [{"argument": target, "error": error} for target, report, error in results if not report]}


def check_image_size(image_size, flag: str = "--image-size") -> None:
    """``image_size`` must be None (the model's own size) or a positive int."""
    if image_size is not None and (isinstance(image_size, bool) or not isinstance(image_size, int) or
                                   image_size <= 0):
        raise WinposError(f"{flag} {image_size!r} must be a positive number of pixels, e.g. 1024 (leave it out "
                          "for the model's own size)")


if __name__ == "__main__":  # a library module: name the command instead of exiting 0 having done nothing
    print("error: winpos.diagnostics.doctor is a library module, not a command; run winpos-posemb doctor (--help "
          "says how)", file=__import__("sys").stderr)
    raise SystemExit(2)
