"""Find the position embedding in another project's checkpoint and turn it into the grid the model adds.

``effective_embeddings(path_or_obj)`` returns one ``EmbeddingInfo`` per position embedding found: the ``(C, H, W)``
grid that is added to the tokens, the window size the format's attention uses, the patch stride, the image size
the grid belongs to, and the abs-win ``(global, window)`` parts (from the checkpoint for abs-win families, from
the exact projection for the others: the window part is the mean full window-aligned tile, the global part the
residual). The checkpoint's format is told by ``winpos.checkpoints.formats.detect`` (the importers' detector; the same
names), and each format's window, stride and resize flavour come from its ``Format.spec``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from winpos.checkpoints.formats import FORMATS, Format, detect, parse_format
from winpos.checkpoints.io import load_checkpoint_object, safetensors_metadata, unwrap_state_dict
from winpos.checkpoints.presets import matching_presets, trunk_width_depth
from winpos.diagnostics.metrics import abswin_embed, abswin_parts_from_grid
from winpos.errors import WinposError, as_hw

__all__ = ["EmbeddingInfo", "FORMATS", "effective_embeddings"]


_NATIVE_PX = {Format.SAM2: 1024, Format.WINPOS: 1024}  # SAM2 trains every size at 1024 px; winpos targets detection
_NATIVE_WHY = {Format.SAM2: "SAM2 trains at 1024 px", Format.WINPOS: "assumed: the detection size; pass --native-size "
               "(resolution=) or keep the run's config.yaml next to the checkpoint"}


@dataclass
class EmbeddingInfo:
    """One position embedding found in a checkpoint.

    Attributes:
        name: the checkpoint key it came from.
        format: the checkpoint's ``Format`` (a str: ``"sam2"``, ``"hiera"``, ...).
        grid: ``(C, H, W)`` fp32 embedding added to the tokens at ``image_hw``.
        window: attention window in tokens used for the metrics.
        stride: patch stride in px (tokens = px / stride).
        image_hw: image size in px that ``grid`` belongs to.
        antialias: the format's bicubic flavour for naive resizing.
        global_embed / window_embed: abs-win parts ``(C, gh, gw)`` / ``(C, w, w)``, or None if no full window fits.
        abswin_source: "checkpoint" (the model is abs-win) or "projection" (parts computed from ``grid``).
        notes: caveats worth showing the user.
        native_from: where ``image_hw`` came from (the stored grid and patch size, the run's config.yaml, a flag,
            the format's training size, or an assumption), printed with every report.
        presets: winpos presets whose embedding width and depth match the checkpoint (for ``--to``).
    """

    name: str
    format: Format
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
    native_from: str = ""
    presets: list[str] = field(default_factory=list)

    def grid_hw_for(self, image_px) -> tuple[int, int]:
        """Token grid ``(H, W)`` for an image of ``image_px`` (int or ``(h, w)``) pixels."""
        h, w = as_hw(image_px, "image size")
        rnd = math.ceil if self.format.spec.ceil_grid else math.floor
        return (max(1, rnd(h / self.stride)), max(1, rnd(w / self.stride)))

    def abswin_at(self, hw) -> torch.Tensor | None:
        """The abs-win grid ``(C, H, W)`` at token grid ``hw``, or None without parts."""
        if self.global_embed is None or self.window_embed is None:
            return None
        return abswin_embed(self.global_embed, self.window_embed, hw, antialias=self.antialias)


def _adapted_position(sd: dict, fmt: Format):
    """The format's adapter on ``sd``: ``(Position or None, patch-embedding kernel or None, key prefix)``.

    winpos's own files may hold a whole detector: the trunk is found under its prefix first. A video Hiera's
    spatial embedding (``pos_embed_spatial``) is read as an image Hiera's ``pos_embed``.
    """
    from winpos.checkpoints.adapters import adapt
    from winpos.checkpoints.adapters.winpos_native import trunk_prefix

    prefix = trunk_prefix(sd) if fmt == Format.WINPOS else ""
    if prefix:
        sd = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
    video = fmt in (Format.HIERA, Format.TIMM_HIERA) and "pos_embed_spatial" in sd
    if video:
        sd = {"pos_embed": sd["pos_embed_spatial"]}
    adapted = adapt(sd, fmt)
    pos = adapted.position
    if video and pos is not None:
        pos.grid_key = "pos_embed_spatial"
    patch = adapted.trunk.get("patch_embed.proj.weight", (None, None))[1]
    kernel = int(patch.shape[-1]) if isinstance(patch, torch.Tensor) and patch.dim() == 4 else None
    return pos, kernel, prefix, trunk_width_depth({k: v[1] for k, v in adapted.trunk.items()})[1]


# keys of a run's backbone node that belong to winpos.d2's adapter or to training, not to the backbone's shape
RUN_ONLY_KEYS = ("_target_", "net", "recipe", "out_feature", "out_features", "norm", "norm_eps", "size_divisibility",
                 "square_pad", "drop_path_rate")


def run_config_beside(checkpoint) -> tuple[dict, str] | None:
    """The ``config.yaml`` that winpos's trainer writes next to its checkpoints, read as plain data (YAML tags such
    as detectron2's ShapeSpec become None, never objects; no detectron2 needed), with its path; None when there is
    no such file or it is not a readable mapping."""
    import yaml

    path = os.path.join(os.path.dirname(os.path.abspath(checkpoint)), "config.yaml")
    if not os.path.isfile(path):
        return None

    class _Loader(yaml.SafeLoader):  # read as data: python tags (detectron2's ShapeSpec) become None, never objects
        pass

    _Loader.add_multi_constructor("", lambda loader, suffix, node: None)
    try:
        with open(path) as f:
            cfg = yaml.load(f, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass that builds no objects
    except (OSError, yaml.YAMLError):
        return None
    return (cfg, path) if isinstance(cfg, dict) else None


def run_backbone_beside(checkpoint) -> tuple[str, str, dict, str] | None:
    """The winpos backbone of the run whose ``config.yaml`` is next to ``checkpoint``: ``(preset, recipe,
    constructor arguments, the config's path)``, the arguments being the backbone node's (``model.backbone.bottom_up``
    or ``model.backbone.net``) without the adapter's and training's keys (``RUN_ONLY_KEYS``), lists as tuples;
    None when there is no such file or node."""
    found = run_config_beside(checkpoint)
    if found is None:
        return None
    cfg, path = found
    backbone = cfg.get("model", {}).get("backbone") if isinstance(cfg.get("model"), dict) else None
    for attr in ("bottom_up", "net"):
        node = backbone.get(attr) if isinstance(backbone, dict) else None
        if isinstance(node, dict) and isinstance(node.get("net"), str) and isinstance(node.get("recipe"), str):
            kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in node.items() if k not in RUN_ONLY_KEYS}
            return node["net"], node["recipe"], kwargs, path
    return None


def native_size_from_config(checkpoint) -> tuple[int, str] | None:
    """The training image size of a checkpoint: the one winpos-convert recorded in it (``winpos_image_size``), else
    the one in the ``config.yaml`` that winpos's trainer writes next to its checkpoints
    (``dataloader.train.mapper.image_size``, else the backbone's ``img_size``), with where it was read; None when
    neither says one."""
    recorded = recorded_image_size(checkpoint)
    if recorded is not None:
        return recorded
    found = run_config_beside(checkpoint)
    if found is None:
        return None
    cfg, path = found

    def get(*keys):
        node = cfg
        for k in keys:
            node = node.get(k) if isinstance(node, dict) else None
        return node if isinstance(node, int) and not isinstance(node, bool) and node > 0 else None

    for keys in (("dataloader", "train", "mapper", "image_size"), ("model", "backbone", "bottom_up", "img_size"),
                 ("model", "backbone", "net", "img_size")):
        if get(*keys):
            return get(*keys), f"{'.'.join(keys)} in {path}"
    return None


def recorded_image_size(checkpoint) -> tuple[int, str] | None:
    """The training image size winpos-convert recorded in its output (safetensors metadata, or a top-level entry of
    a .pth), with where it was read; None when the file records none."""
    path = str(checkpoint)
    if not path.lower().endswith(".safetensors"):
        return None  # a .pth records it beside the weights: effective_embeddings reads it from the object
    value = safetensors_metadata(path).get("winpos_image_size")
    return _positive_size(value, f"winpos_image_size in {path}")


def _positive_size(value, where: str) -> tuple[int, str] | None:
    try:
        size = int(str(value))
    except (TypeError, ValueError):
        return None
    return (size, where) if size > 0 else None


def _build(pos, kernel: int | None, prefix: str, fmt: Format, window: int | None, resolution,
           native_hint: tuple[int, str] | None = None) -> EmbeddingInfo:
    spec = fmt.spec
    notes: list[str] = []
    gparts = None
    if pos.kind == "abswin":
        name = prefix + pos.global_key
        gparts = (pos.global_embed[0].float(), pos.window_embed[0].float())
    else:
        name = prefix + pos.grid_key
        grid = pos.grid[0].float()
        if pos.cls is not None:
            notes.append("cls row dropped (as detectron2's get_abs_pos does)")
    stride = kernel if kernel is not None and kernel >= 14 else spec.stride  # ViT stems: stride = kernel
    default_w = 14 if fmt == Format.WINPOS and stride >= 14 else spec.window  # winpos ViT vs HieraDet
    w = window or (int(gparts[1].shape[-1]) if gparts is not None else default_w)

    if gparts is not None:
        g, win = gparts
        if resolution is not None:
            native, native_from = resolution, "given (--native-size / resolution=)"
        elif native_hint is not None:
            native, native_from = native_hint
        elif fmt in _NATIVE_PX:
            native, native_from = _NATIVE_PX[fmt], _NATIVE_WHY[fmt]
        else:  # timm abswin: the global grid at 1/16 of the image
            native = g.shape[-1] * 4 * stride
            native_from = ("assumed: the global grid x 16 (timm's abs-win layout); pass --native-size "
                           "(resolution=) to change it")
        px = as_hw(native, "resolution")
        rnd = math.ceil if spec.ceil_grid else math.floor
        hw = (rnd(px[0] / stride), rnd(px[1] / stride))
        grid = abswin_embed(g, win, hw, antialias=spec.antialias)
        source = "checkpoint"
    else:
        px = (grid.shape[1] * stride, grid.shape[2] * stride)
        native_from = f"the stored {grid.shape[1]}x{grid.shape[2]} grid x patch size {stride} px"
        if resolution is not None and as_hw(resolution, "resolution") != px:
            raise WinposError(
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
        name=name, format=fmt, grid=grid.float().contiguous(), window=int(w), stride=int(stride),
        image_hw=tuple(int(v) for v in px), antialias=spec.antialias,
        global_embed=None if gparts is None else gparts[0].float(),
        window_embed=None if gparts is None else gparts[1].float(), abswin_source=source, notes=notes,
        native_from=native_from,
    )


def effective_embeddings(obj_or_path: Any, format: str = "auto", resolution=None,
                         window: int | None = None) -> list[EmbeddingInfo]:
    """Extract every position embedding of a checkpoint as the grid the model adds to its tokens.

    Args:
        obj_or_path: a checkpoint path (read safely with ``winpos.checkpoints.io``) or an already loaded object
            (container or flat state dict of tensors).
        format: ``"auto"`` (``detect`` tells it) or one of ``FORMATS``; forces the interpretation of the keys.
        resolution: the native image size in px (int or pair) at which abs-win families build their grid. None:
            the training size in the run's ``config.yaml`` beside a checkpoint file, else the format's (SAM2:
            1024). Stored-grid families only accept their own size here (their grid and patch size give it).
        window: window size override in tokens (e.g. 56 for SAM2's 224-px super-window).
    Returns:
        A list with the ``EmbeddingInfo`` of the backbone's token embedding (empty never: no embedding raises).
    Raises:
        ValueError: no position embedding found (lists a sample of the keys), or shapes that do not fit the format.
    """
    fmt = parse_format(format)
    if fmt == Format.LOOKHERE:
        raise WinposError("a LookHere checkpoint has no absolute position embedding (LookHere biases attention "
                          "instead); there is nothing to plot")
    source = "<object>"
    if isinstance(obj_or_path, (str, os.PathLike)):
        source = str(obj_or_path)
        obj = load_checkpoint_object(obj_or_path)
    else:
        obj = obj_or_path
    sd = unwrap_state_dict(obj, source=f"checkpoint '{source}'")
    if fmt == "auto":
        try:
            fmt = detect(obj)
        except ValueError as e:
            raise WinposError(f"no absolute position embedding found in checkpoint '{source}': {e}") from None
    try:
        pos, kernel, prefix, depth = _adapted_position(sd, fmt)
    except ValueError as e:  # the forced format's adapter found the keys in another form
        if format == "auto":
            raise
        raise WinposError(f"no absolute position embedding of format '{fmt}' found in checkpoint '{source}': "
                          f"{e}") from None
    infos = []
    if pos is not None:
        hint = _positive_size(obj.get("winpos_image_size"), f"winpos_image_size in {source}") \
            if isinstance(obj, dict) and "winpos_image_size" in obj else None
        if hint is None and source != "<object>":
            hint = native_size_from_config(source)
        info = _build(pos, kernel, prefix, fmt, window, resolution, hint)
        info.source = source
        info.presets = matching_presets(fmt, int(info.grid.shape[0]), depth)
        infos.append(info)
    if not infos:
        pos = [f"{k} {tuple(sd[k].shape)}" for k in sd if "pos" in k.lower()][:10]
        sample = pos or list(sd)[:15]
        what = "position-like keys" if pos else "keys"
        fams = "" if format == "auto" else f" of format '{fmt}'"
        raise WinposError(
            f"no absolute position embedding{fams} found in checkpoint '{source}' ({len(sd)} tensors; {what}: "
            f"{sample}); it may use only relative/rotary positions, or be a format winpos does not know: pass "
            f"format= one of {', '.join(FORMATS)} or extract the (C, H, W) grid yourself"
        )
    return infos
