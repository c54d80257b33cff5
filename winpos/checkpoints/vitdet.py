"""Load detectron2 ViTDet, segment-anything ``ImageEncoderViT``, MAE ViT and winpos's own ViTDet weights into
``winpos`` ``ViTDet``.

Each converter maps a source state dict onto the parameter names and the position encodings of a *target*
model and returns ``(state_dict, LoadReport)``; ``load_vitdet_weights`` also loads it. What the target asks
for decides the conversions:

- ``pos_embed="abs"``: the source embedding is stored as the target stores it (flat, with or without the unused cls
  row); SAM's NHWC ``(1, 64, 64, C)`` is flattened row-major (build the model with ``pretrain_img_size=1024,
  pretrain_use_cls_token=False``). The grid is never resized here: a grid mismatch is an error.
- ``pos_embed="abswin"`` / ``"abswin_recursive"``: exact projection ``abs_to_abswin`` with the target's window:
  the window embedding is the mean of the full window tiles (the 14x14 MAE / detectron2 grid itself), the global
  embedding the residual (zeros for a 14x14 source). Resizing a non-zero residual to the target's global grid is
  lossy and reported under ``reshaped``.
- ``pos_embed="none"``: the source embedding is ignored (reported).
- A winpos ViTDet checkpoint converts between every ``pos_embed`` choice: ``abs`` as above; abs-win to abs-win
  copies the window embedding and resizes the global one only when its grid differs (reported); abs-win to
  ``abs`` materializes the embedding on the target's pretraining grid (reported under ``reshaped``).
- Relpos tables are copied where the target block has them, linearly resampled when their length differs (a new
  window or training size), and dropped where the target block has another position term (the ``paper`` recipe).

Any other shape mismatch raises ``ValueError`` naming the key, the expected and the found shape.
"""
from __future__ import annotations

import math
import re

import torch
import torch.nn as nn

from winpos.backbones.common import may_keep_init
from winpos.checkpoints.formats import WINPOS_POSITION_KEYS as WINPOS_POS_KEYS
from winpos.checkpoints.formats import Format, detect, parse_format
from winpos.checkpoints.io import unwrap_state_dict
from winpos.checkpoints.report import LoadReport
from winpos.errors import WinposError
from winpos.posemb.abswin import abs_to_abswin, abswin_embedding
from winpos.posemb.interp import resize_grid, split_flat_embedding
from winpos.posemb.relpos import resample_rel_table

__all__ = ["vit_format", "convert_detectron2_vit", "convert_sam_image_encoder",
           "convert_mae_vit", "convert_winpos_vitdet", "convert_to_vitdet", "load_vitdet_weights",
           "load_vitdet_checkpoint"]

SOURCES = ("detectron2", "sam", "mae", "winpos")
_REL = re.compile(r"^blocks\.(\d+)\.attn\.rel_pos_([hw])$")


def vit_format(state_dict) -> Format:
    """The format of a ViT-family state dict (``winpos.checkpoints.formats.detect``), refusing Hiera files."""
    fmt = detect(state_dict)
    if not fmt.is_vit or fmt == Format.LOOKHERE:
        raise WinposError(f"this is a {fmt} checkpoint ({fmt.spec.describe}): it does not load into ViTDet through "
                          "this converter; use winpos.checkpoints.load_external, which routes every format")
    return fmt


def _shape_error(key, expected, found, hint=""):
    return ValueError(f"checkpoint key {key!r} has shape {tuple(found)} but the model expects {tuple(expected)}"
                      f"{'; ' + hint if hint else ''}")


class _Converter:
    """Shared mapping of canonical (detectron2-named) source tensors onto a target ViTDet."""

    def __init__(self, model: nn.Module, source: str):
        if not hasattr(model, "pos_embed_kind") or not hasattr(model, "blocks"):
            raise ValueError(f"the target must be a winpos ViTDet, got {type(model).__name__}")
        self.model, self.target = model, model.state_dict()
        self.out: dict[str, torch.Tensor] = {}
        self.report = LoadReport(source, target="winpos ViTDet")

    def put(self, key, value, source_key):
        if key not in self.target:
            self.report.add_unexpected(source_key, "no such parameter in the target model", known=False)
            return
        if tuple(value.shape) != tuple(self.target[key].shape):
            raise _shape_error(source_key, self.target[key].shape, value.shape,
                               "build the model with the checkpoint's sizes (embed_dim, num_heads, mlp_ratio, ...)")
        self.out[key] = value
        self.report.add_matched(key)

    def relpos(self, key, value, source_key):
        block = int(_REL.match(key).group(1))
        if key not in self.target:
            if block < len(self.model.blocks):
                kind = self.model.blocks[block].attn.position.kind
                self.report.add_unexpected(source_key,
                                           f"block {block} of the target uses position term {kind!r}, not relpos")
            else:
                self.report.add_unexpected(source_key, f"the target has only {len(self.model.blocks)} blocks",
                                           known=False)
            return
        want = self.target[key].shape
        if value.dim() != 2 or value.shape[1] != want[1]:
            raise _shape_error(source_key, want, value.shape, "relpos tables are (2*extent-1, head_dim); the "
                               "head_dim (embed_dim / num_heads) must match the checkpoint")
        if value.shape[0] != want[0]:
            self.out[key] = resample_rel_table(value.float(), want[0]).to(value.dtype)
            self.report.add_reshaped(key, f"relpos table resampled linearly from length {value.shape[0]} to "
                                          f"{want[0]} (like detectron2's get_rel_pos at the new extent)")
        else:
            self.out[key] = value
            self.report.add_matched(key)

    def pos_embed(self, grid: torch.Tensor, cls: torch.Tensor | None, layout: str, source_key: str):
        """``grid (1, C, h, w)`` NCHW source embedding (cls row separate) -> the target's position parameters."""
        kind = self.model.pos_embed_kind
        if kind == "none":
            self.report.add_unexpected(source_key, "the target has pos_embed='none'; the absolute embedding is dropped")
            return
        h, w = grid.shape[-2:]
        if grid.shape[1] != self.model.embed_dim:
            raise _shape_error(source_key, (1, self.model.embed_dim, h, w), grid.shape, "embed_dim differs")
        if kind == "abs":
            self._to_abs(grid, cls, layout, source_key)
        else:
            self._to_abswin(grid, source_key)

    def _to_abs(self, grid, cls, layout, source_key):
        key, emb = "pos_embed.pos_embed", self.model.pos_embed
        if (h_w := tuple(grid.shape[-2:])) != tuple(emb.pretrain_hw):
            raise _shape_error(source_key, self.target[key].shape, (1, h_w[0] * h_w[1] + (cls is not None),
                               grid.shape[1]), f"the checkpoint's embedding is a {h_w[0]}x{h_w[1]} grid; build the "
                               f"model with pretrain_img_size={h_w[0] * self.model.patch_size} and "
                               f"pretrain_use_cls_token={cls is not None}")
        flat = grid.flatten(2).transpose(1, 2)  # (1, h*w, C) row-major, as detectron2 stores it
        notes = [] if layout == "flat" else [f"{layout} grid flattened row-major"]
        if emb.has_cls:
            if cls is None:
                cls = flat.new_zeros(1, 1, flat.shape[-1])
                notes.append("zero cls row added (never used in the forward pass)")
            flat = torch.cat([cls, flat], dim=1)
        elif cls is not None:
            notes.append("cls row dropped (detectron2's get_abs_pos drops it too)")
        self.out[key] = flat
        if notes:
            self.report.add_converted(key, "; ".join(notes))
        else:
            self.report.add_matched(key)

    def _to_abswin(self, grid, source_key):
        w = self.model.window_size
        g, win = abs_to_abswin(grid.float(), w)
        self.out["pos_embed.window_embed"] = win.to(grid.dtype)
        self.report.add_converted("pos_embed.window_embed", f"mean of the {grid.shape[-2] // w}x"
                                  f"{grid.shape[-1] // w} full {w}x{w} tiles of {source_key} (exact abs->abswin)")
        gkey = "pos_embed.global_embed"
        want = tuple(self.target[gkey].shape[-2:])
        if self.model.pos_embed_kind == "abswin_recursive" and g.any():
            # The recursive form is periodic with the pretraining grid: a non-periodic residual has no exact image.
            self.report.add_reshaped(gkey, "lossy: abswin_recursive is periodic with the pretraining grid and "
                                           "cannot hold this source's non-periodic residual; use pos_embed="
                                           "'abswin' to keep it")
            g = resize_grid(g, want, antialias=want[0] < g.shape[-2] or want[1] < g.shape[-1])
        elif tuple(g.shape[-2:]) == want:
            self.report.add_converted(gkey, "residual of the tiled window embedding (exact)")
        elif not g.any():
            g = g.new_zeros(1, g.shape[1], *want)
            self.report.add_converted(gkey, f"zeros: the {grid.shape[-2]}x{grid.shape[-1]} source is fully "
                                            "periodic with the window, so the residual is zero (exact)")
        else:
            antialias = want[0] < g.shape[-2] or want[1] < g.shape[-1]
            g = resize_grid(g, want, antialias=antialias)
            h, w_ = grid.shape[-2:]
            self.report.add_reshaped(gkey, f"non-zero {h}x{w_} residual resized to {want[0]}x{want[1]} (lossy; "
                                           f"build with abswin_global_size=({h}, {w_}) to keep it exact)")
        self.out[gkey] = g.to(grid.dtype)

    def finish(self):
        for key in self.target:
            if key in self.out:
                continue
            new = may_keep_init(key)
            self.report.add_missing(key, "not in the source checkpoint; keeps its initialization" +
                                    ("" if new else " (a trunk weight: is this the right checkpoint?)"))
        return self.out, self.report


def _trunk(conv: _Converter, name: str, value: torch.Tensor, source_key: str) -> None:
    if _REL.match(name):
        conv.relpos(name, value, source_key)
    else:
        conv.put(name, value, source_key)


def _convert(state_dict, model: nn.Module, source: str, route, prefix: str = "", outside: str = ""):
    """Run ``route(conv, name, value, source_key)`` on every trunk tensor of ``state_dict``.

    When some key starts with ``prefix`` the file is a whole model: ``prefix`` is stripped from its keys and the keys
    without it are reported as ignored, with the reason ``outside``. Returns ``(state_dict, LoadReport)``.
    """
    sd = unwrap_state_dict(state_dict, source="ViT checkpoint")
    conv = _Converter(model, source)
    prefixed = bool(prefix) and any(k.startswith(prefix) for k in sd)
    for key, value in sd.items():
        if prefixed and not key.startswith(prefix):
            conv.report.add_unexpected(key, outside)
        else:
            route(conv, key[len(prefix):] if prefixed else key, value, key)
    return conv.finish()


def _route_detectron2(conv: _Converter, name: str, value: torch.Tensor, key: str) -> None:
    if name == "pos_embed":
        grid, cls = split_flat_embedding(value, key)
        conv.pos_embed(grid, cls, "flat", key)
    else:
        _trunk(conv, name, value, key)


def _route_mae(conv: _Converter, name: str, value: torch.Tensor, key: str) -> None:
    if name == "cls_token":
        conv.report.add_unexpected(key, "ViTDet uses no cls token")
    elif name.startswith(("norm.", "fc_norm.")):
        conv.report.add_unexpected(key, "final norm of the pretraining encoder; ViTDet's trunk ends at the last block")
    elif name.startswith("head."):
        conv.report.add_unexpected(key, "classifier head")
    elif name.startswith(("decoder", "mask_token")):
        conv.report.add_unexpected(key, "MAE decoder")
    else:
        _route_detectron2(conv, name, value, key)  # the same names and the same flat pos_embed


def _route_sam(conv: _Converter, name: str, value: torch.Tensor, key: str) -> None:
    if name.startswith("neck."):
        conv.report.add_unexpected(key, "SAM neck (the detector's own pyramid replaces it)")
    elif name == "pos_embed":
        if value.dim() != 4 or value.shape[0] != 1:
            raise _shape_error(key, ("1", "h", "w", "C"), value.shape, "SAM stores pos_embed NHWC")
        conv.pos_embed(value.permute(0, 3, 1, 2), None, "NHWC", key)
    else:
        _trunk(conv, name.replace(".mlp.lin1.", ".mlp.fc1.").replace(".mlp.lin2.", ".mlp.fc2."), value, key)


def _winpos_abswin_to_target(conv: _Converter, g: torch.Tensor, w: torch.Tensor, gkey: str, wkey: str) -> None:
    """A winpos abs-win pair (global ``g``, window ``w``) -> the target's embedding."""
    model, kind = conv.model, conv.model.pos_embed_kind
    if kind == "none":
        for key in (gkey, wkey):
            conv.report.add_unexpected(key, "the target has pos_embed='none'; the embedding is dropped")
        return
    C = model.embed_dim
    for key, t in ((gkey, g), (wkey, w)):
        if t.dim() != 4 or t.shape[:2] != (1, C):
            raise _shape_error(key, (1, C, "h", "w"), t.shape, "embed_dim differs: build the matching preset")
    if kind == "abs":
        emb = model.pos_embed
        h, w_ = emb.pretrain_hw
        flat = abswin_embedding(g.float(), w.float(), (h, w_)).to(g.dtype).flatten(2).transpose(1, 2)
        if emb.has_cls:
            flat = torch.cat([flat.new_zeros(1, 1, C), flat], dim=1)
        conv.out["pos_embed.pos_embed"] = flat
        conv.report.add_reshaped("pos_embed.pos_embed", f"abs-win ({gkey} + tiled {wkey}) materialized on the "
                                                        f"{h}x{w_} pretraining grid of the target's abs embedding")
        return
    wkey_t, gkey_t = "pos_embed.window_embed", "pos_embed.global_embed"
    if tuple(w.shape) != tuple(conv.target[wkey_t].shape):
        raise _shape_error(wkey, conv.target[wkey_t].shape, w.shape, "the window size differs: build the target "
                           "with the checkpoint's window_size")
    conv.out[wkey_t] = w
    conv.report.add_matched(wkey_t)
    want = tuple(conv.target[gkey_t].shape[-2:])
    if tuple(g.shape[-2:]) == want:
        conv.out[gkey_t] = g
        conv.report.add_matched(gkey_t)
    else:
        antialias = want[0] < g.shape[-2] or want[1] < g.shape[-1]
        conv.out[gkey_t] = resize_grid(g.float(), want, antialias=antialias).to(g.dtype)
        conv.report.add_reshaped(gkey_t, f"global embedding resized {tuple(g.shape[-2:])} -> {want} (bicubic; lossy: "
                                         f"build with abswin_global_size={tuple(g.shape[-2:])} to keep it exact)")


def convert_winpos_vitdet(state_dict, model: nn.Module):
    """A winpos ``ViTDet`` state dict (any ``pos_embed`` choice) -> ``model`` (any ``pos_embed`` choice).

    Trunk tensors are checked against the target's shapes, relpos tables resampled where their length differs,
    and the token embedding converted as the module docstring says. Returns ``(state_dict, LoadReport)``.
    """
    sd = unwrap_state_dict(state_dict, source="ViT checkpoint")
    conv = _Converter(model, "winpos")
    pos = {k: v for k, v in sd.items() if k in WINPOS_POS_KEYS}
    for key, value in sd.items():
        if key not in pos:
            _trunk(conv, key, value, key)
    if "pos_embed.pos_embed" in pos:
        grid, cls = split_flat_embedding(pos["pos_embed.pos_embed"], "pos_embed.pos_embed")
        conv.pos_embed(grid, cls, "flat", "pos_embed.pos_embed")
    elif pos:
        if "pos_embed.window_embed" not in pos or "pos_embed.global_embed" not in pos:
            raise ValueError(f"the checkpoint has {sorted(pos)} but an abs-win embedding needs both "
                             "pos_embed.global_embed and pos_embed.window_embed; the file is incomplete")
        _winpos_abswin_to_target(conv, pos["pos_embed.global_embed"], pos["pos_embed.window_embed"],
                                 "pos_embed.global_embed", "pos_embed.window_embed")
    return conv.finish()


def convert_detectron2_vit(state_dict, model: nn.Module):
    """detectron2 ``ViT`` weights (``backbone.net.`` prefix optional; ``.pkl`` numpy or ``.pth``) -> ``model``.

    Returns ``(state_dict, LoadReport)``; load with ``model.load_state_dict(sd, strict=False)`` or use
    ``load_vitdet_weights``. Keys outside ``backbone.net.`` (pyramid, heads) are reported and ignored.
    """
    return _convert(state_dict, model, "detectron2", _route_detectron2, prefix="backbone.net.",
                    outside="detector part outside the ViT trunk (pyramid, RPN, ROI heads, pixel statistics)")


def convert_mae_vit(state_dict, model: nn.Module):
    """MAE / timm-style ViT encoder weights (``{"model": ...}`` optional) -> ``model``.

    ``pos_embed (1, 197, C)`` is the 14x14 sin-cos grid behind a zero cls row; ``cls_token``, the final ``norm`` /
    ``fc_norm``, a classifier ``head`` and any decoder are reported and ignored. Relpos tables are missing (zero
    init, as detectron2 starts from MAE).
    """
    return _convert(state_dict, model, "mae", _route_mae)


def convert_sam_image_encoder(state_dict, model: nn.Module):
    """segment-anything ``ImageEncoderViT`` weights (``image_encoder.`` prefix optional) -> ``model``.

    ``pos_embed (1, 64, 64, C)`` NHWC becomes the target's embedding (for ``abs``, build the model with
    ``pretrain_img_size=1024, pretrain_use_cls_token=False``; for ``abswin`` it is projected with the 14x14
    window). ``mlp.lin1/lin2`` are renamed ``mlp.fc1/fc2``. The neck, prompt encoder and mask decoder are reported
    and ignored.
    """
    return _convert(state_dict, model, "sam", _route_sam, prefix="image_encoder.",
                    outside="SAM prompt encoder / mask decoder, not part of the image encoder")


_CONVERTERS = {"detectron2": convert_detectron2_vit, "sam": convert_sam_image_encoder, "mae": convert_mae_vit,
               "winpos": convert_winpos_vitdet}


def convert_to_vitdet(state_dict, model: nn.Module, source: str = "auto"):
    """Dispatch on ``source`` in ``("auto", "detectron2", "sam", "mae", "winpos")``; returns
    ``(state_dict, report)``."""
    fmt = parse_format(source)
    if fmt == "auto":
        fmt = vit_format(unwrap_state_dict(state_dict, source="ViT checkpoint"))
    if fmt.value not in _CONVERTERS:
        raise WinposError(f"source={source!r} is not a ViT format this converter reads; choose 'auto' or one of "
                          f"{', '.join(SOURCES)}")
    return _CONVERTERS[fmt.value](state_dict, model)


def load_vitdet_weights(model: nn.Module, state_dict, source: str = "auto", strict: bool = True) -> LoadReport:
    """Convert ``state_dict`` (any supported family) and load it into ``model`` in place.

    strict: refuse source keys no rule recognises and trunk weights (anything but position parameters and
    LayerScale) that the source lacks; position parameters may always be missing (they keep their init).
    """
    sd, report = convert_to_vitdet(state_dict, model, source)
    if strict:
        trunk_missing = [k for k, _ in report.missing if not may_keep_init(k)]
        if report.unknown or trunk_missing:
            raise ValueError(
                f"the {report.source} checkpoint does not fit this ViTDet: unrecognised source keys "
                f"{report.unknown[:8]}, trunk weights missing from it {trunk_missing[:8]}; check depth / sizes or "
                "pass strict=False to load what matches"
            )
    result = model.load_state_dict(sd, strict=False)
    if result.unexpected_keys:  # the converter only emits the target's keys: this is a winpos bug, not bad input
        raise RuntimeError(f"ViTDet converter emitted keys the model does not have: {result.unexpected_keys[:8]}")
    return report


def load_vitdet_checkpoint(model: nn.Module, path, source: str = "auto", strict: bool = True) -> LoadReport:
    """``load_vitdet_weights`` from a file (``.pkl``, ``.pth``, ``.safetensors``), read safely by
    ``winpos.checkpoints.io.load_checkpoint_object``."""
    from winpos.checkpoints.io import load_checkpoint_object

    return load_vitdet_weights(model, load_checkpoint_object(path), source=source, strict=strict)
