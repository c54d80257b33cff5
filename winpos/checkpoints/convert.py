"""One conversion for every checkpoint format: an adapter's ``Adapted`` form -> a winpos backbone's state dict.

An adapter (``winpos.checkpoints.adapters``, one file per format) renames the trunk tensors of a source to winpos
names and hands over the token position embedding in one small form (``Position``). ``convert`` then does what is
the same for every source, for HieraDet and ViTDet alike:

- **shape checks**: every trunk tensor against the target; a mismatch is a ``WinposError`` naming the key, both
  shapes and what to build instead.
- **relpos tables** (``blocks.N.attn.rel_pos_h/w``) linearly resampled when their length differs (a new window or
  training size, as detectron2's ``get_rel_pos`` does), dropped (reported) where the target block has another
  position term.
- **the token embedding** turned into the target's form (``model.pos_embed``: ``AbsPosEmbed``, ``AbsWinPosEmbed``
  or none):

  ===============  ==========  ===========================================================================
  source           target      what happens
  ===============  ==========  ===========================================================================
  abs (h x w)      abs         stored flat; the grid must be the target's pretraining grid (never resized);
                               a cls row is added (zeros) or dropped to fit the target
  abs              abs-win     exact projection ``abs_to_abswin`` with the target's window: window part = the
                               mean of the full window tiles, global part = the residual; exact when the
                               target's global grid is the source grid (or the residual is zero), otherwise
                               the residual is resized (reported as lossy)
  abs-win          abs-win     window part copied (its size must match), global part resized if its grid
                               differs (lossy, reported)
  abs-win          abs         materialized on the target's pretraining grid, as the source model builds it
  any              none        dropped (reported)
  none             any         the target keeps its initialization (reported as missing)
  ===============  ==========  ===========================================================================

  Resizing the global part is bicubic, antialiased when it shrinks.
- **patch kernels** of another size (EVA-02's 14 px) resampled to the target's (16 px, the stride detectron2's
  pyramid needs) by ``resample_patch_kernel``: exact in the sense that the new kernel applied to a patch resized
  bilinearly from 14 to 16 px gives the old kernel's output on the 14 px patch. Shrinking a kernel cannot be exact
  and is reported as a loss.
- **the loss check** (``report.lost``, ``check_no_loss``): trunk weights of the source that do not load (LayerScale,
  register tokens, learned RoPE frequencies, biases; all-zero tensors lose nothing) and trunk weights of the
  target that the source lacks (left at their initialization). Heads, final norms, the cls token and the position
  terms a recipe replaces are not losses.
- **the report** (``LoadReport``): matched = copied under the same name (once the file's container prefix such
  as ``image_encoder.trunk.`` or ``backbone.net.`` is removed); converted = renamed or re-laid-out exactly;
  reshaped = values transformed (resampled, resized, materialized); missing = target parameters the source lacks,
  with why; unexpected = source keys not loaded, with why (``unknown`` when no rule recognised them).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from winpos.backbones.common import may_keep_init
from winpos.checkpoints.report import LoadReport
from winpos.errors import WinposError
from winpos.posemb.abswin import AbsPosEmbed, AbsWinPosEmbed, abs_to_abswin, abswin_embedding
from winpos.posemb.interp import resize_grid
from winpos.posemb.relpos import resample_rel_table

__all__ = ["Adapted", "Position", "check_no_loss", "convert", "resample_patch_kernel", "shape_error"]

ABS, GLOBAL, WINDOW = "pos_embed.pos_embed", "pos_embed.global_embed", "pos_embed.window_embed"
_REL = re.compile(r"^blocks\.(\d+)\.attn\.rel_pos_([hw])$")


@dataclass
class Position:
    """A source's token position embedding in one form.

    kind: ``"abs"`` (``grid (1, C, h, w)``, optional ``cls (1, 1, C)``) or ``"abswin"`` (``global_embed (1, C, gh,
        gw)`` + ``window_embed (1, C, wh, ww)``).
    keys: the file keys it came from (``grid_key`` for abs; ``global_key`` / ``window_key`` for abs-win).
    stored_shape: the abs embedding's shape as stored in the file (for messages).
    layout: how the file stored the abs grid: ``"flat"`` (``(1, [1+]N, C)``) or ``"NHWC"`` (SAM).
    antialias: the source model's own bicubic flavour (timm: True), used to materialize an abs-win embedding
        exactly as the source builds it.
    """

    kind: str
    grid: torch.Tensor | None = None
    cls: torch.Tensor | None = None
    grid_key: str = ""
    stored_shape: tuple = ()
    layout: str = "flat"
    global_embed: torch.Tensor | None = None
    window_embed: torch.Tensor | None = None
    global_key: str = ""
    window_key: str = ""
    antialias: bool = False

    @property
    def keys(self) -> tuple[str, ...]:
        return (self.grid_key,) if self.kind == "abs" else (self.global_key, self.window_key)


@dataclass
class Adapted:
    """What an adapter makes of a source state dict.

    source: the format's name (``report.source``).
    trunk: winpos name -> ``(file key, tensor)`` for every trunk tensor.
    position: the token embedding, or None when the source has none.
    ignored: ``(file key, why, known)`` for source keys that are not loaded (heads, necks, decoders, tokens);
        ``known=False`` when no rule recognised them.
    lost: ``(file key, why)`` for the ignored keys that are trunk weights of the source (register tokens): a
        conversion that loses them is partial (``LoadReport.lost``).
    prefix: the container prefix the adapter removed (``image_encoder.trunk.``); a key equal to it plus the winpos
        name counts as matched, not renamed.
    """

    source: str
    trunk: dict[str, tuple[str, torch.Tensor]] = field(default_factory=dict)
    position: Position | None = None
    ignored: list[tuple[str, str, bool]] = field(default_factory=list)
    prefix: str = ""
    lost: list[tuple[str, str]] = field(default_factory=list)

    def ignore(self, key: str, why: str, known: bool = True, lost: bool = False) -> None:
        self.ignored.append((key, why, known))
        if lost:
            self.lost.append((key, why))


def shape_error(key: str, expected, found, hint: str) -> WinposError:
    """The one shape-mismatch message: the file key, both shapes and what to build instead."""
    return WinposError(f"checkpoint key {key} has shape {tuple(found)} but the model expects {tuple(expected)}; "
                       f"{hint}")


def _name(src: str, dst: str) -> str:
    return f"'{src}'" if src.endswith(dst) else f"'{src}' (winpos '{dst}')"


class _Run:
    """One conversion into ``model`` (or, with ``model=None``, into the source's own form without checks)."""

    def __init__(self, adapted: Adapted, model: nn.Module | None, target_name: str):
        self.a, self.model = adapted, model
        self.target = None if model is None else model.state_dict()
        self.out: dict[str, torch.Tensor] = {}
        self.report = LoadReport(adapted.source, target=target_name)

    def note(self, dst: str, src: str, how: str | None = None) -> None:
        if how:
            self.report.add_converted(dst, how)
        elif src in (dst, self.a.prefix + dst):
            self.report.add_matched(dst)
        else:
            self.report.add_converted(dst, f"renamed from '{src}'")

    # ---- trunk ---------------------------------------------------------------------------------------------------
    def trunk(self, dst: str, src: str, value: torch.Tensor) -> None:
        if self.target is None:
            self.out[dst] = value
            self.note(dst, src)
            return
        rel = _REL.match(dst)
        if dst not in self.target:
            if rel and int(rel.group(1)) < len(self.model.blocks):
                kind = self.model.blocks[int(rel.group(1))].attn.position.kind
                self.report.add_unexpected(src, f"block {rel.group(1)} of the target uses position term {kind!r}, "
                                                "not relpos")
            else:
                why = "no such parameter in the target model (more blocks, or another layout)"
                if dst.endswith(".bias") and not value.any():  # DINOv3's distilled models: an all-zero qkv.bias
                    self.report.add_unexpected(src, f"an all-zero bias, the same as none ({why})")
                else:
                    self.report.add_unexpected(src, why, known=False)
                    self.report.add_lost(src, f"a trunk weight of the source with no place in the target ({why}; "
                                              f"winpos name '{dst}')")
            return
        want = tuple(self.target[dst].shape)
        if dst == "patch_embed.proj.weight" and value.dim() == 4 and tuple(value.shape[:2]) == want[:2] \
                and tuple(value.shape[2:]) != want[2:]:
            self.out[dst] = resample_patch_kernel(value, want[2:])
            how = (f"patch kernel resampled {tuple(value.shape[2:])} -> {want[2:]} px (pseudo-inverse of bilinear "
                   "resizing: exact on each patch resized to the new size)")
            self.report.add_reshaped(dst, how)
            if want[2] < value.shape[2] or want[3] < value.shape[3]:
                self.report.add_lost(src, "patch kernel shrunk: a smaller kernel cannot reproduce the larger one")
            return
        if dst.endswith(".attn.rope.freqs") and value.dim() == 2 and value.numel() == self.target[dst].numel():
            # the RoPE-ViT authors keep heads flat: (2, heads * D/2), heads-major
            self.out[dst] = value.reshape(want)
            self.report.add_converted(dst, f"learned frequencies of '{src}' laid out per head {tuple(value.shape)} "
                                           f"-> {want}")
            return
        if rel:
            if value.dim() != 2 or value.shape[1] != want[1]:
                raise shape_error(_name(src, dst), want, value.shape, "relpos tables are (2*extent-1, head_dim); the "
                                  "head_dim (embed_dim / num_heads) must match the checkpoint")
            if value.shape[0] != want[0]:
                self.out[dst] = resample_rel_table(value.float(), want[0]).to(value.dtype)
                self.report.add_reshaped(dst, f"relpos table resampled linearly from length {value.shape[0]} to "
                                              f"{want[0]} (like detectron2's get_rel_pos at the new extent)")
                return
        elif tuple(value.shape) != want:
            raise shape_error(_name(src, dst), want, value.shape, "the checkpoint is for another size (embed_dim, "
                              "heads, mlp_ratio, window): build the matching preset or pass the right overrides")
        self.out[dst] = value
        self.note(dst, src)

    # ---- position ------------------------------------------------------------------------------------------------
    def position(self, pos: Position | None) -> None:
        emb = None if self.model is None else getattr(self.model, "pos_embed", None)
        if self.model is None:
            self._keep(pos)
        elif pos is None:
            for k in (ABS,) if isinstance(emb, AbsPosEmbed) else (GLOBAL, WINDOW) if emb is not None else ():
                self.report.add_missing(k, "the checkpoint has no token position embedding; keeps its initialization")
        elif emb is None:
            for key in pos.keys:
                self.report.add_unexpected(key, "the target has pos_embed='none'; the embedding is dropped")
        elif isinstance(emb, AbsPosEmbed):
            if pos.kind == "abs":
                self._abs_to_abs(pos, emb)
            else:
                self._abswin_to_abs(pos, emb)
        elif isinstance(emb, AbsWinPosEmbed):
            if pos.kind == "abs":
                self._abs_to_abswin(pos, emb)
            else:
                self._abswin_to_abswin(pos, emb)
        else:
            raise WinposError(f"the target's token embedding is a {type(emb).__name__}; winpos converts into "
                              "AbsPosEmbed or AbsWinPosEmbed only")

    def _keep(self, pos: Position | None) -> None:
        if pos is None:
            return
        if pos.kind == "abs":
            self.out[ABS] = pos.grid.flatten(2).transpose(1, 2)
            self.note(ABS, pos.grid_key, None if pos.layout == "flat" and pos.cls is None else
                      f"{pos.layout} grid stored flat without its cls row")
        else:
            self.out[GLOBAL], self.out[WINDOW] = pos.global_embed, pos.window_embed
            self.note(GLOBAL, pos.global_key)
            self.note(WINDOW, pos.window_key)

    def _abs_to_abs(self, pos: Position, emb: AbsPosEmbed) -> None:
        grid, h_w = pos.grid, tuple(pos.grid.shape[-2:])
        if grid.shape[1] != self.target[ABS].shape[-1] or h_w != tuple(emb.pretrain_hw):
            stride = getattr(self.model, "patch_size", None) or self.model.strides[0]
            cls_hint = f" and pretrain_use_cls_token={pos.cls is not None}" if hasattr(self.model, "patch_size") else ""
            node = "model.backbone.net" if hasattr(self.model, "patch_size") else "model.backbone.bottom_up"
            raise shape_error(_name(pos.grid_key, ABS), self.target[ABS].shape, pos.stored_shape,
                              f"the checkpoint's embedding is a {h_w[0]}x{h_w[1]} grid of {grid.shape[1]} channels: "
                              f"build the model with pretrain_img_size={h_w[0] * stride}{cls_hint} and the "
                              "checkpoint's embed_dim (winpos-convert takes the file's grid itself unless --set "
                              f"says otherwise: --set pretrain_img_size={h_w[0] * stride}"
                              f"{cls_hint.replace(' and ', ' --set ')}; a detectron2 config sets them on its "
                              f"backbone node, e.g. {node}.pretrain_img_size="
                              f"{h_w[0] * stride}{cls_hint.replace(' and ', f' {node}.')})")
        flat = grid.flatten(2).transpose(1, 2)  # (1, h*w, C) row-major, as detectron2 / Hiera store it
        notes = [] if pos.layout == "flat" else [f"{pos.layout} grid flattened row-major"]
        cls = pos.cls
        if emb.has_cls:
            if cls is None:
                cls = flat.new_zeros(1, 1, flat.shape[-1])
                notes.append("zero cls row added (never used in the forward pass)")
            flat = torch.cat([cls, flat], dim=1)
        elif cls is not None:
            notes.append("cls row dropped (detectron2's get_abs_pos drops it too)")
        self.out[ABS] = flat
        self.note(ABS, pos.grid_key, "; ".join(notes) or None)

    def _abswin_to_abs(self, pos: Position, emb: AbsPosEmbed) -> None:
        self._check_abswin_channels(pos)
        h, w = emb.pretrain_hw
        g, win = pos.global_embed, pos.window_embed
        flat = abswin_embedding(g.float(), win.float(), (h, w), pos.antialias).to(g.dtype).flatten(2).transpose(1, 2)
        if emb.has_cls:
            flat = torch.cat([flat.new_zeros(1, 1, flat.shape[-1]), flat], dim=1)
        self.out[ABS] = flat
        self.report.add_reshaped(ABS, f"abs-win ({pos.global_key} + tiled {pos.window_key}) materialized on the "
                                      f"{h}x{w} pretraining grid of the target's abs embedding")

    def _abs_to_abswin(self, pos: Position, emb: AbsWinPosEmbed) -> None:
        grid, want_w = pos.grid, tuple(self.target[WINDOW].shape[-2:])
        if grid.shape[1] != self.target[WINDOW].shape[1]:
            raise shape_error(_name(pos.grid_key, ABS), (1, self.target[WINDOW].shape[1]) + tuple(grid.shape[-2:]),
                              grid.shape, "embed_dim differs: build the matching preset")
        g, win = abs_to_abswin(grid.float(), want_w)
        h, w = grid.shape[-2:]
        self.out[WINDOW] = win.to(grid.dtype)
        self.report.add_converted(WINDOW, f"mean of the {h // want_w[0]}x{w // want_w[1]} full {want_w[0]}x"
                                          f"{want_w[1]} tiles of {pos.grid_key} (exact abs -> abs-win)")
        self._global(g.to(grid.dtype), emb, pos.grid_key, (h, w), residual=True)

    def _abswin_to_abswin(self, pos: Position, emb: AbsWinPosEmbed) -> None:
        self._check_abswin_channels(pos)
        w = pos.window_embed
        if tuple(w.shape) != tuple(self.target[WINDOW].shape):
            raise shape_error(_name(pos.window_key, WINDOW), self.target[WINDOW].shape, w.shape,
                              f"the window embedding is {w.shape[-2]}x{w.shape[-1]}: build the target with that "
                              "window size")
        self.out[WINDOW] = w
        self.note(WINDOW, pos.window_key)
        g = pos.global_embed
        self._global(g, emb, pos.global_key, tuple(g.shape[-2:]), residual=False)

    def _global(self, g, emb: AbsWinPosEmbed, key: str, source_hw, residual: bool) -> None:
        """Store the global part ``g`` at the target's global grid; exact when it fits, otherwise resized."""
        want = tuple(self.target[GLOBAL].shape[-2:])
        same = tuple(g.shape[-2:]) == want
        periodic_ok = emb.mode == "single" or tuple(emb.base_hw) == tuple(source_hw)
        if same and periodic_ok:
            self.out[GLOBAL] = g
            if residual:
                self.report.add_converted(GLOBAL, "residual of the tiled window embedding (exact)")
            else:
                self.note(GLOBAL, key)
            return
        if not g.any():
            self.out[GLOBAL] = g.new_zeros(1, g.shape[1], *want)
            self.report.add_converted(GLOBAL, f"zeros: the {source_hw[0]}x{source_hw[1]} source is fully periodic "
                                              "with the window, so the residual is zero (exact)")
            return
        shrink = want[0] < g.shape[-2] or want[1] < g.shape[-1]
        self.out[GLOBAL] = resize_grid(g.float(), want, antialias=shrink).to(g.dtype)
        if not periodic_ok:
            why = (f"lossy: abswin_recursive is periodic with its {emb.base_hw[0]}x{emb.base_hw[1]} base grid and "
                   f"cannot hold this {source_hw[0]}x{source_hw[1]} source's non-periodic residual; use "
                   "pos_embed='abswin' to keep it")
        else:
            why = (f"global embedding resized {tuple(g.shape[-2:])} -> {want} (bicubic{', antialiased' if shrink else ''}"
                   f"; lossy: to keep it exact, convert with --pos-global-size {g.shape[-2]} (pos_global_size="
                   f"{g.shape[-2]}) and build the model with the same pos_global_size)")
        self.report.add_reshaped(GLOBAL, why)

    def _check_abswin_channels(self, pos: Position) -> None:
        C = self.target[GLOBAL].shape[1] if GLOBAL in self.target else self.target[ABS].shape[-1]
        for key, t in ((pos.global_key, pos.global_embed), (pos.window_key, pos.window_embed)):
            if t.dim() != 4 or t.shape[0] != 1 or t.shape[1] != C:
                raise shape_error(f"'{key}'", (1, C, "h", "w"), t.shape, "embed_dim differs: build the matching "
                                  "preset")

    # ---- the rest ------------------------------------------------------------------------------------------------
    def finish(self):
        for key, why, known in self.a.ignored:
            self.report.add_unexpected(key, why, known=known)
        for key, why in self.a.lost:
            self.report.add_lost(key, why)
        if self.target is not None:
            noted = {k for k, _ in self.report.missing}
            for key in self.target:
                if key not in self.out and key not in noted:
                    self.report.add_missing(key, _missing_reason(key))
                    if not may_keep_init(key):
                        self.report.add_lost(key, _AT_INIT + ": it would stay at its initialization")
        return self.out, self.report


_AT_INIT = "a trunk weight of the target that the source lacks"


def _missing_reason(key: str) -> str:
    if "rel_pos" in key:
        return "block relpos table: new in this recipe, keeps its initialization"
    if "rope" in key:
        return "RoPE frequencies: new in this recipe, keep their initialization"
    if ".ls1." in key or ".ls2." in key:
        return "LayerScale: not in the checkpoint, keeps its initial gain"
    if may_keep_init(key):
        return "not in the source checkpoint; keeps its initialization"
    return "not in the source checkpoint; keeps its initialization (a trunk weight: is this the right checkpoint?)"


def resample_patch_kernel(weight: torch.Tensor, size) -> torch.Tensor:
    """A patch-embedding kernel ``(C, in, kh, kw)`` resampled to ``size``: the kernel ``w'`` with ``<R x, w'> = <x,
    w>`` for every patch ``x``, R the bilinear resize to ``size`` (least squares via the pseudo-inverse of R; exact
    when growing, since R then has full row rank). Computed in float64, returned in the kernel's dtype."""
    old, size = tuple(weight.shape[-2:]), tuple(int(s) for s in size)
    n = old[0] * old[1]
    basis = torch.eye(n, dtype=torch.float64).reshape(n, 1, *old)
    resize = F.interpolate(basis, size=size, mode="bilinear", align_corners=False).reshape(n, -1)  # (n_old, n_new)
    flat = weight.to(torch.float64).reshape(-1, n)
    return (flat @ torch.linalg.pinv(resize).T).reshape(*weight.shape[:2], *size).to(weight.dtype)


def check_no_loss(report: LoadReport, allow_loss: bool = False,
                  accept: str = "pass --allow-loss (allow_loss=True)") -> None:
    """Refuse a partial conversion: ``report.lost`` non-empty raises a ``WinposError`` naming what would be lost
    and, in ``accept``, how the caller's user accepts it (``allow_loss``: accepted; the caller records
    ``report.lost``)."""
    if not report.lost or allow_loss:
        return
    at_init = [k for k, why in report.lost if why.startswith(_AT_INIT)]
    dropped = [k for k, why in report.lost if not why.startswith(_AT_INIT)]

    def some(keys):
        return ", ".join(keys[:5]) + (f", ... ({len(keys)})" if len(keys) > 5 else "")

    parts = ([f"drop {len(dropped)} trunk weights of the source ({some(dropped)})"] if dropped else []) + \
        ([f"leave {len(at_init)} trunk weights of the target at their initialization ({some(at_init)})"]
         if at_init else [])
    raise WinposError(f"the conversion {report.source} -> {report.target} is partial: it would {' and '.join(parts)}; "
                      "convert to a target that holds them (its family's preset: winpos.backbones.list_presets()), or "
                      f"{accept} to accept the loss, which is recorded in the output")


def convert(adapted: Adapted, model: nn.Module | None, target_name: str | None = None):
    """Convert an adapter's output into ``model``'s names, shapes and position form.

    Args:
        adapted: from ``winpos.checkpoints.adapters.adapt``.
        model: the target HieraDet / ViTDet (its state dict and ``pos_embed`` module decide every conversion), or
            None to keep the source's own form (renamed, not checked).
        target_name: for the report (default ``"winpos <class name>"``).
    Returns:
        ``(state_dict, LoadReport)``; the state dict holds only keys of the target.
    """
    name = target_name or ("winpos" if model is None else f"winpos {type(model).__name__}")
    run = _Run(adapted, model, name)
    for dst, (src, value) in adapted.trunk.items():
        run.trunk(dst, src, value)
    run.position(adapted.position)
    return run.finish()
