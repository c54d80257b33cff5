"""COCO recipes of the RoPE-era trunks, by name: each instantiates at full size (meta parameters), saves to and
rebuilds from ``config.yaml``, takes layer-wise lr decay over its own depth, and trains five iterations on the CPU
from a converted random-init checkpoint in its authors' layout, loaded by the same ``train.init_checkpoint`` path
as a real run (``winpos.d2.checkpoint.load_init_checkpoint``).

The CPU runs use the config by name with overrides: the family's toy trunk (the same block kinds at width 128), a
128 px canvas and fewer proposals (``CPU_HEADS``); the batch is two synthetic images with two objects each.
"""
import pytest
import torch
from detectron2.config import instantiate
from detectron2.utils.events import EventStorage

from tests.conftest import require
from tests.d2.test_configs import CONFIGS, FAMILY_COCO, _synthetic_batch, instantiated_and_reloaded
from winpos.d2.checkpoint import WinposCheckpointer, load_init_checkpoint
from winpos.d2.optim import layer_ids
from winpos.model_zoo import get_config, list_configs

SAM3 = ["COCO/mask_rcnn_vitdet_sam3_100ep.py", "COCO/cascade_mask_rcnn_vitdet_sam3_100ep.py"]
# Fewer proposals and sampled RoIs than COCO's 2000 / 512: the heads' cost, not the trunk's, dominates a CPU step.
CPU_HEADS = ["model.proposal_generator.pre_nms_topk=[200,200]", "model.proposal_generator.post_nms_topk=[64,64]",
             "model.roi_heads.batch_size_per_image=64"]


# Segment Anything's image encoders (a ViTDet trunk pretrained at 1024 px) in detectron2's ViTDet recipes
SAM = [f"COCO/{kind}_vitdet_sam_{size}.py" for kind in ("mask_rcnn", "cascade_mask_rcnn")
       for size in ("b_100ep", "l_100ep", "h_75ep")]
SAM_SIZES = {"b": (12, 768, (2, 5, 8, 11), 0.7, "sam_vit_b_01ec64.pth", 184375),
             "l": (24, 1024, (5, 11, 17, 23), 0.8, "sam_vit_l_0b3195.pth", 184375),
             "h": (32, 1280, (7, 15, 23, 31), 0.9, "sam_vit_h_4b8939.pth", 138281)}
TESTED = SAM3 + SAM


def test_every_family_config_is_tested_here():
    found = sorted(p.relative_to(CONFIGS).as_posix() for p in FAMILY_COCO)
    # DINOv3 / EVA-02 / RoPE-ViT / DINOv2 B, L and DINOv2 g, tested there
    from tests.d2.test_rope_family_configs import GIANT_CONFIGS, ROPE_FAMILY_CONFIGS

    tested = TESTED + ROPE_FAMILY_CONFIGS + GIANT_CONFIGS
    assert found and set(found) <= set(tested), sorted(set(found) - set(tested))


@pytest.mark.parametrize("name", SAM3)
def test_sam3_recipe_instantiates_by_name_at_full_size(name, tmp_path):
    assert name in list_configs()
    cfg = get_config(name)
    model, _ = instantiated_and_reloaded(cfg, tmp_path)
    net = model.backbone.net.net
    assert (net.depth, net.embed_dim, net.patch_size, net.window_size, net.global_blocks) == \
        (32, 1024, 16, 24, (7, 15, 23, 31))
    assert net.ln_pre is not None and net.patch_embed.proj.bias is None and net.pos_embed_kind == "abswin"
    assert [s.stride for s in model.backbone.output_shape().values()] == [4, 8, 16, 32, 64]
    assert ("cascade" in name) == (type(model.roi_heads).__name__ == "CascadeROIHeads")
    ids = layer_ids(model)
    assert ids["backbone.net.net.ln_pre.weight"] == (0, 32) == ids["backbone.net.net.patch_embed.proj.weight"]
    assert ids["backbone.net.net.blocks.31.mlp.fc2.weight"] == (32, 32)
    assert cfg.optimizer.params.lr_decay_rate == 0.9 and cfg.train.init_checkpoint == "sam3.pt"
    cfg.optimizer.params.model = model
    decay = {id(p): g["weight_decay"] for g in instantiate(cfg.optimizer).param_groups for p in g["params"]}
    embed = [(n, p) for n, p in model.named_parameters() if "pos_embed" in n]
    assert len(embed) == 2 and all(decay[id(p)] == 0.0 for _, p in embed)  # the tiled embedding: no weight decay
    assert decay[id(net.blocks[0].attn.qkv.weight)] == 0.1


def _sam3_file(path):
    """A random-init SAM3 encoder at the toy width, saved as a whole SAM3 checkpoint (``{"model": ...}`` with the
    encoder under ``detector.backbone.vision_backbone.trunk.`` and a key of SAM3's neck beside it)."""
    from tests.checkpoints.test_sam3_encoder import SAM3_SETTINGS, TOY

    vitdet = require("sam3.model.vitdet")
    torch.manual_seed(0)
    trunk = vitdet.ViT(img_size=336, **SAM3_SETTINGS, **TOY).state_dict()
    whole = {f"detector.backbone.vision_backbone.trunk.{k}": v for k, v in trunk.items()}
    whole["detector.backbone.vision_backbone.convs.0.dconv_2x2.weight"] = torch.zeros(8, 8, 2, 2)
    torch.save({"model": whole}, path)
    return trunk


@pytest.mark.slow  # 55 s with OMP_NUM_THREADS unset
def test_sam3_recipe_trains_five_iterations_from_a_converted_checkpoint(tmp_path):
    from winpos.checkpoints.convert import resample_patch_kernel

    trunk = _sam3_file(tmp_path / "sam3.pt")
    cfg = get_config(SAM3[0], ["model.backbone.net.net=vitdet_sam3_toy", "model.backbone.square_pad=128", *CPU_HEADS,
                               f"train.init_checkpoint={tmp_path / 'sam3.pt'}"])
    torch.manual_seed(0)
    model = instantiate(cfg.model).train()
    report = load_init_checkpoint(WinposCheckpointer(model), cfg.train.init_checkpoint)
    assert "winpos importer (sam3)" in report
    net = model.backbone.net.net
    torch.testing.assert_close(net.patch_embed.proj.weight.detach(),
                               resample_patch_kernel(trunk["patch_embed.proj.weight"], (16, 16)), rtol=0, atol=0)
    torch.testing.assert_close(net.blocks[3].mlp.fc2.weight.detach(), trunk["blocks.3.mlp.fc2.weight"], rtol=0, atol=0)
    moved = train_five_iterations(model, cfg, net)
    assert "ln_pre.weight" in moved and "blocks.0.attn.qkv.weight" in moved and "pos_embed.window_embed" in moved


def train_five_iterations(model, cfg, net, optimizer=None) -> list[str]:
    """Five optimizer steps of ``model`` on two synthetic images (finite losses); the names of ``net``'s parameters
    that moved."""
    if optimizer is None:
        cfg.optimizer.params.model = model
        optimizer = instantiate(cfg.optimizer)
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    for it in range(5):
        with EventStorage(it):
            losses = model(_synthetic_batch(n=2, num_classes=cfg.model.roi_heads.num_classes))
        total = sum(losses.values())
        assert torch.isfinite(total), losses
        optimizer.zero_grad()
        total.backward()
        optimizer.step()
    return [n for n, p in net.named_parameters() if not torch.equal(p.detach(), before[n])]


@pytest.mark.parametrize("name", SAM)
def test_sam_recipe_instantiates_by_name_at_full_size(name, tmp_path):
    """SAM's encoder in detectron2's ViTDet recipe of its size: the 64 x 64 embedding grid without a cls row, the
    schedule its first line states, every position-encoding recipe as an override."""
    assert name in list_configs()
    size = name.split("_vitdet_sam_")[1][0]
    depth, width, global_blocks, decay, weights, iters = SAM_SIZES[size]
    first = (CONFIGS / name).read_text().splitlines()[0]
    assert first.startswith(("# Mask R-CNN, ViTDet from SAM ViT-", "# Cascade Mask R-CNN, ViTDet from SAM ViT-"))
    assert f"= {iters} iterations at batch 64" in first
    for recipe in ("original", "paper", "rope", "lookhere"):
        cfg = get_config(name, [f"model.backbone.net.recipe={recipe}"])
        (tmp_path / recipe).mkdir()
        model, _ = instantiated_and_reloaded(cfg, tmp_path / recipe)
        net = model.backbone.net.net
        assert (net.depth, net.embed_dim, net.patch_size, net.window_size, tuple(net.global_blocks)) == \
            (depth, width, 16, 14, global_blocks)
        assert tuple(net.pretrain_hw) == (64, 64)
        assert ("cascade" in name) == (type(model.roi_heads).__name__ == "CascadeROIHeads")
    cfg = get_config(name)
    assert cfg.model.backbone.net.recipe == "original" and not cfg.model.backbone.net.pretrain_use_cls_token
    assert cfg.optimizer.params.lr_decay_rate == decay and cfg.train.init_checkpoint == weights
    assert cfg.train.max_iter == iters


def test_sam_recipe_loads_a_segment_anything_file_and_equals_its_encoder(tmp_path):
    """The B config by name, its trunk at the toy width (96, 4 blocks, global blocks 1 and 3), initialized through
    ``train.init_checkpoint`` from a whole SAM file (``image_encoder.`` + a mask-decoder key): every trunk tensor
    loads and the trunk equals segment-anything's encoder (before its neck) at 1024 px."""
    require("segment_anything")
    from segment_anything.modeling.image_encoder import ImageEncoderViT

    from tests.helpers import randomize

    torch.manual_seed(0)
    sam = randomize(ImageEncoderViT(img_size=1024, patch_size=16, embed_dim=96, depth=4, num_heads=3, out_chans=16,
                                    use_rel_pos=True, window_size=14, global_attn_indexes=(1, 3))).eval()
    whole = {f"image_encoder.{k}": v for k, v in sam.state_dict().items()}
    whole["mask_decoder.iou_token.weight"] = torch.zeros(1, 16)
    torch.save({"model": whole}, tmp_path / "sam_vit_b_01ec64.pth")
    model = _sam_b_toy_initialized_from(tmp_path / "sam_vit_b_01ec64.pth", "sam", [])
    x = torch.randn(1, 3, 1024, 1024)
    with torch.no_grad():
        ref = sam.patch_embed(x) + sam.pos_embed
        for blk in sam.blocks:
            ref = blk(ref)
        torch.testing.assert_close(model.backbone.net.net(x), ref.permute(0, 3, 1, 2), rtol=1e-4, atol=1e-4)


def test_sam_recipe_loads_a_transformers_sam_folder_and_equals_its_vision_encoder(tmp_path):
    """The same from transformers' ``SamModel.save_pretrained`` folder (``vision_encoder.*`` names, a prompt encoder
    and mask decoder beside it), at 256 px so that the whole model stays small: a grid of 16 x 16 tokens."""
    transformers = require("transformers")
    vision = transformers.SamVisionConfig(hidden_size=96, num_hidden_layers=4, num_attention_heads=3, image_size=256,
                                          patch_size=16, window_size=14, global_attn_indexes=[1, 3],
                                          output_channels=16, mlp_dim=384)
    torch.manual_seed(0)
    hf = transformers.SamModel(transformers.SamConfig(vision_config=vision.to_dict())).eval()
    _randomize(hf.vision_encoder)
    hf.save_pretrained(tmp_path / "sam-hub")
    model = _sam_b_toy_initialized_from(tmp_path / "sam-hub", "sam (Hugging Face transformers names)",
                                        ["model.backbone.net.img_size=256", "model.backbone.net.pretrain_img_size=256",
                                         "model.backbone.square_pad=256"])
    x = torch.randn(1, 3, 256, 256)
    with torch.no_grad():
        ref = hf.vision_encoder(x, output_hidden_states=True).hidden_states[-1].permute(0, 3, 1, 2)
        torch.testing.assert_close(model.backbone.net.net(x), ref, rtol=1e-4, atol=1e-4)


def _randomize(module):
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, 0.05)


def _sam_b_toy_initialized_from(path, source: str, overrides: list) -> torch.nn.Module:
    """The SAM-B config by name at the toy width (with ``overrides``), in eval mode, initialized from ``path``
    through ``train.init_checkpoint``; its report must name the ``source`` format and no missing tensor."""
    cfg = get_config(SAM[0], ["model.backbone.net.net=vitdet_toy", *overrides, *CPU_HEADS,
                              f"train.init_checkpoint={path}"])
    model = instantiate(cfg.model).eval()
    report = load_init_checkpoint(WinposCheckpointer(model), cfg.train.init_checkpoint)
    assert f"winpos importer ({source})" in report and " 0 missing" in report, report
    return model
