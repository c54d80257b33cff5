"""COCO recipes of ViTDet from DINOv3, EVA-02, RoPE-ViT and DINOv2, by name: each instantiates at full size (meta parameters),
saves to and rebuilds from ``config.yaml``, takes layer-wise lr decay over its own depth, names its weights; and each
family trains five iterations on the CPU from a converted random-init timm checkpoint, loaded by the same
``train.init_checkpoint`` path as a real run (the trunk narrowed to two blocks of width 128 by overrides, a 128 px
canvas and fewer proposals)."""
import pytest
import torch
from detectron2.config import instantiate

from tests.conftest import require
from tests.d2.test_configs import instantiated_and_reloaded
from tests.d2.test_family_configs import CPU_HEADS, train_five_iterations
from winpos.d2.checkpoint import WinposCheckpointer, load_init_checkpoint
from winpos.d2.optim import layer_ids
from winpos.model_zoo import get_config, list_configs

# family -> (preset stem, recipe, timm model of the weights, whose keys the import reads)
FAMILIES = {
    "dinov3": ("vitdet_dinov3", "original", "vit_{}_patch16_dinov3"),
    "eva02": ("vitdet_eva02", "original", "eva02_{}_patch14_224"),
    "ropevit": ("vitdet_ropevit", "mixed", "vit_{}_patch16_rope_mixed_224"),
    "dinov2": ("vitdet_dinov2", "paper", "vit_{}_patch14_dinov2"),  # an absolute embedding: abs-win, the fix
}
SIZES = {"b": ("base", 12, 768, 0.7), "l": ("large", 24, 1024, 0.8)}
ROPE_FAMILY_CONFIGS = [f"COCO/{kind}_vitdet_{fam}_{s}_100ep.py" for kind in ("mask_rcnn", "cascade_mask_rcnn")
                       for fam in FAMILIES for s in SIZES]


@pytest.mark.parametrize("name", ROPE_FAMILY_CONFIGS)
def test_recipe_instantiates_by_name_at_full_size(name, tmp_path):
    assert name in list_configs()
    family, size = name.split("_vitdet_")[1].split("_")[:2]
    stem, recipe, weights = FAMILIES[family]
    width_name, depth, width, decay = SIZES[size]
    cfg = get_config(name)
    model, _ = instantiated_and_reloaded(cfg, tmp_path)
    net = model.backbone.net.net
    assert (cfg.model.backbone.net.net, cfg.model.backbone.net.recipe) == (f"{stem}_{size}", recipe)
    assert (net.depth, net.embed_dim, net.patch_size) == (depth, width, 16)
    assert [s.stride for s in model.backbone.output_shape().values()] == [4, 8, 16, 32, 64]
    assert ("cascade" in name) == (type(model.roi_heads).__name__ == "CascadeROIHeads")
    ids = layer_ids(model)
    assert ids["backbone.net.net.patch_embed.proj.weight"] == (0, depth)
    assert ids[f"backbone.net.net.blocks.{depth - 1}.mlp.fc2.weight"] == (depth, depth)
    assert cfg.optimizer.params.lr_decay_rate == decay
    assert cfg.train.init_checkpoint.startswith(weights.format(width_name))


@pytest.mark.slow  # 50-54 s each with OMP_NUM_THREADS unset
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_recipe_trains_five_iterations_from_a_converted_checkpoint(family, tmp_path):
    stem, _, weights = FAMILIES[family]
    timm = require("timm")
    torch.manual_seed(0)
    small = dict(embed_dim=128, depth=2, num_heads=2)
    source = timm.create_model(weights.format("base"), pretrained=False, num_classes=0, **small).state_dict()
    torch.save(source, tmp_path / "weights.pth")
    # the shipped path's query: DINOv3's accepts the loss of its storage tokens, the others lose nothing
    query = get_config(f"COCO/mask_rcnn_vitdet_{family}_b_100ep.py").train.init_checkpoint.partition("?")[2]
    assert query == ("allow_loss=True" if family == "dinov3" else "")
    cfg = get_config(f"COCO/mask_rcnn_vitdet_{family}_b_100ep.py", [
        *(f"model.backbone.net.{k}={v}" for k, v in small.items()), "model.backbone.net.global_blocks=[1]",
        "model.backbone.square_pad=128", *CPU_HEADS,
        f'train.init_checkpoint="{tmp_path / "weights.pth"}' + (f'?{query}"' if query else '"')])
    model = instantiate(cfg.model).train()
    report = load_init_checkpoint(WinposCheckpointer(model), cfg.train.init_checkpoint)
    assert f"winpos importer ({family.replace('ropevit', 'rope_vit')})" in report, report
    net = model.backbone.net.net
    torch.testing.assert_close(net.blocks[1].mlp.fc2.weight.detach(), source["blocks.1.mlp.fc2.weight"], rtol=0,
                               atol=0)
    cfg.optimizer.params.model = model
    optimizer = instantiate(cfg.optimizer)
    decay = {id(q): g["weight_decay"] for g in optimizer.param_groups for q in g["params"]}
    assert decay[id(net.blocks[0].attn.qkv.weight)] == 0.1
    if family != "eva02":  # LayerScale gains take no weight decay, as in the family's own training
        assert decay[id(net.blocks[0].ls1.gamma)] == decay[id(net.blocks[1].ls2.gamma)] == 0.0
    moved = train_five_iterations(model, cfg, net, optimizer)
    assert "blocks.0.attn.qkv.weight" in moved and "blocks.1.mlp.fc1.weight" in moved
    if family == "ropevit":  # the learned frequencies train too
        assert "blocks.0.attn.rope.freqs" in moved


GIANT_CONFIGS = [f"COCO/{kind}_vitdet_dinov2_g_75ep.py" for kind in ("mask_rcnn", "cascade_mask_rcnn")]


@pytest.mark.parametrize("name", GIANT_CONFIGS)
def test_the_dinov2_giant_recipe_instantiates_by_name_at_full_size(name, tmp_path):
    """DINOv2 ViT-g/14 in ViTDet-H's recipe: 40 blocks of width 1536 with a SwiGLU MLP (hidden 4096), global blocks
    9, 19, 29, 39, the 75-epoch schedule, lr decay 0.9 over its own depth, drop path 0.5, timm's giant weights."""
    assert name in list_configs()
    cfg = get_config(name)
    model, _ = instantiated_and_reloaded(cfg, tmp_path)
    net = model.backbone.net.net
    assert (cfg.model.backbone.net.net, cfg.model.backbone.net.recipe) == ("vitdet_dinov2_g", "paper")
    assert (net.depth, net.embed_dim, net.num_heads, net.patch_size) == (40, 1536, 24, 16)
    assert net.global_blocks == (9, 19, 29, 39) and tuple(net.blocks[0].mlp.fc2.weight.shape) == (1536, 4096)
    assert [s.stride for s in model.backbone.output_shape().values()] == [4, 8, 16, 32, 64]
    assert ("cascade" in name) == (type(model.roi_heads).__name__ == "CascadeROIHeads")
    ids = layer_ids(model)
    assert ids["backbone.net.net.patch_embed.proj.weight"] == (0, 40)
    assert ids["backbone.net.net.blocks.39.mlp.fc2.weight"] == (40, 40)
    assert cfg.optimizer.params.lr_decay_rate == 0.9 and cfg.model.backbone.net.drop_path_rate == 0.5
    assert cfg.train.max_iter == 138281 and cfg.train.init_checkpoint.startswith("vit_giant_patch14_dinov2")
