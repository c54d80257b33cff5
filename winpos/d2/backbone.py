"""detectron2 ``Backbone`` adapters around the plain winpos backbones.

``HieraDetBackbone`` is a hierarchical bottom-up for detectron2's ``FPN`` (as MViTv2 is in detectron2's
``projects/MViTv2``): four outputs ``scale2..scale5`` at strides 4/8/16/32, each through its own LayerNorm
(``scale{k}_norm``, like detectron2's ``MViT``). ``ViTDetBackbone`` is the single-scale input of
``SimpleFeaturePyramid``: one output ``last_feat`` at stride 16.

Both wrap a winpos model in ``self.net``, either passed in or built by ``winpos.backbones.create(name, recipe,
**overrides)``. Inputs whose sides are not multiples of ``size_divisibility`` are zero-padded at the bottom/right
inside ``forward`` (after pixel normalization, so zero is the mean pixel, the value ``ImageList`` pads with);
output maps then cover the padded image, ``ceil(H / size_divisibility) * size_divisibility / stride`` per side,
so a stride-2 pyramid above them always lines up.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from detectron2.modeling import Backbone

from winpos.backbones import create
from winpos.errors import WinposError

__all__ = ["HieraDetBackbone", "ViTDetBackbone", "build_net", "pad_to_multiple"]

HIERA_FEATURES = ("scale2", "scale3", "scale4", "scale5")


def build_net(net, recipe: str, overrides: dict, kind: str) -> nn.Module:
    """Return ``net`` itself (an ``nn.Module``) or build the preset it names with ``recipe`` and ``overrides``."""
    if isinstance(net, nn.Module):
        if overrides:
            raise WinposError(f"{kind} got a built `net` and also constructor overrides {sorted(overrides)}; pass "
                              "the overrides to the model you build, or pass the preset name as `net` instead")
        return net
    if not isinstance(net, str):
        raise WinposError(f"{kind}.net must be a preset name (see winpos.backbones.list_presets()) or an nn.Module, "
                          f"got {type(net).__name__}")
    return create(net, recipe, **overrides)


def pad_to_multiple(x: torch.Tensor, divisor: int) -> torch.Tensor:
    """Zero-pad ``x (B, C, H, W)`` at the bottom/right so H and W are multiples of ``divisor``."""
    if divisor <= 1:
        return x
    h, w = x.shape[-2:]
    ph, pw = (-h) % divisor, (-w) % divisor
    return F.pad(x, (0, pw, 0, ph)) if ph or pw else x


class _ChannelsLastNorm(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW map (detectron2's MViT normalizes each stage output this way)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class _WinposBackbone(Backbone):
    def _setup_padding(self, size_divisibility, square_pad, min_divisor):
        size_divisibility = min_divisor if size_divisibility is None else int(size_divisibility)
        if size_divisibility <= 0 or size_divisibility % min_divisor:
            raise WinposError(f"size_divisibility={size_divisibility} must be a positive multiple of {min_divisor} "
                              "(the coarsest output stride), or None to use that stride")
        if square_pad and square_pad % size_divisibility:
            raise WinposError(f"square_pad={square_pad} is not a multiple of size_divisibility={size_divisibility}; "
                              f"use {math.ceil(square_pad / size_divisibility) * size_divisibility}")
        self._size_divisibility, self._square_pad = size_divisibility, int(square_pad)

    @property
    def size_divisibility(self) -> int:
        return self._size_divisibility

    @property
    def padding_constraints(self) -> dict:
        # Spelled as detectron2's ImageList reads it (SimpleFeaturePyramid misspells it, detectron2 issue #4676).
        return {"size_divisibility": self._size_divisibility, "square_size": self._square_pad}


class HieraDetBackbone(_WinposBackbone):
    """HieraDet as a 4-level bottom-up for ``FPN``.

    Args:
        net: a preset name (``"hieradet_b"``) or a built module with ``channels`` (4 ints), ``strides``
            (4, 8, 16, 32) and ``forward(x) -> list of 4 (B, C_i, H/s_i, W/s_i)``.
        recipe: the preset's named position-encoding recipe (``original``, ``paper``, ``rope``, ``lookhere``).
        out_features: subset of ``scale2..scale5`` (strides 4, 8, 16, 32) to return.
        norm: add a LayerNorm (``scale{k}_norm``) on each returned stage, as detectron2's MViT does.
        norm_eps: its epsilon.
        size_divisibility: inputs are padded to a multiple of this (default: the coarsest stride, 32).
        square_pad: if > 0, ``padding_constraints`` asks ImageList to pad batches to this square size.
        **overrides: constructor arguments for the preset (e.g. ``drop_path_rate=0.2``, ``img_size=1024``).
    Forward: ``x (B, 3, H, W)`` -> ``{name: (B, C, Hp/stride, Wp/stride)}`` with ``Hp, Wp`` the padded sizes.
    """

    def __init__(self, net="hieradet_b", recipe: str = "original", out_features=HIERA_FEATURES, norm: bool = True,
                 norm_eps: float = 1e-6, size_divisibility: int | None = None, square_pad: int = 0, **overrides):
        super().__init__()
        self.net = build_net(net, recipe, overrides, "HieraDetBackbone")
        channels, strides = list(self.net.channels), list(self.net.strides)
        if len(channels) != 4 or len(strides) != 4:
            raise WinposError(f"HieraDetBackbone needs a net with 4 stages, got channels={channels}, strides={strides}")
        out_features = list(out_features)
        bad = [f for f in out_features if f not in HIERA_FEATURES]
        if bad or not out_features:
            raise WinposError(f"out_features {out_features} must be a non-empty subset of {list(HIERA_FEATURES)}")
        self._out_features = [f for f in HIERA_FEATURES if f in out_features]  # keep stride order
        self._stage_of = {f: HIERA_FEATURES.index(f) for f in self._out_features}
        self._out_feature_channels = {f: channels[i] for f, i in self._stage_of.items()}
        self._out_feature_strides = {f: strides[i] for f, i in self._stage_of.items()}
        for f in self._out_features if norm else ():
            self.add_module(f"{f}_norm", _ChannelsLastNorm(self._out_feature_channels[f], eps=norm_eps))
        self._norm = norm
        self._setup_padding(size_divisibility, square_pad, max(strides))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        stages = self.net(pad_to_multiple(x, self._size_divisibility))
        out = {}
        for f in self._out_features:
            y = stages[self._stage_of[f]]
            out[f] = getattr(self, f"{f}_norm")(y) if self._norm else y
        return out


class ViTDetBackbone(_WinposBackbone):
    """ViTDet as the single-scale input of ``SimpleFeaturePyramid``.

    Args:
        net: a preset name (``"vitdet_b"``) or a built module with ``embed_dim``, ``patch_size`` and
            ``forward(x) -> (B, embed_dim, H/patch, W/patch)``.
        recipe: the preset's named position-encoding recipe.
        out_feature: name of the returned map (detectron2's ``"last_feat"``).
        size_divisibility: inputs are padded to a multiple of this (default: the patch size, 16).
        square_pad: if > 0, ``padding_constraints`` asks ImageList to pad batches to this square size.
        **overrides: constructor arguments for the preset.
    Forward: ``x (B, 3, H, W)`` -> ``{out_feature: (B, embed_dim, Hp/16, Wp/16)}``.
    """

    def __init__(self, net="vitdet_b", recipe: str = "original", out_feature: str = "last_feat",
                 size_divisibility: int | None = None, square_pad: int = 0, **overrides):
        super().__init__()
        self.net = build_net(net, recipe, overrides, "ViTDetBackbone")
        stride = int(self.net.patch_size)
        self.out_feature = out_feature
        self._out_features = [out_feature]
        self._out_feature_channels = {out_feature: int(self.net.embed_dim)}
        self._out_feature_strides = {out_feature: stride}
        self._setup_padding(size_divisibility, square_pad, stride)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {self.out_feature: self.net(pad_to_multiple(x, self._size_divisibility))}
