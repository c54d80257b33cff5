"""train.freeze (winpos.d2.freeze): prefixes and presets, what the optimizer gets, a real training run whose frozen
trunk stays bit-identical while its heads move, and the bad input it refuses."""
import pytest
import torch

from winpos.d2.freeze import freeze_parameters, freeze_prefixes
from winpos.errors import WinposError


class _Detector(torch.nn.Module):
    """The module tree of a winpos Mask R-CNN, in miniature (same top-level names)."""

    def __init__(self):
        super().__init__()
        self.backbone = torch.nn.Module()
        self.backbone.bottom_up = torch.nn.Linear(3, 4)
        self.backbone.simfp_2 = torch.nn.Linear(4, 4)
        self.proposal_generator = torch.nn.Linear(4, 2)
        self.roi_heads = torch.nn.Linear(4, 5)


def _trainable(model):
    return sorted(n for n, p in model.named_parameters() if p.requires_grad)


@pytest.mark.parametrize("value, expected", [
    (None, ()), ([], ()), ("none", ()), ("trunk", ("backbone.bottom_up",)), ("heads", ("backbone", "proposal_generator")),
    ("backbone.simfp_2", ("backbone.simfp_2",)), (["backbone.bottom_up.", " roi_heads"], ("backbone.bottom_up", "roi_heads")),
    (("a", "a"), ("a",)),
])
def test_prefixes_and_presets(value, expected):
    assert freeze_prefixes(value) == expected


@pytest.mark.parametrize("preset, trains", [
    ("none", ["backbone.bottom_up", "backbone.simfp_2", "proposal_generator", "roi_heads"]),
    ("trunk", ["backbone.simfp_2", "proposal_generator", "roi_heads"]),
    ("backbone", ["proposal_generator", "roi_heads"]),
    ("heads", ["roi_heads"]),
])
def test_each_preset_leaves_exactly_its_modules_trainable(preset, trains):
    model = _Detector()
    info = freeze_parameters(model, preset)
    assert _trainable(model) == sorted(f"{m}.{w}" for m in trains for w in ("bias", "weight"))
    assert info["trainable"] == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert info["frozen"] + info["trainable"] == sum(p.numel() for p in model.parameters())


def test_a_prefix_is_a_module_path_not_a_partial_name():
    model = _Detector()
    with pytest.raises(WinposError, match=r"\['backbone.bottom'\] match no parameter.*under it: backbone.bottom_up, "
                                          r"backbone.simfp_2"):
        freeze_parameters(model, ["backbone.bottom"])
    assert len(_trainable(model)) == 8  # refused before anything changed


def test_freezing_everything_is_refused_and_changes_nothing():
    model = _Detector()
    with pytest.raises(WinposError, match="freezes every parameter"):
        freeze_parameters(model, ["backbone", "proposal_generator", "roi_heads"])
    assert len(_trainable(model)) == 8


@pytest.mark.parametrize("value", [[""], ["."], [3], 3.5])
def test_values_that_are_not_prefixes_are_refused(value):
    with pytest.raises(WinposError, match="train.freeze"):
        freeze_prefixes(value)


def test_the_optimizer_gets_only_the_trainable_parameters():
    from winpos.d2.config import load_config
    from winpos.d2.engine import build_model, build_optimizer

    cfg = load_config("shapes/mask_rcnn_hieradet_toy_abswin.py", ["train.device=cpu"])
    model = build_model(cfg)
    freeze_parameters(model, "trunk")
    opt = build_optimizer(cfg, model)
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    names = {id(p): n for n, p in model.named_parameters()}
    assert in_opt and all(not names[i].startswith("backbone.bottom_up.") for i in in_opt)
    assert in_opt == {id(p) for p in model.parameters() if p.requires_grad}


def test_a_training_run_keeps_the_frozen_trunk_bit_identical(tmp_path, caplog):
    """Two iterations of the small-data recipe 'trunk' from the shipped detector: every trunk tensor of the final
    checkpoint equals the loaded one, the pyramid and heads moved; the log says the epochs the data makes."""
    import logging

    from winpos.d2.engine import do_train
    from winpos.experiments import small_data as S
    from winpos.experiments.protocol import build_cfg
    from winpos.model_zoo import config_path, demo_checkpoint

    spec = next(s for s in S.small_data_specs(str(config_path("shapes/reproduce_hieradet.py")), str(demo_checkpoint()),
                                              tmp_path, recipes=("full", "trunk"), train_images=(4,), seeds=(0,),
                                              iters=2) if s.get("freeze"))
    spec["shapes"] = dict(spec["shapes"], val_images=2)
    cfg = build_cfg(spec)
    assert list(cfg.train.freeze) == ["backbone.bottom_up"] and cfg.model.roi_heads.num_classes == 4
    cfg.train.eval_after_train = False
    with caplog.at_level(logging.INFO, logger="winpos"):
        do_train(cfg)
    assert "training set: 4 images; 2 iterations x 8 images = 4.0 epochs" in caplog.text
    assert "train.freeze ['backbone.bottom_up']:" in caplog.text
    start = torch.load(demo_checkpoint(), map_location="cpu", weights_only=True)["model"]
    end = torch.load(tmp_path / "trunk" / "n4" / "seed0" / "model_final.pth", map_location="cpu",
                     weights_only=True)["model"]
    trunk = [k for k in end if k.startswith("backbone.bottom_up.")]
    assert len(trunk) > 50
    for k in trunk:
        assert torch.equal(end[k], start[k].float()), k
    moved = [k for k in end if not k.startswith("backbone.bottom_up.") and k in start
             and end[k].shape == start[k].shape and not torch.equal(end[k], start[k].float())]
    assert any(k.startswith("backbone.") for k in moved) and any(k.startswith("roi_heads.") for k in moved)


def test_the_training_plan_says_what_is_frozen():
    from winpos.d2.config import load_config
    from winpos.d2.startup import start_up_block

    cfg = load_config("shapes/mask_rcnn_hieradet_toy_abswin.py", ["train.device=cpu"])
    assert "frozen                          nothing (every parameter trains)" in start_up_block(cfg, 1, "cpu")
    cfg.train.freeze = "heads"
    assert "frozen                          backbone, proposal_generator" in start_up_block(cfg, 1, "cpu")



def test_a_frozen_trunk_computes_the_same_features_every_step():
    """Drop path inside the frozen trunk is turned off (the heads would otherwise train on randomly thinned features
    that evaluation never gives); outside it, it stays as configured."""
    from winpos.backbones.common import DropPath
    from winpos.d2.config import load_config
    from winpos.d2.engine import build_model

    cfg = load_config("shapes/mask_rcnn_hieradet_toy_abswin.py",
                      ["train.device=cpu", "model.backbone.bottom_up.drop_path_rate=0.3"])
    model = build_model(cfg).train()
    trunk = model.backbone.bottom_up
    on = [m for m in trunk.modules() if isinstance(m, DropPath) and m.p > 0]
    assert len(on) >= 2
    x = torch.randn(2, 3, 256, 256)
    torch.manual_seed(0)
    a = trunk(x)
    torch.manual_seed(1)
    assert any(not torch.equal(a[k], v) for k, v in trunk(x).items())  # stochastic before
    info = freeze_parameters(model, "trunk")
    assert info["stochastic_off"] == len(on) and all(m.p == 0 for m in on)
    torch.manual_seed(0)
    a = trunk(x)
    torch.manual_seed(1)
    assert all(torch.equal(a[k], v) for k, v in trunk(x).items())
