"""Import the authors' LookHere checkpoints (``LH_180/90/45_weights_and_config.pth``) into winpos ViTDet.

The released files hold ``{"weights": state_dict, "config": lh_config}``: a DeiT-III-style ViT-B/16 (12 heads,
depth 12, LayerScale on both residual branches, LayerNorm eps 1e-5, a cls token, no position embedding) trained
with LookHere at 224 px, and the LookHere settings it was trained with, e.g. ``{"global_slope": 2,
"layer_slopes": [1.5, 0.5], "head_directions": "corners-triangles-none"}`` (the authors' units; see
``winpos.posemb.lookhere``). The file is read as data (``torch.load(weights_only=True)``).

The target is ViTDet with the ``lookhere`` recipe built from that config (``vitdet_overrides``): no token embedding,
LookHere with the file's settings in window and global blocks, LayerScale, LayerNorm eps 1e-5. Its 14x14 windows
are the 224 px grid the model was trained on, so window blocks see the training geometry and only the global blocks
extrapolate at larger sizes. Weights keep their names (``patch_embed.proj``, ``blocks.{i}.{norm1, attn.qkv,
attn.proj, ls1.gamma, norm2, mlp.fc1, mlp.fc2, ls2.gamma}``). Not loaded, and reported: the cls token (ViTDet has
none; in the authors' model every patch also attends to it, unbiased, so features differ from theirs), the final
``norm`` and the classifier ``head`` (the detector's own heads replace them), and the config itself (it decides how
the target is built, and is listed with the settings used).
"""
from __future__ import annotations

import math
import re

import torch
import torch.nn as nn

from winpos.checkpoints.formats import Format, is_lookhere_container
from winpos.errors import WinposError

__all__ = ["is_lookhere_checkpoint", "read_lookhere_config", "vitdet_overrides", "convert_lookhere_checkpoint",
           "load_lookhere_checkpoint"]

_LH_KEYS = ("global_slope", "layer_slopes", "head_directions", "distance", "fill_with")
_BLOCK = re.compile(r"^blocks\.(\d+)\.(norm1|attn\.qkv|attn\.proj|ls1|norm2|mlp\.fc1|mlp\.fc2|ls2)\."
                    r"(weight|bias|gamma)$")
_RELEASED_HEADS = 12  # the released models are ViT-B/16; the file does not store the head count
LAYER_SCALE_INIT = 1e-4  # DeiT-III's init; every value is replaced by the checkpoint's gamma
NORM_EPS = 1e-5  # torch's LayerNorm default, which the authors' ViT uses


def is_lookhere_checkpoint(obj) -> bool:
    """Whether a loaded checkpoint has the authors' layout (``detect`` names it ``lookhere``)."""
    return is_lookhere_container(obj)


def _number(name: str, value) -> float:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise WinposError(f"the LookHere checkpoint's config has {name}={value!r}, not a finite number; the file is "
                          "not one of the authors' releases or was edited: fix its config")
    if not math.isfinite(torch.tensor(float(value), dtype=torch.float32).item()):
        raise WinposError(f"the LookHere checkpoint's config has {name}={value!r}, which overflows float32 (max "
                          f"{torch.finfo(torch.float32).max:.3g}), the dtype LookHere's slopes and bias are computed "
                          "in; the file was edited: fix its config (the authors use global_slope=2)")
    return float(value)


def read_lookhere_config(obj) -> dict:
    """The LookHere settings of an authors' checkpoint, as ``LookHere`` keyword arguments in their units.

    Returns ``{"global_slope": float, "layer_slopes": (first, last), "head_directions": str or list}``.
    """
    if not is_lookhere_checkpoint(obj):
        keys = sorted(obj)[:8] if isinstance(obj, dict) else type(obj).__name__
        raise WinposError(f"the checkpoint is not in the authors' LookHere layout (a dict with 'weights' and a "
                          f"'config' holding 'head_directions'; found {keys}); pass the LH_*_weights_and_config.pth "
                          "file or another format")
    config = obj["config"]
    missing = [k for k in ("global_slope", "layer_slopes") if k not in config]
    if missing:
        raise WinposError(f"the LookHere checkpoint's config lacks {missing}, which the authors' code requires; the "
                          "file is incomplete: add them as its authors trained it")
    layer = config["layer_slopes"]
    if isinstance(layer, torch.Tensor):
        layer = layer.tolist()
    if not isinstance(layer, (list, tuple)) or len(layer) != 2:
        raise WinposError(f"the LookHere checkpoint's config has layer_slopes={layer!r}, not two numbers; fix its "
                          "config")
    directions = config["head_directions"]
    if not (isinstance(directions, str) or (isinstance(directions, (list, tuple))
                                            and all(isinstance(d, str) for d in directions))):
        raise WinposError(f"the LookHere checkpoint's config has head_directions={directions!r}, not a shorthand "
                          "string or a list of them; fix its config")
    out = {"global_slope": _number("global_slope", config["global_slope"]),
           "layer_slopes": tuple(_number("layer_slopes", v) for v in layer),
           "head_directions": directions if isinstance(directions, str) else list(directions)}
    for key in ("distance", "fill_with"):
        if key in config:
            out[key] = config[key]
    return out


def vitdet_overrides(config: dict) -> dict:
    """``create(preset, "lookhere", **vitdet_overrides(config))`` builds the ViTDet these weights load into."""
    lookhere = {"kind": "lookhere", "lookhere": dict(config)}
    return {"pos_embed": "none", "window_pos": lookhere, "global_pos": dict(lookhere, lookhere=dict(config)),
            "layer_scale_init": LAYER_SCALE_INIT, "norm_eps": NORM_EPS}


def _check_target(model: nn.Module, config: dict, depth: int) -> None:
    """Refuse a target that would run these weights differently from how they were trained."""
    from winpos.backbones.common import LayerScale
    from winpos.backbones.vitdet import ViTDet
    from winpos.posemb.lookhere import LookHere

    if not isinstance(model, ViTDet):
        raise WinposError(f"the authors' LookHere checkpoint is a plain ViT; it loads into ViTDet, not "
                          f"{type(model).__name__}: pass target='vitdet_b'")
    problems = []
    if model.depth != depth:
        problems.append(f"depth {model.depth} instead of the checkpoint's {depth}")
    if model.num_heads != _RELEASED_HEADS:
        problems.append(f"{model.num_heads} heads instead of the released ViT-B's {_RELEASED_HEADS}")
    if model.pos_embed_kind != "none":
        problems.append(f"pos_embed={model.pos_embed_kind!r}")
    if not isinstance(model.blocks[0].ls1, LayerScale):
        problems.append("no LayerScale")
    eps = model.blocks[0].norm1.eps
    if eps != NORM_EPS:
        problems.append(f"LayerNorm eps {eps:g} instead of {NORM_EPS:g}")
    if not problems:
        for i, block in enumerate(model.blocks):
            lh = block.attn.lookhere
            want = LookHere(model.num_heads, layer_index=i, num_layers=model.depth, **config)
            if lh is None or not (torch.equal(lh.fov.cpu(), want.fov) and torch.equal(lh.slopes.cpu(), want.slopes)):
                problems.append(f"block {i} without LookHere {config}")
                break
    if problems:
        raise WinposError(f"the target ViTDet does not match the LookHere checkpoint ({'; '.join(problems)}); build "
                          "it with create('vitdet_b', 'lookhere', **vitdet_overrides(read_lookhere_config(obj))) or "
                          "pass the preset name as the target")


def convert_lookhere_checkpoint(obj, target="vitdet_b", recipe: str = "lookhere", strict: bool = False,
                                **overrides):
    """Map an authors' LookHere checkpoint onto a winpos ViTDet.

    Args:
        obj: the loaded file (``{"weights": ..., "config": ...}``).
        target: a preset name (built with ``recipe="lookhere"`` and ``vitdet_overrides`` of the file's config, then
            ``overrides``, e.g. ``img_size``) or a ViTDet built that way (checked).
        recipe: must be ``"lookhere"``, so that a converted file records the recipe its model needs.
        strict: refuse a checkpoint that lacks trunk weights of the target.
    Returns ``(state_dict, LoadReport)``; load with ``model.load_state_dict(sd, strict=False)``.
    """
    from winpos.checkpoints.io import check_finite_state_dict

    config = read_lookhere_config(obj)
    if recipe != "lookhere":
        raise WinposError(f"recipe={recipe!r} does not fit the authors' LookHere checkpoint (no position embedding, "
                          "LookHere in every block); pass recipe='lookhere' (--recipe lookhere)")
    weights = {k: v for k, v in obj["weights"].items() if isinstance(v, torch.Tensor)}
    if not weights:
        kinds = sorted({type(v).__name__ for v in obj["weights"].values()})
        raise WinposError(f"the LookHere checkpoint's 'weights' holds no tensors ({len(obj['weights'])} entries"
                          + (f" of type {', '.join(kinds)}" if kinds else "") + "); the file is not one of the "
                          "authors' releases or was saved without its weights: pass an LH_*_weights_and_config.pth")
    depth = 1 + max((int(m.group(1)) for k in weights if (m := _BLOCK.match(k))), default=-1)
    if isinstance(target, str):
        from winpos.backbones import create
        from winpos.backbones.vitdet import SIZES

        if target not in SIZES:
            raise WinposError(f"the authors' LookHere checkpoint is a plain ViT-B; it loads into a ViTDet preset "
                              f"({', '.join(SIZES)}), not {target!r}: pass target='vitdet_b'")
        wanted = vitdet_overrides(config)
        clash = sorted(k for k in overrides if k in wanted)
        if clash:
            raise WinposError(f"overrides {clash} contradict the LookHere checkpoint, which fixes them from its "
                              "config; drop them")
        model = create(target, recipe=recipe, **wanted, **overrides)
    else:
        model = target
    _check_target(model, config, depth)
    from winpos.checkpoints.adapters import adapt
    from winpos.checkpoints.convert import convert

    sd, report = convert(adapt(obj, Format.LOOKHERE), model, "winpos ViTDet")
    settings = ", ".join(f"{k}={v!r}" for k, v in config.items())
    report.add_unexpected("config", f"LookHere settings, not weights: the target was built with {settings} "
                                    "(the authors' units); rebuild it with vitdet_overrides(config) to load these "
                                    "weights")
    ignored = sorted(k for k in obj["config"] if k not in _LH_KEYS)
    if ignored:
        report.add_unexpected("config", f"keys {ignored} are not LookHere settings (the authors' bias reads only "
                                        f"{', '.join(_LH_KEYS)})")
    if isinstance(target, str):  # what the file's config chose (winpos-convert records it and prints it)
        report.built_with = dict(wanted)
    if not sd:
        raise WinposError(f"none of the checkpoint's {len(weights)} tensors fits the target ViTDet (e.g. "
                          f"{sorted(weights)[:3]}); pass the authors' LH_*_weights_and_config.pth file")
    check_finite_state_dict(sd, "the converted checkpoint")
    if strict and report.missing:
        raise WinposError(f"the checkpoint lacks {len(report.missing)} trunk weights of the target, e.g. "
                          f"{[k for k, _ in report.missing][:5]}; it was made for another architecture or size")
    return sd, report


def load_lookhere_checkpoint(path_or_obj, preset: str = "vitdet_b", **overrides):
    """Build the matching ViTDet and load an authors' LookHere checkpoint into it (strictly).

    ``path_or_obj``: the ``.pth`` file (read with ``torch.load(weights_only=True)``) or its loaded dict.
    Returns ``(model, LoadReport)``; the model is in training mode like any new module.
    """
    from winpos.backbones import create
    from winpos.checkpoints.io import load_checkpoint_object

    obj = path_or_obj if isinstance(path_or_obj, dict) else load_checkpoint_object(path_or_obj)
    config = read_lookhere_config(obj)
    model = create(preset, recipe="lookhere", **vitdet_overrides(config), **overrides)
    sd, report = convert_lookhere_checkpoint(obj, model, strict=True)
    result = model.load_state_dict(sd, strict=False)
    if result.unexpected_keys or result.missing_keys:  # convert_lookhere_checkpoint(strict=True) checked both
        raise RuntimeError(f"LookHere converter and model disagree: unexpected {result.unexpected_keys[:8]}, "
                           f"missing {result.missing_keys[:8]}")
    return model, report
