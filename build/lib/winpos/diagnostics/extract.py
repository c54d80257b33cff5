"""Find the position embedding in another project's checkpoint and turn it into the grid the model adds.

``effective_embeddings(path_or_obj)`` returns one ``EmbeddingInfo`` per position embedding found: the ``(C, H, W)``
grid that is added to the tokens, the window size the family's attention uses, the patch stride, the image size
the grid belongs to, and the abs-win ``(global, window)`` parts (from the checkpoint for abs-win families, from
the exact projection for the others: the window part is the mean full window-aligned tile, the global part the
residual). Each family is recognised by the key names and shapes its checkpoints use (see ``FAMILIES``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from winpos.checkpoints.io import load_checkpoint_object, unwrap_state_dict
from winpos.diagnostics.metrics import abswin_embed, abswin_parts_from_grid
from winpos.errors import as_hw, check_choice

__all__ = ["EmbeddingInfo", "FAMILIES", "effective_embeddings"]


@dataclass(frozen=True)
class FamilySpec:
    window: int  # attention window in tokens (stage 1 for Hiera-like models)
    stride: int  # patch stride in px
    antialias: bool  # the family's own bicubic resize: antialiased (timm's Hiera models) or plain
    ceil_grid: bool  # stride-4 conv stems (kernel 7, pad 3) give ceil(px / 4) tokens; ViT stems floor(px / 16)
    describe: str


FAMILIES: dict[str, FamilySpec] = {
    "hiera": FamilySpec(8, 4, False, True, "official Hiera (model_state/pos_embed (1, N, C), 8x8-token mask units)"),
    "timm_hiera": FamilySpec(8, 4, True, True, "timm Hiera (pos_embed (1, N, C))"),
    "timm_hiera_abswin": FamilySpec(8, 4, True, True, "timm Hiera abs-win (pos_embed + pos_embed_win)"),
    "sam2": FamilySpec(8, 4, False, True, "SAM2 HieraDet trunk (pos_embed + pos_embed_window)"),
    "sam": FamilySpec(14, 16, False, False, "SAM v1 image encoder (pos_embed (1, 64, 64, C) NHWC)"),
    "mae": FamilySpec(14, 16, False, False, "MAE / timm ViT (pos_embed (1, 1+N, C) with a cls row)"),
    "vitdet": FamilySpec(14, 16, False, False, "detectron2 ViTDet (backbone.net.pos_embed (1, 1+N, C))"),
    # winpos's own checkpoints: key layout provisional until the winpos backbones settle; see _WINPOS_KEYS.
    "winpos": FamilySpec(8, 4, False, True, "winpos backbone (pos_embed.global_embed + pos_embed.window_embed)"),
}
_NATIVE_PX = {"sam2": 1024, "winpos": 1024}  # SAM2 trains every size at 1024 px; winpos targets detection

# Hook for winpos's own layout: the last key components of (global, window) or of a plain embedding.
_WINPOS_KEYS = {"global": "global_embed", "window": "window_embed", "plain": "pos_embed.pos_embed"}


@dataclass
class EmbeddingInfo:
    """One position embedding found in a checkpoint.

    Attributes:
        name: the checkpoint key it came from.
        family: one of ``FAMILIES``.
        grid: ``(C, H, W)`` fp32 embedding added to the tokens at ``image_hw``.
        window: attention window in tokens used for the metrics.
        stride: patch stride in px (tokens = px / stride).
        image_hw: image size in px that ``grid`` belongs to.
        antialias: the family's bicubic flavour for naive resizing.
        global_embed / window_embed: abs-win parts ``(C, gh, gw)`` / ``(C, w, w)``, or None if no full window fits.
        abswin_source: "checkpoint" (the model is abs-win) or "projection" (parts computed from ``grid``).
        notes: caveats worth showing the user.
    """

    name: str
    family: str
    grid: torch.Tensor
    window: int
    stride: int
    image_hw: tuple[int, int]
    antialias: bool
    global_embed: torch.Tensor | None = None
    window_embed: torch.Tensor | None = None
    abswin_source: str | None = None
    notes: list[str] = field(default_factory=list)
    source: str = "<object>"

    def grid_hw_for(self, image_px) -> tuple[int, int]:
        """Token grid ``(H, W)`` for an image of ``image_px`` (int or ``(h, w)``) pixels."""
        h, w = as_hw(image_px, "image size")
        rnd = math.ceil if FAMILIES[self.family].ceil_grid else math.floor
        return (max(1, rnd(h / self.stride)), max(1, rnd(w / self.stride)))

    def abswin_at(self, hw) -> torch.Tensor | None:
        """The abs-win grid ``(C, H, W)`` at token grid ``hw``, or None without parts."""
        if self.global_embed is None or self.window_embed is None:
            return None
        return abswin_embed(self.global_embed, self.window_embed, hw, antialias=self.antialias)


def _square_side(n: int) -> int | None:
    s = math.isqrt(n)
    return s if s * s == n else None


def _flat_to_grid(t: torch.Tensor, key: str, has_cls: bool | None) -> tuple[torch.Tensor, bool]:
    """``(1, [1+]N, C) -> (C, h, w)``; detects the cls row when ``has_cls`` is None."""
    if t.dim() != 3 or t.shape[0] != 1:
        raise ValueError(f"'{key}' has shape {tuple(t.shape)}, expected a flat (1, N, C) embedding")
    n = t.shape[1]
    if has_cls is None:
        has_cls = _square_side(n) is None and _square_side(n - 1) is not None
    side = _square_side(n - int(has_cls))
    if side is None:
        raise ValueError(f"'{key}' holds {n} tokens, which is not a square grid (with or without a cls row); "
                         "pass family= explicitly or reshape it to (1, C, H, W) yourself")
    tokens = t[0, int(has_cls):]
    return tokens.T.reshape(-1, side, side).float(), has_cls


def _patch_kernel(sd: dict, prefix: str) -> int | None:
    w = sd.get(prefix + "patch_embed.proj.weight")
    return int(w.shape[-1]) if isinstance(w, torch.Tensor) and w.dim() == 4 else None


def _groups(sd: dict) -> dict[str, set[str]]:
    """Group candidate position keys by their module prefix."""
    names = ("pos_embed", "pos_embed_window", "pos_embed_win", "pos_embed_spatial", "position_embeddings",
             _WINPOS_KEYS["global"], _WINPOS_KEYS["window"])
    out: dict[str, set[str]] = {}
    for k in sd:
        prefix, _, last = k.rpartition(".")
        if last in names:
            out.setdefault(prefix + "." if prefix else "", set()).add(last)
    return out


def _guess_family(sd: dict, prefix: str, lasts: set[str]) -> str | None:
    """Name the family of one key group from its key names and shapes (those listed in ``FAMILIES``), or None."""
    if {"pos_embed", "pos_embed_window"} <= lasts:
        return "sam2"
    if {"pos_embed", "pos_embed_win"} <= lasts:
        return "timm_hiera_abswin"
    if {_WINPOS_KEYS["global"], _WINPOS_KEYS["window"]} <= lasts or (prefix + "pos_embed").endswith(
            _WINPOS_KEYS["plain"]):
        return "winpos"
    key = prefix + ("pos_embed" if "pos_embed" in lasts else "pos_embed_spatial" if "pos_embed_spatial" in lasts
                    else "position_embeddings" if "position_embeddings" in lasts else "")
    t = sd.get(key)
    if not isinstance(t, torch.Tensor):
        return None
    if t.dim() == 4:  # SAM v1 stores NHWC (1, H, W, C) with a square grid; anything else is not known
        return "sam" if t.shape[1] == t.shape[2] and t.shape[3] != t.shape[1] else None
    if t.dim() != 3:
        return None
    if prefix.endswith("backbone.net."):
        return "vitdet"
    n = t.shape[1]
    kernel = _patch_kernel(sd, prefix)
    if (_square_side(n) is None and _square_side(n - 1) is not None) or (kernel is not None and kernel >= 14):
        return "mae"
    if _square_side(n) is None:
        return None
    # a square grid without cls at stride 4: Hiera; timm renames the head to head.fc
    return "timm_hiera" if prefix + "head.fc.weight" in sd else "hiera"


def _fits(sd: dict, prefix: str, lasts: set[str], family: str) -> bool:
    """Whether a key group holds what ``family`` needs (used when the family is forced)."""
    def dims(last):
        t = sd.get(prefix + last)
        return t.dim() if isinstance(t, torch.Tensor) else None

    if family == "sam2":
        return "pos_embed_window" in lasts and dims("pos_embed") == 4
    if family == "timm_hiera_abswin":
        return "pos_embed_win" in lasts and dims("pos_embed") == 4
    if family == "winpos":
        return {_WINPOS_KEYS["global"], _WINPOS_KEYS["window"]} <= lasts or dims("pos_embed") == 3
    if family == "sam":
        return dims("pos_embed") == 4 and not ({"pos_embed_window", "pos_embed_win"} & lasts)
    return any(dims(k) == 3 for k in ("pos_embed", "pos_embed_spatial", "position_embeddings"))


def _nchw(t: torch.Tensor, key: str) -> torch.Tensor:
    if t.dim() != 4 or t.shape[0] != 1:
        raise ValueError(f"'{key}' has shape {tuple(t.shape)}, expected (1, C, h, w)")
    return t[0].float()


def _build(sd: dict, prefix: str, lasts: set[str], family: str, window: int | None, resolution) -> EmbeddingInfo:
    spec = FAMILIES[family]
    notes: list[str] = []
    gparts = None
    if family in ("sam2", "timm_hiera_abswin"):
        wkey = prefix + ("pos_embed_window" if family == "sam2" else "pos_embed_win")
        name = prefix + "pos_embed"
        gparts = (_nchw(sd[name], name), _nchw(sd[wkey], wkey))
    elif family == "winpos" and _WINPOS_KEYS["global"] in lasts:
        name = prefix + _WINPOS_KEYS["global"]
        wkey = prefix + _WINPOS_KEYS["window"]
        gparts = (_nchw(sd[name], name), _nchw(sd[wkey], wkey))
        notes.append("winpos checkpoint layout is provisional (global/window embeddings assumed NCHW)")
    elif family == "sam":
        name = prefix + "pos_embed"
        t = sd[name]
        if t.dim() != 4 or t.shape[0] != 1:
            raise ValueError(f"'{name}' has shape {tuple(t.shape)}, expected SAM's (1, H, W, C)")
        grid = t[0].permute(2, 0, 1).float()
    else:
        name = prefix + next(k for k in ("pos_embed", "pos_embed_spatial", "position_embeddings") if k in lasts)
        has_cls = None if family in ("mae", "vitdet", "winpos") else False
        grid, has_cls = _flat_to_grid(sd[name], name, has_cls)
        if has_cls:
            notes.append("cls row dropped (as detectron2's get_abs_pos does)")
    stride = spec.stride
    if family in ("mae", "winpos"):
        # winpos nests its parameters in a `pos_embed` module: the patch embed sits next to that module
        model_prefix = prefix[: -len("pos_embed.")] if prefix.endswith("pos_embed.") else prefix
        kernel = _patch_kernel(sd, model_prefix)
        stride = kernel if kernel is not None and kernel >= 14 else spec.stride
    default_w = 14 if family == "winpos" and stride >= 14 else spec.window  # winpos ViT vs HieraDet
    w = window or (int(gparts[1].shape[-1]) if gparts is not None else default_w)

    if gparts is not None:
        g, win = gparts
        native = _NATIVE_PX.get(family, g.shape[-1] * 4 * stride)  # timm abswin: global grid at 1/16 of the image
        px = as_hw(resolution if resolution is not None else native, "resolution")
        rnd = math.ceil if spec.ceil_grid else math.floor
        hw = (rnd(px[0] / stride), rnd(px[1] / stride))
        grid = abswin_embed(g, win, hw, antialias=spec.antialias)
        if resolution is None and family not in _NATIVE_PX:
            notes.append(f"native size assumed {px[0]} px (global grid x 16); pass resolution= to change it")
        source = "checkpoint"
    else:
        px = (grid.shape[1] * stride, grid.shape[2] * stride)
        if resolution is not None and as_hw(resolution, "resolution") != px:
            raise ValueError(
                f"'{name}' is stored at a fixed {grid.shape[1]}x{grid.shape[2]} grid ({px[0]}x{px[1]} px), so "
                f"resolution={resolution} cannot rebuild it; leave resolution=None and pass the size to "
                "analyze(target_sizes=...) to see it interpolated"
            )
        if grid.shape[1] >= w and grid.shape[2] >= w:
            g, win = abswin_parts_from_grid(grid, w)
            gparts, source = (g, win), "projection"
        else:
            source = None
            notes.append(f"the {grid.shape[1]}x{grid.shape[2]} grid is smaller than a {w}x{w} window: no abs-win parts")
    return EmbeddingInfo(
        name=name, family=family, grid=grid.float().contiguous(), window=int(w), stride=int(stride),
        image_hw=tuple(int(v) for v in px), antialias=spec.antialias,
        global_embed=None if gparts is None else gparts[0].float(),
        window_embed=None if gparts is None else gparts[1].float(), abswin_source=source, notes=notes,
    )


def effective_embeddings(obj_or_path: Any, family: str = "auto", resolution=None,
                         window: int | None = None) -> list[EmbeddingInfo]:
    """Extract every position embedding of a checkpoint as the grid the model adds to its tokens.

    Args:
        obj_or_path: a checkpoint path (read safely with ``winpos.checkpoints.io``) or an already loaded object
            (container or flat state dict of tensors).
        family: ``"auto"`` or one of ``FAMILIES``; forces the interpretation of the keys.
        resolution: image size in px (int or pair) at which abs-win families build their grid (SAM2: 1024 by
            default). Stored-grid families only accept their own size here.
        window: window size override in tokens (e.g. 56 for SAM2's 224-px super-window).
    Returns:
        A list of ``EmbeddingInfo``, one per embedding found (usually one).
    Raises:
        ValueError: no position embedding found (lists a sample of the keys), or shapes that do not fit the family.
    """
    if family != "auto":
        check_choice("family", family, FAMILIES)
    source = "<object>"
    if isinstance(obj_or_path, (str, os.PathLike)):
        source = str(obj_or_path)
        obj = load_checkpoint_object(obj_or_path)
    else:
        obj = obj_or_path
    sd = unwrap_state_dict(obj, source=f"checkpoint '{source}'")
    infos = []
    for prefix, lasts in sorted(_groups(sd).items()):
        fam = _guess_family(sd, prefix, lasts) if family == "auto" else family
        if fam is None or not _fits(sd, prefix, lasts, fam):
            continue
        info = _build(sd, prefix, lasts, fam, window, resolution)
        info.source = source
        infos.append(info)
    if not infos:
        pos = [f"{k} {tuple(sd[k].shape)}" for k in sd if "pos" in k.lower()][:10]
        sample = pos or list(sd)[:15]
        what = "position-like keys" if pos else "keys"
        fams = "" if family == "auto" else f" of family '{family}'"
        raise ValueError(
            f"no absolute position embedding{fams} found in checkpoint '{source}' ({len(sd)} tensors; {what}: "
            f"{sample}); it may use only relative/rotary positions, or be a family winpos does not know: pass "
            f"family= one of {sorted(FAMILIES)} or extract the (C, H, W) grid yourself"
        )
    return infos
