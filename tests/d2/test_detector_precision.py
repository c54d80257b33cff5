"""Mixed precision on a whole Mask R-CNN (the shapes configs of both families): the losses of one training step under
bf16 and fp16 autocast against float32 from the same weights and batch, then WinposTrainer steps in each precision
(fp16 with its GradScaler) leaving finite float32 weights that moved, and an evaluation under autocast
(``train.amp.eval``) giving the float32 evaluation's detections up to rounding.

The backbone-level dtype matrix (every recipe, forward and backward) is tests/backbones/test_dtype_matrix.py."""
import itertools

import pytest
import torch
from detectron2.config import instantiate
from detectron2.utils.events import EventStorage

from tests.d2.test_configs import CONFIGS, _synthetic_batch
from winpos.d2.config import load_config
from winpos.d2.train_loop import WinposTrainer, eval_autocast

PATHS = [CONFIGS / "shapes" / f"mask_rcnn_{family}_toy_{recipe}.py"
         for family, recipe in (("vitdet", "rope"), ("hieradet", "paper"), ("hieradet", "lookhere"))]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# relative error of the summed loss against float32: measured up to 1.3e-2 (bf16) and 1.4e-3 (fp16) on these configs
LOSS_BOUND = {"bf16": 5e-2, "fp16": 1e-2}


def _model(path):
    cfg = load_config(path, ["model.backbone.square_pad=128"])
    torch.manual_seed(0)
    return cfg, instantiate(cfg.model).train()


def _losses(model, batch, dtype=None):
    torch.manual_seed(1)  # the same proposal and RoI sampling draws
    with EventStorage(0), torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        return {k: v.float() for k, v in model(batch).items()}


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_losses_under_autocast_close_to_fp32(path):
    _, model = _model(path)
    torch.manual_seed(2)
    batch = _synthetic_batch(n=2)
    ref = _losses(model, batch)
    for name, dtype in DTYPES.items():
        low = _losses(model, batch, dtype)
        assert low.keys() == ref.keys()
        assert all(torch.isfinite(v) for v in low.values()), (name, low)
        total, want = sum(low.values()), sum(ref.values())
        err = (abs(total - want) / want).item()
        print(f"{path.stem} {name}: summed loss {total.item():.5f} vs fp32 {want.item():.5f} (relative {err:.2e})")
        assert err < LOSS_BOUND[name], (name, err)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("path", PATHS[:2], ids=[p.stem for p in PATHS[:2]])
def test_trainer_steps_in_each_precision(path, precision):
    cfg, model = _model(path)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg.optimizer.params.model = model
    optimizer = instantiate(cfg.optimizer)
    torch.manual_seed(2)
    data = itertools.repeat(_synthetic_batch(n=2))
    trainer = WinposTrainer(model, data, optimizer, amp=True, precision=precision)
    assert (trainer.grad_scaler is not None) == (precision == "fp16")
    with EventStorage(0) as trainer.storage:
        for trainer.iter in range(2):
            trainer.run_step()
    moved = 0
    for n, p in model.named_parameters():
        assert p.dtype == torch.float32 and torch.isfinite(p).all(), n
        moved += int(not torch.equal(p, start[n]))
    assert moved > len(start) // 2, f"only {moved} of {len(start)} parameters changed in two steps"
    if trainer.grad_scaler is not None:
        assert 0 < trainer.grad_scaler.get_scale() < float("inf")


def test_evaluation_under_autocast_matches_fp32_detections():
    cfg, model = _model(PATHS[1])
    model.eval()
    image = {"image": torch.randint(0, 255, (3, 128, 128), generator=torch.Generator().manual_seed(4)).float(),
             "height": 128, "width": 128}
    cfg.model.roi_heads.box_predictor.test_score_thresh = 0.0
    with torch.no_grad():
        ref = model([image])[0]["instances"]
        for precision in ("bf16", "fp16"):
            cfg.train.amp = dict(enabled=True, precision=precision, eval=True)
            with eval_autocast(cfg, model):
                low = model([image])[0]["instances"]
            assert len(low) > 0 and torch.isfinite(low.pred_boxes.tensor).all()
            # the top detection is the same box up to rounding (NMS and top-k may reorder the tail)
            torch.testing.assert_close(low.pred_boxes.tensor[0].float(), ref.pred_boxes.tensor[0],
                                       atol=2.0, rtol=0)
    cfg.train.amp = dict(enabled=True, precision="float16", eval=True)
    with eval_autocast(cfg, model):
        assert torch.get_autocast_dtype("cpu") == torch.float16  # the alias evaluates in fp16, not bf16
    cfg.train.amp = dict(enabled=True, precision="fp8", eval=True)
    with pytest.raises(Exception, match="choose 'bf16'"):
        eval_autocast(cfg, model)
