"""Optimizer parameter groups for winpos detectors: detectron2's ``get_default_optimizer_params`` with ViTDet's
``get_vit_lr_decay_rate``, for winpos's ViTDet and HieraDet.

Layer ids inside a winpos backbone (found by type anywhere in the model, so the rule does not depend on how the
detector names its modules):

- ``patch_embed.*``, token embeddings (``*pos_embed*``) and the norm before the first block (``ln_pre.*``, SAM3's
  encoder): 0;
- ``blocks.{i}.*``: ``i + 1`` (this is detectron2's ``get_vit_lr_decay_rate`` for ViTDet, and the per-block id
  for HieraDet, whose blocks run through all four stages);
- anything else in the backbone, and every module outside it (adapter norms, FPN, heads): ``num_layers + 1``.

The lr multiplier of layer id ``l`` is ``lr_decay_rate ** (num_layers + 1 - l)``. Relpos tables and RoPE
parameters live inside blocks and by default take their block's id, as in detectron2 (they start from zero when
fine-tuning from MAE / Hiera weights, so pinning them to layer 0 would all but freeze them at decay 0.7:
0.7**13 ~ 1% of the base lr); ``position_layer="zero"`` puts every position parameter at layer 0 instead.

Weight decay, as detectron2 decides it: ``weight_decay`` for every parameter, ``weight_decay_norm`` (unless None)
for the parameters of torch's normalization layers (detectron2's ``norm_module_types``; detectron2's own
``layers.LayerNorm`` of FPN / SFP / heads with ``norm="LN"`` is not one of them and takes ``weight_decay``), then
``overrides``. ``norm_layers="all"`` also counts detectron2's ``LayerNorm`` (and any module class named ``*Norm``)
as a norm: not detectron2's rule, kept for recipes that chose it.
"""
from __future__ import annotations

import re
from collections.abc import Mapping

import torch.nn as nn

from winpos.backbones import HieraDet, ViTDet
from winpos.backbones.common import POSITION_KEYS, is_position_param
from winpos.errors import WinposError

__all__ = ["POSITION_KEYS", "find_winpos_nets", "layer_ids", "get_optimizer_params", "is_position_param"]

_BLOCK = re.compile(r"^blocks\.(\d+)\.")
# detectron2's norm_module_types (solver/build.py): BatchNorm1-3d, SyncBatchNorm, InstanceNorm1-3d (_NormBase),
# GroupNorm, LayerNorm, LocalResponseNorm.
_TORCH_NORMS = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm, nn.LocalResponseNorm)
NORM_LAYERS = ("torch", "all")


def find_winpos_nets(model: nn.Module) -> dict[str, nn.Module]:
    """``{module prefix: net}`` for every winpos ``ViTDet`` / ``HieraDet`` inside ``model`` (prefix "" = model)."""
    return {name: m for name, m in model.named_modules() if isinstance(m, (ViTDet, HieraDet))}


def _is_norm(module: nn.Module, norm_layers: str) -> bool:
    if isinstance(module, _TORCH_NORMS):
        return True
    # detectron2.layers.LayerNorm (the "LN" of FPN / SFP / conv heads) is not a torch norm subclass.
    return norm_layers == "all" and type(module).__name__.endswith("Norm")


def layer_ids(model: nn.Module, position_layer: str = "block") -> dict[str, tuple]:
    """``{parameter name: (layer_id, num_layers)}`` by the rule in the module docstring.

    Parameters outside any winpos backbone get ``(num_layers + 1, num_layers)`` of the (single) backbone, or
    ``(1, 0)`` when the model has none. Raises WinposError for an unknown ``position_layer`` or when the model
    holds backbones of different depths (one decay schedule cannot serve both).
    """
    if position_layer not in ("block", "zero"):
        raise WinposError(f"position_layer={position_layer!r}; choose 'block' (relpos/RoPE decay with their block, "
                          "as detectron2) or 'zero' (every position parameter at layer 0)")
    nets = find_winpos_nets(model)
    depths = {int(n.num_layers) for n in nets.values()}
    if len(depths) > 1:
        raise WinposError(f"the model holds winpos backbones of different depths {sorted(depths)}; layer-wise lr "
                          "decay needs one depth: use lr_decay_rate=1.0 or build the optimizer groups yourself")
    num_layers = depths.pop() if depths else 0
    ids = {}
    for prefix, net in nets.items():
        for name, _ in net.named_parameters():
            full = f"{prefix}.{name}" if prefix else name
            block = _BLOCK.match(name)
            if name.startswith(("patch_embed.", "ln_pre.")) or "pos_embed" in name:
                lid = 0
            elif is_position_param(name) and position_layer == "zero":
                lid = 0
            elif block:
                lid = int(block.group(1)) + 1
            else:
                lid = num_layers + 1
            ids[full] = (lid, num_layers)
    for name, _ in model.named_parameters():
        ids.setdefault(name, (num_layers + 1, num_layers))
    return ids


def get_optimizer_params(model: nn.Module, base_lr: float | None = None, weight_decay: float | None = None,
                         weight_decay_norm: float | None = 0.0, lr_decay_rate: float = 1.0,
                         overrides: dict | None = None, position_layer: str = "block",
                         norm_layers: str = "torch") -> list[dict]:
    """Parameter groups for a torch optimizer (usable from LazyConfig as ``L(get_optimizer_params)(...)`` with
    ``params.model`` set to the model before instantiation, like detectron2's ``get_default_optimizer_params``).

    Args:
        model: the detector (or any module holding a winpos backbone).
        base_lr: base learning rate; required when ``lr_decay_rate != 1``. None leaves ``lr`` to the optimizer.
        weight_decay: default weight decay; None leaves it to the optimizer.
        weight_decay_norm: weight decay of normalization layers (None: like any other parameter).
        lr_decay_rate: layer-wise decay (ViTDet-B 0.7, L 0.8, H 0.9); 1.0 disables it.
        overrides: ``{substring: {"lr": ..., "weight_decay": ...}}`` applied last to parameters whose full name
            contains the substring (``lr`` here is an absolute value). detectron2's ViTDet-B/L recipe is
            ``{"pos_embed": {"weight_decay": 0.0}}``.
        position_layer: ``"block"`` or ``"zero"`` (see module docstring).
        norm_layers: ``"torch"`` (detectron2's rule) or ``"all"`` (see module docstring).
    Returns:
        A list of ``{"params": [...], "lr": ..., "weight_decay": ..., "layer_id": int}`` groups, one per
        (layer id, weight decay, override) combination. ``lr``/``weight_decay`` keys are present only when known.
    """
    if lr_decay_rate != 1.0 and base_lr is None:
        raise WinposError("lr_decay_rate needs base_lr (set params.base_lr='${..lr}' in the optimizer config)")
    if not 0.0 < lr_decay_rate <= 1.0:
        raise WinposError(f"lr_decay_rate={lr_decay_rate} must be in (0, 1]")
    if norm_layers not in NORM_LAYERS:
        raise WinposError(f"norm_layers={norm_layers!r}; choose 'torch' (detectron2's rule: torch's norm layers) "
                          "or 'all' (also detectron2's LayerNorm of FPN / SFP / heads)")
    overrides = {k: dict(v) if isinstance(v, Mapping) else v for k, v in (overrides or {}).items()}
    bad = {k: v for k, v in overrides.items() if not isinstance(v, dict) or set(v) - {"lr", "weight_decay"}}
    if bad:
        raise WinposError(f"overrides {bad}: each value must be a dict with keys 'lr' and/or 'weight_decay', e.g. "
                          "{'pos_embed': {'weight_decay': 0.0}}")
    ids = layer_ids(model, position_layer)
    norm_params = {id(p) for m in model.modules() if _is_norm(m, norm_layers) for p in m.parameters(recurse=False)}
    groups: dict[tuple, dict] = {}
    seen = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        lid, num_layers = ids[name]
        hyper = {}
        if base_lr is not None:
            hyper["lr"] = base_lr * lr_decay_rate ** (num_layers + 1 - lid)
        if weight_decay is not None:
            hyper["weight_decay"] = weight_decay
        if id(p) in norm_params and weight_decay_norm is not None:
            hyper["weight_decay"] = weight_decay_norm
        matched = tuple(k for k in overrides if k in name)
        for k in matched:
            hyper.update(overrides[k])
        key = (lid, hyper.get("lr"), hyper.get("weight_decay"), matched)
        groups.setdefault(key, {"params": [], **hyper, "layer_id": lid})["params"].append(p)
    return list(groups.values())
