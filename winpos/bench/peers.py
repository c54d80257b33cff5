"""The models ``benchmark.py backbone`` times: winpos backbones and the implementations people use today.

Every row is rebuilt from its name alone (``build_model(name, img_size)``), so a spawned process can measure one
row's memory. Peers get seeded random weights (``_randomize``), no downloads. A winpos row whose ``source`` is set
is loaded from that peer's state dict (through winpos' own checkpoint converters), so the two must agree; a
model built twice from the same name has the same weights.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch
import torch.nn as nn
from winpos.errors import WinposError

D2_VIT = "detectron2 ViT-B (relpos everywhere)"
SAM_VIT = "segment-anything ViT-B encoder trunk"
SAM2_HIERA = "sam2 Hiera-B+"
REFERENCE = {"vitdet": D2_VIT, "hiera": SAM2_HIERA}  # each family's ratios are taken against this row


def sam2_hiera_bplus():
    from sam2.modeling.backbones.hieradet import Hiera

    return Hiera(embed_dim=112, num_heads=2)


def sam_vit_b_encoder(img_size=1024):
    from segment_anything.modeling.image_encoder import ImageEncoderViT

    return ImageEncoderViT(img_size=img_size, patch_size=16, embed_dim=768, depth=12, num_heads=12, mlp_ratio=4,
                           out_chans=256, qkv_bias=True, norm_layer=partial(nn.LayerNorm, eps=1e-6),
                           use_rel_pos=True, rel_pos_zero_init=True, window_size=14, global_attn_indexes=(2, 5, 8, 11))


class TimmFeatures(nn.Module):
    """A timm HieraDet's trunk: ``(B, 3, H, W) -> (B, C, H/32, W/32)``, without the classifier head."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net.forward_features(x).permute(0, 3, 1, 2)  # (B, H, W, C) -> (B, C, H, W)


def _randomize(model: nn.Module, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g) * 0.02
            p.copy_(noise + 1.0 if (p.dim() == 1 and "norm" in name and name.endswith("weight")) else noise)
    return model.eval()


def _d2_vit(img_size, built, use_rel_pos=True):
    from winpos.d2.peers import detectron2_vit_b

    return _randomize(detectron2_vit_b(img_size, use_rel_pos=use_rel_pos))


def _sam_trunk(img_size, built):
    encoder = sam_vit_b_encoder(img_size)
    encoder.neck = nn.Identity()  # the trunk only: forward then ends with the (B, C, H, W) features
    return _randomize(encoder)


def _winpos_vitdet(img_size, built, recipe="paper", **overrides):
    from winpos.backbones import create

    return create("vitdet_b", recipe=recipe, img_size=img_size, drop_path_rate=0.0, **overrides).eval()


def _winpos_vitdet_from(img_size, built, source):
    from winpos.checkpoints.vitdet import load_vitdet_weights

    peer = build_model(source, img_size, built)
    if source == SAM_VIT:  # SAM's embedding is a full grid at img_size, without a cls token
        model = _winpos_vitdet(img_size, built, "original", pretrain_img_size=img_size, pretrain_use_cls_token=False)
        load_vitdet_weights(model, peer.state_dict(), source="sam")
    else:
        model = _winpos_vitdet(img_size, built, "original")
        load_vitdet_weights(model, peer.state_dict(), source="detectron2")
    return model


def _sam2_hiera(img_size, built):
    return _randomize(sam2_hiera_bplus())


def _sam2_state_dict(img_size, built):
    return build_model(SAM2_HIERA, img_size, built).state_dict()


def _timm_hieradet(img_size, built):
    import timm
    from timm.models.hieradet_sam2 import checkpoint_filter_fn

    net = timm.create_model("sam2_hiera_base_plus", pretrained=False, num_classes=0)
    result = net.load_state_dict(checkpoint_filter_fn(_sam2_state_dict(img_size, built), net), strict=False)
    trunk_missing = [k for k in result.missing_keys if not k.startswith("head.")]
    if trunk_missing or result.unexpected_keys:
        raise RuntimeError(f"timm's sam2_hiera_base_plus no longer matches sam2's Hiera-B+: missing "
                           f"{trunk_missing[:5]}, unexpected {result.unexpected_keys[:5]}; update _timm_hieradet "
                           "for this timm version")
    return TimmFeatures(net).eval()


def _winpos_hieradet(img_size, built, recipe="paper"):
    from winpos.backbones import create

    return create("hieradet_bplus", recipe=recipe, img_size=img_size).eval()


def _winpos_hieradet_from_sam2(img_size, built):
    from winpos.checkpoints.hiera import load_hiera_checkpoint

    model = _winpos_hieradet(img_size, built, "original")
    sd = _sam2_state_dict(img_size, built)
    load_hiera_checkpoint(model, {"model": {"image_encoder.trunk." + k: v for k, v in sd.items()}})
    return model


class Within(nn.Module):
    """A winpos model whose forward runs inside ``context()`` (a fresh context manager per call): the unfused and
    the FlexAttention rows time the same model with one switch changed."""

    def __init__(self, net: nn.Module, context: Callable[[], object]):
        super().__init__()
        self.net, self.context = net, context

    def forward(self, x):
        with self.context():
            return self.net(x)


@contextmanager
def _flex_backend():
    """``WINPOS_ATTENTION_BACKEND=flex`` (the override of ``backend="auto"``) for the call, restored after it."""
    before = os.environ.get("WINPOS_ATTENTION_BACKEND")
    os.environ["WINPOS_ATTENTION_BACKEND"] = "flex"
    try:
        yield
    finally:
        if before is None:
            del os.environ["WINPOS_ATTENTION_BACKEND"]
        else:
            os.environ["WINPOS_ATTENTION_BACKEND"] = before


def _unfused_context():
    from winpos.backbones.fused import fused_linear

    return fused_linear(False)  # the plain ops: separate linear, GELU and residual adds


def _within(build, context):
    def make(img_size, built):
        return Within(build(img_size, built), context).eval()

    return make


def _flex(build):
    return _within(build, _flex_backend)


def _unfused(build):
    return _within(build, _unfused_context)


@dataclass(frozen=True)
class Row:
    """One timed model.

    family: ``"vitdet"`` or ``"hiera"`` (what ``--which`` selects).
    peer: the row this one is timed against (None for the family's reference).
    build: ``(img_size, built) -> nn.Module`` in eval mode; ``built`` caches the rows already made.
    source: the row whose weights this model was loaded from (their outputs are compared), or None.
    compiles: whether ``--compile`` adds a compiled row (not for the unfused rows: torch.compile never takes the
        fused path, so their compiled row would be the fused row's compiled row again; not for the flex-backend rows:
        FlexAttention is compiled inside them already).
    """

    family: str
    peer: str | None
    build: Callable[[int, dict], nn.Module]
    source: str | None = None
    compiles: bool = True


ROWS: dict[str, Row] = {
    D2_VIT: Row("vitdet", None, _d2_vit),
    "detectron2 ViT-B (no relpos)": Row("vitdet", D2_VIT, partial(_d2_vit, use_rel_pos=False)),
    SAM_VIT: Row("vitdet", D2_VIT, _sam_trunk),
    "winpos ViTDet-B original": Row("vitdet", D2_VIT, partial(_winpos_vitdet_from, source=D2_VIT), source=D2_VIT),
    "winpos ViTDet-B original (SAM weights)": Row("vitdet", SAM_VIT, partial(_winpos_vitdet_from, source=SAM_VIT),
                                                  source=SAM_VIT),
    "winpos ViTDet-B original, unfused": Row("vitdet", D2_VIT, _unfused(partial(_winpos_vitdet_from, source=D2_VIT)),
                                             source=D2_VIT, compiles=False),
    "winpos ViTDet-B paper": Row("vitdet", D2_VIT, partial(_winpos_vitdet, recipe="paper")),
    "winpos ViTDet-B rope": Row("vitdet", D2_VIT, partial(_winpos_vitdet, recipe="rope")),
    "winpos ViTDet-B lookhere": Row("vitdet", D2_VIT, partial(_winpos_vitdet, recipe="lookhere")),
    "winpos ViTDet-B flex backend, paper": Row("vitdet", D2_VIT, _flex(partial(_winpos_vitdet, recipe="paper")),
                                                compiles=False),
    "winpos ViTDet-B flex backend, lookhere": Row("vitdet", D2_VIT, _flex(partial(_winpos_vitdet, recipe="lookhere")),
                                                   compiles=False),
    "winpos ViTDet-B abswin, no block term": Row("vitdet", D2_VIT,
                                                 partial(_winpos_vitdet, recipe="paper", global_pos="none")),
    SAM2_HIERA: Row("hiera", None, _sam2_hiera),
    "timm HieraDet-B+ (sam2_hiera_base_plus)": Row("hiera", SAM2_HIERA, _timm_hieradet, source=SAM2_HIERA),
    "winpos HieraDet-B+ original": Row("hiera", SAM2_HIERA, _winpos_hieradet_from_sam2, source=SAM2_HIERA),
    "winpos HieraDet-B+ original, unfused": Row("hiera", SAM2_HIERA, _unfused(_winpos_hieradet_from_sam2),
                                                source=SAM2_HIERA, compiles=False),
    "winpos HieraDet-B+ flex backend, original": Row("hiera", SAM2_HIERA, _flex(_winpos_hieradet_from_sam2),
                                                      source=SAM2_HIERA, compiles=False),
    "winpos HieraDet-B+ paper": Row("hiera", SAM2_HIERA, partial(_winpos_hieradet, recipe="paper")),
}


def rows_for(which: str = "all", patterns=None) -> list[str]:
    """Row names of ``which`` in ``("all", "vitdet", "hiera")``, in table order.

    patterns: keep only the rows whose name contains one of these strings (case-insensitive), plus the peers and
    weight sources of those rows.
    """
    if which not in ("all", *REFERENCE):
        raise WinposError(f"which={which!r}; choose 'all', 'vitdet' or 'hiera'")
    names = [name for name, row in ROWS.items() if which in ("all", row.family)]
    if not patterns:
        return names
    chosen = [n for n in names if any(p.lower() in n.lower() for p in patterns)]
    if not chosen:
        raise WinposError(f"no {which} row matches {list(patterns)}; rows: {'; '.join(names)}")
    keep = set(chosen) | {ROWS[n].peer for n in chosen} | {ROWS[n].source for n in chosen}
    return [n for n in names if n in keep]


def build_model(name: str, img_size: int, built: dict | None = None) -> nn.Module:
    """The model of row ``name`` for ``img_size`` inputs (eval mode, CPU); ``built`` caches rows across calls."""
    if name not in ROWS:
        raise WinposError(f"unknown benchmark row {name!r}; rows: {', '.join(ROWS)}")
    built = {} if built is None else built
    if name not in built:
        built[name] = ROWS[name].build(img_size, built)
    return built[name]
