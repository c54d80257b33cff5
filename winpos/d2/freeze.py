"""``train.freeze``: train only part of a detector, the usual move when the training set is small.

``train.freeze`` is a list of parameter-name prefixes of the detector (dotted module paths, as in its
``state_dict``): ``["backbone.bottom_up"]`` freezes the winpos trunk (HieraDet / ViTDet) and trains the pyramid and
heads; ``["backbone", "proposal_generator"]`` trains the RoI heads only. A prefix matches a parameter whose name is
the prefix or starts with the prefix and a dot, so ``"backbone.bottom"`` matches nothing (it is refused, not read
as a partial name). Frozen parameters get ``requires_grad=False`` before the optimizer is built, so they take no
optimizer state, no weight decay and no gradient; they are still saved in every checkpoint. Stochastic depth and
dropout inside a frozen module are turned off, so a frozen part computes the same features at every step as at
evaluation.

``FREEZE_PRESETS`` names the common choices, so ``train.freeze="trunk"`` is ``["backbone.bottom_up"]``.
``docs/recipes.md`` ("Small data") says what each one measured on the shapes data.
"""
from __future__ import annotations

import logging

import torch

from winpos.errors import WinposError

__all__ = ["FREEZE_PRESETS", "freeze_prefixes", "freeze_parameters"]

logger = logging.getLogger(__name__)

FREEZE_PRESETS = {
    "none": (),
    "trunk": ("backbone.bottom_up",),  # the winpos backbone; pyramid, RPN and RoI heads train
    "backbone": ("backbone",),  # trunk and pyramid; RPN and RoI heads train
    "heads": ("backbone", "proposal_generator"),  # only the RoI heads train
}


def freeze_prefixes(value) -> tuple[str, ...]:
    """``train.freeze`` as a tuple of prefixes: None / empty, a preset name, one prefix, or a list of prefixes."""
    if value is None:
        return ()
    if isinstance(value, str):
        if value in FREEZE_PRESETS:
            return FREEZE_PRESETS[value]
        value = [value]
    try:
        prefixes = tuple(value)
    except TypeError:
        raise WinposError(f"train.freeze={value!r} is neither a preset ({', '.join(FREEZE_PRESETS)}) nor a list of "
                          "parameter-name prefixes, e.g. train.freeze='[backbone.bottom_up]'") from None
    bad = [p for p in prefixes if not isinstance(p, str) or not p.strip(". ")]
    if bad:
        raise WinposError(f"train.freeze holds {bad!r}, which are not parameter-name prefixes; give dotted module "
                          "paths such as 'backbone.bottom_up' or a preset: " + ", ".join(FREEZE_PRESETS))
    return tuple(dict.fromkeys(p.strip(". ") for p in prefixes))


def _matches(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def freeze_parameters(model: torch.nn.Module, freeze) -> dict:
    """Set ``requires_grad=False`` on the parameters of ``model`` under each prefix of ``freeze`` (see
    ``freeze_prefixes``); returns ``{"prefixes", "frozen", "trainable"}`` (parameter counts, elements).

    Raises WinposError, naming the model's top-level modules, for a prefix that matches no parameter (a typo would
    otherwise train everything), and when nothing would be left to train."""
    prefixes = freeze_prefixes(freeze)
    model = getattr(model, "module", model)  # DDP
    named = list(model.named_parameters())
    if not prefixes:
        return {"prefixes": [], "frozen": 0, "trainable": sum(p.numel() for _, p in named if p.requires_grad)}
    unmatched = [pre for pre in prefixes if not any(_matches(n, pre) for n, _ in named)]
    if unmatched:
        tops = sorted({n.split(".")[0] for n, _ in named})
        subs = sorted({".".join(n.split(".")[:2]) for n, _ in named if n.split(".")[0] in
                       {u.split(".")[0] for u in unmatched}})
        hint = f"; under it: {', '.join(subs)}" if subs else ""
        raise WinposError(f"train.freeze prefix(es) {unmatched} match no parameter of the model; its top-level "
                          f"modules are {', '.join(tops)}{hint}")
    to_freeze = [p for name, p in named if any(_matches(name, pre) for pre in prefixes)]
    frozen_ids = {id(p) for p in to_freeze}
    trainable = sum(p.numel() for _, p in named if p.requires_grad and id(p) not in frozen_ids)
    if trainable == 0:  # checked before anything changes: a refused call leaves the model as it was
        raise WinposError(f"train.freeze={list(prefixes)} freezes every parameter of the model: nothing would "
                          "train; leave at least the RoI heads out of it")
    for p in to_freeze:
        p.requires_grad_(False)
    frozen = sum(p.numel() for _, p in named if not p.requires_grad)
    quiet = _deterministic(model, prefixes)
    logger.info(f"train.freeze {list(prefixes)}: {frozen / 1e6:.2f} M parameters frozen, {trainable / 1e6:.2f} M "
                "train" + (f"; drop path / dropout off in {quiet} frozen module(s)" if quiet else ""))
    return {"prefixes": list(prefixes), "frozen": frozen, "trainable": trainable, "stochastic_off": quiet}


def _deterministic(model: torch.nn.Module, prefixes) -> int:
    """Turn off stochastic depth and dropout inside the frozen modules; returns how many were on. A frozen trunk
    with drop path would hand the trained heads randomly thinned features that evaluation never produces, and it
    learns nothing from the noise."""
    from winpos.backbones.common import DropPath

    count = 0
    for name, module in model.named_modules():
        if not any(_matches(name, pre) for pre in prefixes):
            continue
        if isinstance(module, DropPath) and module.p > 0:
            module.p, count = 0.0, count + 1
        elif isinstance(module, torch.nn.Dropout) and module.p > 0:
            module.p, count = 0.0, count + 1
        elif type(module).__name__ == "DropPath" and getattr(module, "drop_prob", 0) > 0:  # timm / detectron2's
            module.drop_prob, count = 0.0, count + 1
    return count
