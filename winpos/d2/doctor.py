"""The doctor (``winpos.diagnostics.doctor``) for LazyConfig files as well as presets: the config is loaded with
winpos's strict override loader (``winpos.d2.config.load_config``: an override that names no key, or gives a value
of the wrong type, is an error), its winpos backbone node is built on the meta device and checked.
"""
from __future__ import annotations

import os

import torch

from winpos.diagnostics.doctor import (CONFIG_SUFFIXES, DoctorReport, build_checked, check_image_size,
                                      diagnose_backbone, diagnose_each, diagnose_preset, fix_text, keeps_block_terms)
from winpos.errors import MissingInputError, WinposError, as_hw


def diagnose(target: str, image_size: int | None = None, recipe: str | None = None, overrides=(),
             trained_size: int | None = None, checkpoint=None) -> DoctorReport:
    """``target``: a LazyConfig ``.py`` file, a run's ``config.yaml`` (read as data) or a preset name; ``overrides``:
    ``key=value`` strings (config keys for a config, constructor arguments for a preset). ``image_size`` None means
    the model's own size; ``recipe`` None means the config's own recipe, or ``"original"`` for a preset.
    ``trained_size``: the image size (px) the RoPE was trained at (default: the model's pretraining size);
    ``checkpoint``: a winpos checkpoint of the model whose learned RoPE frequencies and relpos tables are read."""
    check_image_size(image_size)
    if not target.endswith(CONFIG_SUFFIXES):
        return diagnose_preset(target, image_size, recipe or "original", overrides, trained_size, checkpoint)
    given = target  # the fix names the config as the user wrote it
    if not os.path.isfile(target) and target.endswith(".py"):
        from winpos.utils.config_names import config_path

        try:
            target = config_path(target)  # a config shipped with winpos, by name
        except MissingInputError as e:
            raise MissingInputError(f"{e}; or pass a preset name such as vitdet_b") from None
    net, default_size, name, preset, key, recipe = _build_from_config(target, overrides, recipe)
    fix = fix_text(preset, given, key, recipe=recipe, keep_terms=keeps_block_terms(net))
    return diagnose_backbone(net, image_size or default_size, name, fix=fix, trained_size=trained_size,
                             checkpoint=checkpoint)


def diagnose_many(targets, image_size: int | None = None, recipe: str | None = None, overrides=(),
                  trained_size: int | None = None, checkpoint=None):
    """``diagnose`` each target in one process; yields ``(target, DoctorReport or None, error message or None)``:
    a target that cannot be checked gets its one-line error and the others are still checked."""
    return diagnose_each(diagnose, targets, image_size, recipe, overrides, trained_size, checkpoint)


def _build_from_config(path: str, overrides=(), recipe: str | None = None):
    """Return (winpos backbone on the meta device, default image size, name, preset, the recipe's override key,
    the recipe) from a LazyConfig file, with the backbone's recipe replaced by ``recipe`` unless it is None."""
    from winpos.backbones import create
    from winpos.d2.config import load_config

    cfg = load_config(path, list(overrides))
    node = cfg.get("model", {}).get("backbone") if hasattr(cfg.get("model", None), "get") else None
    for attr in ("net", "bottom_up"):
        if node is not None and attr in node and hasattr(node[attr], "get") and node[attr].get("recipe") is not None:
            node, key = node[attr], f"model.backbone.{attr}.recipe"
            break
    else:
        raise WinposError(f"{path}: no winpos backbone node (model.backbone.net or model.backbone.bottom_up with "
                          "net= and recipe=) was found; the doctor checks winpos model configs such as "
                          "configs/COCO/mask_rcnn_vitdet_b_100ep.py")
    if recipe is not None:
        node["recipe"] = recipe
    kwargs = {k: v for k, v in node.items() if k not in ("_target_", "net", "recipe", "out_feature", "out_features",
                                                         "norm")}
    with torch.device("meta"):
        net = build_checked(create, node["net"], node["recipe"], kwargs, f"{path}")
    return (net, max(as_hw(kwargs.get("img_size", 1024), "img_size")), f"{path} ({node['net']}, recipe "
            f"{node['recipe']})", node["net"], key, node["recipe"])
