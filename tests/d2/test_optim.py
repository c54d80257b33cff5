"""Optimizer groups: layer-wise lr decay (oracle: detectron2's get_vit_lr_decay_rate for ViTDet), weight decay by
detectron2's rule (torch norms, then overrides) and the "all norms" variant. The full-size parity with detectron2's
optimizer is tests/d2/test_optim_parity.py."""
import pytest
import torch
from detectron2.config import LazyCall as L
from detectron2.config import instantiate
from detectron2.layers.batch_norm import LayerNorm as D2LayerNorm
from detectron2.modeling import SimpleFeaturePyramid
from detectron2.modeling.backbone.fpn import LastLevelMaxPool
from detectron2.modeling.backbone.vit import get_vit_lr_decay_rate

from winpos.d2 import HieraDetBackbone, ViTDetBackbone
from winpos.d2.optim import get_optimizer_params, is_position_param, layer_ids

BASE_LR, WD, DECAY = 1e-3, 0.1, 0.7


class Detector(torch.nn.Module):
    """A stand-in detector with detectron2's naming: backbone (pyramid around the adapter) and a head."""

    def __init__(self, backbone):
        super().__init__()
        self.backbone = backbone
        self.head = torch.nn.Linear(4, 4)


def _vit_model(recipe):
    net = ViTDetBackbone("vitdet_toy", recipe, img_size=64, window_size=4)
    return Detector(SimpleFeaturePyramid(net, "last_feat", 16, (2.0, 1.0), top_block=LastLevelMaxPool(), norm="LN"))


def _groups_by_param(groups):
    return {id(p): g for g in groups for p in g["params"]}


@pytest.mark.parametrize("recipe", ["original", "paper", "rope", "lookhere"])
def test_vitdet_layer_decay_matches_detectron2(recipe):
    model = _vit_model(recipe)
    groups = get_optimizer_params(model, base_lr=BASE_LR, weight_decay=WD, lr_decay_rate=DECAY)
    by_param = _groups_by_param(groups)
    num_layers = model.backbone.net.net.num_layers
    names = dict(model.named_parameters())
    assert sum(len(g["params"]) for g in groups) == len(names)  # every parameter exactly once
    for name, p in names.items():
        want = BASE_LR * get_vit_lr_decay_rate(name, DECAY, num_layers)
        assert by_param[id(p)]["lr"] == pytest.approx(want, rel=1e-12), name


def test_position_layer_and_overrides():
    model = _vit_model("original")
    names = dict(model.named_parameters())
    pos = [n for n in names if is_position_param(n)]
    assert any("pos_embed" in n for n in pos) and any("rel_pos" in n for n in pos)
    for mode in ("block", "zero"):
        groups = get_optimizer_params(model, base_lr=BASE_LR, weight_decay=WD, lr_decay_rate=DECAY,
                                      position_layer=mode, overrides={"pos_embed": {"weight_decay": 0.0}})
        by_param = _groups_by_param(groups)
        for n in pos:
            g = by_param[id(names[n])]
            assert g["weight_decay"] == (0.0 if "pos_embed" in n else WD), n  # relpos decays, as in detectron2
            if "pos_embed" in n or mode == "zero":
                assert g["layer_id"] == 0 and g["lr"] == pytest.approx(BASE_LR * DECAY ** (4 + 1)), n
            else:  # relpos inside block i decays with its block, as in detectron2
                assert g["layer_id"] == int(n.split(".blocks.")[1].split(".")[0]) + 1, n
        assert by_param[id(names["head.weight"])]["weight_decay"] == WD
    lr_override = get_optimizer_params(model, base_lr=BASE_LR, overrides={"head": {"lr": 0.5}})
    assert _groups_by_param(lr_override)[id(names["head.bias"])]["lr"] == 0.5  # an absolute lr


def test_norms_torch_rule_and_all_norms():
    model = _vit_model("paper")
    torch_norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    d2_norms = [m for m in model.modules() if isinstance(m, D2LayerNorm)]
    assert torch_norms and d2_norms
    qkv = model.backbone.net.net.blocks[0].attn.qkv.weight
    for norm_layers, d2_wd in (("torch", WD), ("all", 0.0)):
        by_param = _groups_by_param(get_optimizer_params(model, base_lr=BASE_LR, weight_decay=WD,
                                                         norm_layers=norm_layers))
        assert all(by_param[id(p)]["weight_decay"] == 0.0 for m in torch_norms for p in m.parameters())
        assert all(by_param[id(p)]["weight_decay"] == d2_wd for m in d2_norms for p in m.parameters()), norm_layers
        assert by_param[id(qkv)]["weight_decay"] == WD
    no_norm_rule = _groups_by_param(get_optimizer_params(model, weight_decay=WD, weight_decay_norm=None))
    assert all(no_norm_rule[id(p)]["weight_decay"] == WD for m in torch_norms for p in m.parameters())


def test_hieradet_layer_ids_per_block():
    model = Detector(HieraDetBackbone("hieradet_toy", "paper", img_size=64, window_spec=(8, 4, 4, 2)))
    net = model.backbone.net
    ids = layer_ids(model)
    L_ = net.num_layers
    for name, _ in model.named_parameters():
        lid, n = ids[name]
        assert n == L_
        if name.startswith("backbone.net.patch_embed") or "pos_embed" in name:
            assert lid == 0, name
        elif name.startswith("backbone.net.blocks."):
            assert lid == int(name.split(".")[3]) + 1, name
        else:  # stage norms of the adapter and the head
            assert lid == L_ + 1, name
    groups = get_optimizer_params(model, base_lr=BASE_LR, weight_decay=WD, lr_decay_rate=0.8)
    lrs = {g["layer_id"]: g["lr"] for g in groups}
    assert lrs[0] == pytest.approx(BASE_LR * 0.8 ** (L_ + 1)) and lrs[L_ + 1] == pytest.approx(BASE_LR)
    assert any(is_position_param(n) for n, _ in model.named_parameters() if "rel_pos" in n)


def test_from_lazyconfig_and_bad_arguments():
    model = _vit_model("rope")
    cfg = L(torch.optim.AdamW)(params=L(get_optimizer_params)(base_lr="${..lr}", lr_decay_rate=0.9), lr=2e-4,
                               weight_decay=0.05)
    cfg.params.model = model
    opt = instantiate(cfg)
    assert max(g["lr"] for g in opt.param_groups) == pytest.approx(2e-4)
    assert {g["weight_decay"] for g in opt.param_groups} == {0.0, 0.05}
    with pytest.raises(ValueError, match="base_lr"):
        get_optimizer_params(model, lr_decay_rate=0.5)
    with pytest.raises(ValueError, match="position_layer"):
        get_optimizer_params(model, position_layer="first")
    with pytest.raises(ValueError, match="norm_layers='some'; choose 'torch'"):
        get_optimizer_params(model, norm_layers="some")
    with pytest.raises(ValueError, match="'lr' and/or 'weight_decay'"):
        get_optimizer_params(model, overrides={"pos_embed": {"wd": 0.0}})
