"""Load Hiera-family trunk weights into ``winpos.backbones.HieraDet`` names.

Sources, told apart by the key names and shapes each project saves:

* ``sam2``: SAM2 / SAM2.1 checkpoints (``{"model": {"image_encoder.trunk.*": ...}}``) or a bare sam2 ``Hiera``
  state dict. ``pos_embed (1, C, gh, gw)`` + ``pos_embed_window (1, C, 8, 8)`` are abs-win; MLPs are
  ``mlp.layers.0/1``.
* ``hiera``: official Hiera (``{"model_state": ...}``) and timm's plain Hiera: a flat ``pos_embed (1, 3136, C)``
  in row-major order. Hiera computes in an *unrolled* token order, but no parameter depends on it: the weights
  load unchanged, and HieraDet's features equal Hiera's intermediates after ``Reroll``.
* ``timm_abswin``: timm ``hiera_*_abswin``: ``pos_embed (1, C, gh, gw)`` + ``pos_embed_win (1, C, 8, 8)``.
* ``timm_hiera``: as ``hiera`` (timm renames the classifier ``head.fc``).
* ``winpos``: HieraDet's own names (passed through, shapes checked).

The format is told by ``winpos.checkpoints.formats.detect``, the one detector every importer uses.

Position embeddings are converted to what the target model holds: abs -> abs-win is the exact projection of
``abs_to_abswin`` (window = the target's window embedding, e.g. 8 on the 56x56 grid), so a target with a
56x56 global embedding reproduces the source exactly at the pretraining resolution; a smaller global grid is
resized (antialiased, lossy, and reported). abs-win -> abs materializes the embedding on the target's grid.

HieraDet always pools at all three stage transitions (``q_pool=3``); Hiera MAE checkpoints (``q_pool=2``) load,
but their last stage was pretrained without pooling. Video checkpoints (``sep_pos_embed``) are refused.
"""
from __future__ import annotations

import math
import os

import torch
import torch.nn as nn

from winpos.backbones.common import may_keep_init
from winpos.checkpoints.formats import HIERA_FORMATS, Format, detect, parse_format
from winpos.checkpoints.io import load_checkpoint_object, unwrap_state_dict
from winpos.checkpoints.report import LoadReport
from winpos.errors import WinposError
from winpos.posemb.abswin import abs_to_abswin, abswin_embedding
from winpos.posemb.interp import resize_grid, split_flat_embedding

SOURCES = ("auto",) + tuple(f.value for f in HIERA_FORMATS) + (Format.WINPOS.value,)
SAM2_PREFIX = "image_encoder.trunk."
ABS, GLOBAL, WINDOW = "pos_embed.pos_embed", "pos_embed.global_embed", "pos_embed.window_embed"


def _refuse_video(state_dict: dict) -> None:
    if "pos_embed_spatial" in state_dict or getattr(state_dict.get("patch_embed.proj.weight"), "ndim", 4) == 5:
        raise WinposError("this is a video Hiera checkpoint (sep_pos_embed / 3D patch embedding); HieraDet is an "
                          "image backbone: use an image checkpoint such as hiera_base_224")


def hiera_format(state_dict: dict) -> Format:
    """The format of a Hiera-family state dict (``detect``), refusing video Hiera and plain-ViT checkpoints."""
    _refuse_video(state_dict)
    fmt = detect(state_dict)
    if not fmt.is_hiera:
        raise WinposError(f"this is a {fmt} checkpoint ({fmt.spec.describe}), a plain ViT: it loads into ViTDet, not "
                          "HieraDet; pick a vitdet_* preset")
    return fmt


def _rename(state_dict: dict, source: str, report: LoadReport) -> tuple[dict, dict]:
    """Map trunk keys to winpos names; the rest goes to ``report.unexpected``.

    Returns ``(blocks {dst: (src, tensor)}, pos {role: (src, tensor)})``.
    """
    out, pos = {}, {}
    names = {k: k for k in state_dict}  # trunk-relative name -> key in the file
    if source == "sam2" and any(k.startswith(SAM2_PREFIX) for k in state_dict):
        for k in state_dict:
            if not k.startswith(SAM2_PREFIX):
                report.add_unexpected(k, "outside the image-encoder trunk (neck, prompt encoder, mask decoder, "
                                         "memory)")
        names = {k[len(SAM2_PREFIX):]: k for k in state_dict if k.startswith(SAM2_PREFIX)}
    pos_names = {"sam2": {"pos_embed": "global", "pos_embed_window": "window"},
                 "timm_abswin": {"pos_embed": "global", "pos_embed_win": "window"},
                 "hiera": {"pos_embed": "abs"}, "timm_hiera": {"pos_embed": "abs"},
                 "winpos": {ABS: "abs", GLOBAL: "global", WINDOW: "window"}}[source]
    for k, file_key in names.items():
        v = state_dict[file_key]
        if k in pos_names:
            pos[pos_names[k]] = (file_key, v)
        elif k.startswith(("patch_embed.", "blocks.")):
            dst = k.replace(".mlp.layers.0.", ".mlp.fc1.").replace(".mlp.layers.1.", ".mlp.fc2.")
            out[dst] = (file_key, v)
        else:
            report.add_unexpected(file_key, "not part of the HieraDet trunk (classifier head, final norm or MAE "
                                            "decoder)")
    return out, pos


def _target_shapes(target) -> dict[str, tuple] | None:
    if target is None:
        return None
    if isinstance(target, nn.Module):
        target = target.state_dict()
    return {k: tuple(v.shape) if isinstance(v, torch.Tensor) else tuple(v) for k, v in target.items()}


def _check_shape(src: str, dst: str, found, expected) -> None:
    if tuple(found) != tuple(expected):
        name = f"'{src}'" if src == dst else f"'{src}' (winpos '{dst}')"
        raise ValueError(f"checkpoint key {name} has shape {tuple(found)} but the model expects "
                         f"{tuple(expected)}; the checkpoint is for a different size (embed_dim / heads / window): "
                         "build the matching preset or pass the right overrides")


def _convert_pos(pos: dict, source: str, shapes: dict | None, report: LoadReport) -> dict:
    """Turn the source's token embedding (``{role: (file_key, tensor)}``) into the target's form."""
    antialias = source == "timm_abswin"  # SAM2 resizes without antialias, timm's abs-win with it
    have = "abs" if "abs" in pos else "abswin" if "global" in pos else "none"
    if shapes is None:
        want = have
    else:
        want = "abs" if ABS in shapes else "abswin" if GLOBAL in shapes else "none"
    if want == "none" or have == "none":
        for key, _ in pos.values():
            report.add_unexpected(key, "the target model has pos_embed='none'")
        if want != "none":
            for k in (ABS,) if want == "abs" else (GLOBAL, WINDOW):
                report.add_missing(k, "the checkpoint has no token position embedding; keeps its initialization")
        return {}
    if have == "abs":
        key, flat = pos["abs"]
        if flat.ndim != 3:
            raise ValueError(f"'{key}' has shape {tuple(flat.shape)}; expected a flat (1, N, C) embedding")
        if want == "abs":
            if shapes is not None:
                _check_shape(key, ABS, flat.shape, shapes[ABS])
            _note(report, ABS, key)
            return {ABS: flat}
        window = tuple(shapes[WINDOW][-2:])
        _check_shape(key, WINDOW, (1, flat.shape[-1]) + window, shapes[WINDOW])
        g, w = abs_to_abswin(split_flat_embedding(flat, key, has_cls=False)[0], window)
        reason = f"abs {tuple(flat.shape)} split exactly into a {window} window embedding + residual"
        g, resized = _fit_global(g, shapes[GLOBAL], key, True)
        report.add_reshaped(WINDOW, reason)
        report.add_reshaped(GLOBAL, f"{reason}; {resized}" if resized else reason)
        return {GLOBAL: g, WINDOW: w}
    if "window" not in pos:
        raise ValueError(f"the checkpoint has a global abs-win embedding '{pos['global'][0]}' but no window "
                         "embedding; the file is incomplete")
    (gkey, g), (wkey, w) = pos["global"], pos["window"]
    if want == "abswin":
        resized = None
        if shapes is not None:
            _check_shape(wkey, WINDOW, w.shape, shapes[WINDOW])
            g, resized = _fit_global(g, shapes[GLOBAL], gkey, antialias)
        _note(report, WINDOW, wkey)
        if resized:
            report.add_reshaped(GLOBAL, resized)
        else:
            _note(report, GLOBAL, gkey)
        return {GLOBAL: g, WINDOW: w}
    n, C = shapes[ABS][1], shapes[ABS][2]
    side = math.isqrt(n)
    _check_shape(gkey, ABS, (1, side * side, g.shape[1]), shapes[ABS])
    flat = abswin_embedding(g, w, (side, side), antialias).flatten(2).transpose(1, 2)
    report.add_reshaped(ABS, f"abs-win materialized on the {side}x{side} grid of the target's abs embedding")
    return {ABS: flat}


def _fit_global(g, expected, src, antialias):
    """Resize the global embedding to the target's grid; returns ``(g, why)`` with ``why=None`` when unchanged."""
    if tuple(g.shape[:2]) != tuple(expected[:2]):
        _check_shape(src, GLOBAL, g.shape, expected)
    if tuple(g.shape) == tuple(expected):
        return g, None
    why = (f"global embedding resized {tuple(g.shape[-2:])} -> {tuple(expected[-2:])} (bicubic; not exact: "
           "give the model a global grid of the source size for an exact conversion)")
    return resize_grid(g, expected[-2:], antialias=antialias), why


def _note(report, dst, src):
    if src in (dst, SAM2_PREFIX + dst):  # a container prefix alone is no rename (like ViTDet's "backbone.net.")
        report.add_matched(dst)
    else:
        report.add_converted(dst, f"renamed from '{src}'")


def _missing_reason(key: str) -> str:
    if "rel_pos" in key:
        return "block relpos table: new in this recipe, keeps its initialization"
    if "rope" in key:
        return "RoPE frequencies: new in this recipe, keep their initialization"
    if ".ls1." in key or ".ls2." in key:
        return "LayerScale: not in the checkpoint, keeps its init_values"
    return "not in the checkpoint (the checkpoint has fewer blocks or a different expand/shortcut layout)"


def convert_hiera_checkpoint(checkpoint, target=None, source: str = "auto"):
    """Convert a Hiera-family checkpoint to ``HieraDet`` names.

    Args:
        checkpoint: a path (read safely by ``winpos.checkpoints.io``), a container (``{"model": ...}``,
            ``{"model_state": ...}``) or a flat state dict.
        target: the ``HieraDet`` (or its state dict, or ``{name: shape}``) to convert for: it decides the form of
            the position embedding and every shape is checked against it. None keeps the source's form.
        source: one of ``SOURCES``; ``"auto"`` detects it.
    Returns:
        ``(state_dict, LoadReport)``; load with ``model.load_state_dict(state_dict, strict=False)`` or use
        ``load_hiera_checkpoint``.
    Raises:
        ValueError: unknown format, video checkpoint, or a shape that differs from the target (naming the key,
        the expected and the found shape).
    """
    if isinstance(checkpoint, (str, os.PathLike)):
        checkpoint = load_checkpoint_object(checkpoint)
    state_dict = unwrap_state_dict(checkpoint, source="Hiera checkpoint")
    fmt = parse_format(source)
    if fmt != "auto" and fmt.value not in SOURCES:
        raise WinposError(f"source={source!r} is not a Hiera format; choose one of {', '.join(SOURCES)}")
    _refuse_video(state_dict)
    source = (hiera_format(state_dict) if fmt == "auto" else fmt).value
    shapes = _target_shapes(target)
    report = LoadReport(source, target="winpos HieraDet")
    blocks, pos = _rename(state_dict, source, report)
    out = {}
    for dst, (src, value) in blocks.items():
        if shapes is not None and dst not in shapes:
            report.add_unexpected(src, "no such parameter in the target model (more blocks, or an expand proj)")
            continue
        if shapes is not None:
            _check_shape(src, dst, value.shape, shapes[dst])
        out[dst] = value
        _note(report, dst, src)
    out.update(_convert_pos(pos, source, shapes, report))
    if shapes is not None:
        noted = {k for k, _ in report.missing}
        for k in shapes:
            if k not in out and k not in noted:
                report.add_missing(k, _missing_reason(k))
    return out, report


def load_hiera_checkpoint(model: nn.Module, checkpoint, source: str = "auto", strict: bool = True):
    """Convert ``checkpoint`` for ``model`` and load it; returns the ``LoadReport``.

    With ``strict`` a missing trunk weight (anything but new relpos / RoPE / LayerScale parameters) is an error.
    """
    state_dict, report = convert_hiera_checkpoint(checkpoint, target=model, source=source)
    fatal = [k for k, _ in report.missing if not may_keep_init(k)]
    if strict and fatal:
        raise ValueError(f"the checkpoint lacks {len(fatal)} trunk weights of the model, e.g. {fatal[:5]}; it is "
                         "for a different architecture (check stages / expand_proj), or pass strict=False")
    model.load_state_dict(state_dict, strict=False)
    return report


__all__ = ["SOURCES", "convert_hiera_checkpoint", "hiera_format", "load_hiera_checkpoint"]
