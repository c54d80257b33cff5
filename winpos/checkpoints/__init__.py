"""Import the checkpoints people already have (official Hiera, SAM2, timm, SAM, MAE, detectron2 ViTDet, the LookHere
authors' ViT-B, SAM3's encoder, DINOv3, EVA-02, RoPE-ViT, winpos), and the same families saved by Hugging Face
transformers.

One pipeline: every file is read as data (``io``: ``torch.load(weights_only=True)``, safetensors, or a restricted
unpickler for detectron2's ``.pkl``); ``formats.detect`` names its format (one vocabulary, ``formats.Format``); the
format's adapter (``adapters/``, one file per format) renames the trunk and hands over the position embedding in
one form; ``convert.convert`` checks shapes, converts the embedding to the target's form (abs -> abs-win exactly),
resamples relpos tables and writes the ``LoadReport`` (``report.py``). ``load_external`` is the one entry point;
``hiera.py`` / ``vitdet.py`` keep family-named shortcuts and ``lookhere.py`` builds the target a LookHere file
needs from its config.

``load_external`` also accepts winpos's own files, backbone-only or a whole winpos detector (``model_final.pth``:
the trunk is found under its ``backbone.`` prefix, the other keys are reported), and converts them between every
``pos_embed`` choice, refusing a target that differs from the build the file records in a setting without tensors
(``recorded``: RoPE base, LookHere slopes, LayerNorm eps, ...). It refuses a result with NaN / inf values (naming
the keys) and a result that holds no tensor of the target (the wrong ``format`` or another architecture).

Modules:

    io          safe reads: ``weights_only`` torch files, safetensors, detectron2 ``.pkl`` as data
    formats     the vocabulary of checkpoint formats and ``detect``
    adapters/   one adapter per format: source names -> winpos trunk names and one embedding form
    hf          Hugging Face transformers names (SAM, SAM2, SAM3, Hiera, ViTDet, DINOv3, ViT): told apart, renamed
                into the family's own names for its adapter, the report naming the file's keys
    convert     the one conversion: shape checks, embedding form, relpos resampling
    report      ``LoadReport``: what an import did with every key
    presets     which winpos presets a checkpoint's trunk fits
    recorded    the build a winpos file records, and the settings without tensors a model differs from it in
    hiera       Hiera-family shortcuts (SAM2, official Hiera, timm, winpos) into HieraDet
    vitdet      ViT-family shortcuts (detectron2, SAM, MAE, timm, DINOv3, EVA-02, RoPE-ViT, winpos) into ViTDet
    lookhere    the LookHere authors' checkpoints into winpos ViTDet, the target built from their config
"""
from __future__ import annotations

import os

import torch.nn as nn

from winpos.backbones.common import may_keep_init
from winpos.checkpoints.adapters.winpos_native import trunk_prefix
from winpos.checkpoints.convert import check_no_loss
from winpos.checkpoints.formats import FORMATS, Format, check_named_family, detect, parse_format
from winpos.checkpoints.io import (check_finite_state_dict, load_checkpoint_object, load_state_dict_file,
                                   unwrap_state_dict)
from winpos.checkpoints.report import LoadReport
from winpos.errors import WinposError

def _resolve_target(target, recipe, overrides) -> nn.Module:
    if isinstance(target, nn.Module):
        return target
    if isinstance(target, str):
        from winpos.backbones import create

        return create(target, recipe=recipe, **overrides)
    raise WinposError(f"target must be a preset name (see winpos.backbones.list_presets()) or a model, got {target!r}")


def _recorded_settings(path_or_state_dict, obj, model, allowed: bool) -> tuple[str, str]:
    """``recorded.compare_with_record`` of ``model`` against the build a winpos file records (``("", "")`` when it
    records none), refused unless ``allowed``."""
    from winpos.checkpoints.recorded import compare_with_record, recorded_build

    path = path_or_state_dict if isinstance(path_or_state_dict, (str, os.PathLike)) else ""
    build = recorded_build(path, obj)
    if build is None:
        return "", ""
    return compare_with_record(model, build, allowed, lambda said: (
        f"the checkpoint was converted for settings that carry no tensor and that the target does not have: {said}. "
        "The weights would load by name and shape and then compute what they were not trained for. Build the target "
        f"as {build.where} records, {build.create_line()}, or pass allow_other_settings=True to use the target's "
        "settings on purpose"))


def fitting_presets(obj, format: str = "auto") -> tuple[Format, int | None, int | None, list[str]]:
    """The checkpoint's format, its trunk's embedding width and number of blocks, and the winpos presets of its
    architecture with that width and depth (the family's own presets first: they hold its LayerScale, SwiGLU and
    frequencies); widths and depths are None and the list empty where the trunk does not tell them.

    ``obj``: a loaded checkpoint (container or flat state dict; a winpos detector's trunk is found under its
    prefix); ``format``: ``"auto"`` (``detect``) or one of ``FORMATS``.
    """
    from winpos.checkpoints.adapters import adapt
    from winpos.checkpoints.presets import matching_presets, trunk_width_depth

    fmt = parse_format(format)
    fmt = detect(obj) if fmt == "auto" else fmt
    if fmt == Format.LOOKHERE and isinstance(obj, dict) and isinstance(obj.get("weights"), dict):
        obj = obj["weights"]  # the authors' file: {"weights": state dict, "config": ...}
    flat = unwrap_state_dict(obj, source="checkpoint")
    if fmt == Format.WINPOS:
        prefix = trunk_prefix(flat) or trunk_prefix(flat, vit=True)
        flat = {k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)} if prefix else flat
    try:
        trunk = adapt(flat, fmt).trunk
    except (ValueError, KeyError):
        return fmt, None, None, []
    tensors = {k: v[1] if isinstance(v, tuple) else v for k, v in trunk.items()}
    width, depth = trunk_width_depth(tensors)
    found = matching_presets(fmt, width, depth)
    if len(found) > 1:  # same width and depth (DINOv3 S and S+): the one whose tensors have the file's shapes first
        agree = {name: _shape_agreement(name, tensors) for name in found}
        found.sort(key=lambda name: -agree[name])  # stable: ties keep the family's own first
    return fmt, width, depth, found


def _shape_agreement(preset: str, tensors: dict) -> int:
    """How many of the trunk's tensors preset ``preset`` holds at the same shape, less those it lacks (built on the
    meta device: no memory, no initialization)."""
    import torch

    from winpos.backbones import create

    try:
        with torch.device("meta"):
            own = {k: tuple(v.shape) for k, v in create(preset).state_dict().items()}
    except Exception:  # noqa: BLE001 - a preset that cannot build on meta keeps its place in the order
        return 0
    return sum(1 if own.get(k) == tuple(v.shape) else -1 for k, v in tensors.items() if hasattr(v, "shape"))


def _preset_hint(flat: dict, fmt: Format, target) -> str:
    """For a shape mismatch: the presets whose width and depth the checkpoint has (a ``--to`` to paste)."""
    _, width, depth, found = fitting_presets(flat, fmt)
    found = [p for p in found if p != target]
    if not found:
        return ""
    return (f"; the checkpoint's width {width} and {depth} blocks match preset {' / '.join(found)}: convert with "
            f"--to {found[0]} (create({found[0]!r}, ...))")


GRID_ARGS = ("pretrain_img_size", "pretrain_use_cls_token")


def _fit_pretrain_grid(model: nn.Module, flat: dict, fmt: Format, target, recipe, overrides) -> tuple[nn.Module, dict]:
    """For a ViTDet preset with an absolute embedding whose pretraining grid differs from the checkpoint's (SAM's
    64x64 grid without a cls row against the presets' 14x14 with one): the model rebuilt with the checkpoint's grid,
    and the constructor arguments that did it. The model as it was, and ``{}``, when the grid already fits, the
    caller set either argument, the target is built already, or the checkpoint's channels differ (the shape error
    names the preset that fits)."""
    from winpos.backbones import ViTDet
    from winpos.posemb.abswin import AbsPosEmbed
    from winpos.checkpoints.adapters import adapt

    if not isinstance(target, str) or not isinstance(model, ViTDet) or any(k in overrides for k in GRID_ARGS):
        return model, {}
    if not isinstance(getattr(model, "pos_embed", None), AbsPosEmbed):
        return model, {}
    try:
        pos = adapt(flat, fmt).position
    except ValueError:  # the conversion itself names what does not fit
        return model, {}
    if pos is None or pos.kind != "abs" or pos.grid.shape[1] != model.pos_embed.pos_embed.shape[-1]:
        return model, {}
    h, w = (int(v) for v in pos.grid.shape[-2:])
    if (h, w) == tuple(model.pretrain_hw):
        return model, {}
    stride = model.patch_size
    size = h * stride if h == w else [h * stride, w * stride]
    chosen = {"pretrain_img_size": size, "pretrain_use_cls_token": pos.cls is not None}
    return _resolve_target(target, recipe, {**overrides, **chosen}), chosen


def load_external(path_or_state_dict, target, format: str = "auto", recipe: str = "original", strict: bool = False,
                  allow_loss: bool = True, fit_pretrain_grid: bool = False, allow_other_settings: bool = False,
                  **overrides):
    """Convert an outside checkpoint into winpos names for ``target``.

    Args:
        path_or_state_dict: a checkpoint file, a loaded container (``{"model": ...}``) or a flat state dict.
        target: a winpos backbone (HieraDet / ViTDet) or a preset name, built with ``recipe`` and ``overrides``
            (e.g. ``pos_embed="abswin"`` to convert an absolute embedding to abs-win on import).
        format: ``"auto"`` (``formats.detect`` tells it from the keys) or one of ``FORMATS`` (a ``Format`` or its
            name: sam2, hiera, timm_hiera, timm_abswin, sam, mae, detectron2, winpos, lookhere).
        strict: refuse checkpoints that lack trunk weights of the target.
        allow_loss: False refuses a partial conversion (``report.lost``: trunk weights of the source with no place in
            the target, or trunk weights of the target left at init), naming them and the presets that hold them
            (``winpos-convert`` without ``--allow-loss``).
        fit_pretrain_grid: with a preset name as ``target`` (a ViTDet with the ``abs`` embedding), build it with
            the checkpoint's pretraining grid when the preset's differs (``pretrain_img_size`` = grid x patch size,
            ``pretrain_use_cls_token`` = whether the file keeps a cls row: SAM's 64x64 grid gives 1024 and False),
            unless ``overrides`` set either; ``report.built_with`` holds what it chose (``winpos-convert`` passes
            True and records them in its output). False: a grid mismatch is an error naming those arguments.
        allow_other_settings: a winpos file that records its build (``winpos-convert``'s ``winpos_preset``,
            ``winpos_recipe``, ``winpos_kwargs``) is refused when the target differs from that build in a setting
            without tensors (RoPE base, pairing, axis order, coordinates or fraction; LookHere directions and
            slopes; LayerNorm eps; ``winpos.checkpoints.recorded``), naming each; True converts it anyway and
            lists the differences in the report.
    Returns:
        ``(state_dict, LoadReport)``: the state dict loads into the target with ``load_state_dict(sd, strict=False)``
        and only position parameters the source lacks stay missing.
    """
    from winpos.backbones import HieraDet, ViTDet

    fmt = parse_format(format)
    obj = load_checkpoint_object(path_or_state_dict) if isinstance(path_or_state_dict, (str, os.PathLike)) \
        else path_or_state_dict
    if fmt == "auto":
        fmt = detect(obj)
    else:
        check_named_family(obj, fmt)
    if fmt == Format.LOOKHERE:  # the authors' LookHere ViT-B: its config decides how the target is built
        from winpos.checkpoints.lookhere import convert_lookhere_checkpoint

        return convert_lookhere_checkpoint(obj, target, recipe=recipe, strict=strict, **overrides)
    model = _resolve_target(target, recipe, overrides)
    is_hiera, is_vit = isinstance(model, HieraDet), isinstance(model, ViTDet)
    if not (is_hiera or is_vit):
        raise WinposError(f"load_external converts into HieraDet or ViTDet, not {type(model).__name__}")
    if (is_hiera and not fmt.is_hiera) or (is_vit and not fmt.is_vit):
        kind, other = ("HieraDet", "a plain-ViT") if is_hiera else ("ViTDet", "a Hiera")
        raise WinposError(f"format {fmt} ({fmt.spec.describe}) is {other} checkpoint; it cannot load into {kind}: "
                          f"convert it to a {'vitdet' if is_hiera else 'hieradet'}_* preset (--to), or name the "
                          "right format (--format)")
    status, settings = _recorded_settings(path_or_state_dict, obj, model, allow_other_settings) \
        if fmt == Format.WINPOS else ("", "")
    flat = unwrap_state_dict(obj, source="checkpoint")
    outside = []
    if fmt == Format.WINPOS:
        prefix = trunk_prefix(flat, is_vit)
        if prefix:
            outside = [k for k in flat if not k.startswith(prefix)]
            flat = {k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)}
    chosen = {}
    if fit_pretrain_grid:
        model, chosen = _fit_pretrain_grid(model, flat, fmt, target, recipe, overrides)
    try:
        if is_hiera:
            from winpos.checkpoints.hiera import convert_hiera_checkpoint

            sd, report = convert_hiera_checkpoint(flat, target=model, source=fmt)
        else:
            from winpos.checkpoints.vitdet import convert_to_vitdet

            sd, report = convert_to_vitdet(flat, model, source=fmt)
    except WinposError as e:
        raise WinposError(f"{e}{_preset_hint(flat, fmt, target)}") from None
    for k in outside:
        report.add_unexpected(k, "outside the winpos backbone of the detector checkpoint (pyramid, heads)")
    report.built_with = chosen
    if status == "not compared":
        report.add_unexpected("settings", settings)
    elif status == "allowed":
        report.add_unexpected("settings", f"the target differs from the build the file records (allowed): {settings}")
    if not sd:
        raise WinposError(f"none of the checkpoint's {len(flat) + len(outside)} tensors fits the target "
                          f"{type(model).__name__} as format {report.source!r} (e.g. {sorted(flat)[:3]}); pass "
                          "format='auto' (--format auto), or a --to preset of the checkpoint's architecture")
    check_finite_state_dict(sd, "the converted checkpoint")
    if report.lost and not allow_loss:
        try:
            check_no_loss(report)
        except WinposError as e:
            raise WinposError(f"{e}{_preset_hint(flat, fmt, target)}") from None
    if strict:
        fatal = [k for k, _ in report.missing if not may_keep_init(k)]
        if fatal:
            raise WinposError(f"the checkpoint lacks {len(fatal)} trunk weights of the target, e.g. {fatal[:5]}; "
                              "it was made for another architecture or size")
    return sd, report


__all__ = ["FORMATS", "Format", "LoadReport", "detect", "fitting_presets", "load_checkpoint_object", "load_external",
           "load_state_dict_file"]
