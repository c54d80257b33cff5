"""``ExportableRCNN``, a detector's ``.pt2`` form, against detectron2's own inference (``TracingAdapter`` around
``model.inference(..., do_postprocess=False)``), and its ``torch.export`` program on images with no, one and many
detections, at fixed and at dynamic sizes."""
import importlib.util
import io

import pytest
import torch

from tests.conftest import require
from winpos.errors import WinposError

require("detectron2")

from winpos.backbones.export import export_mode  # noqa: E402
from winpos.d2.export import _adapter, build_detector, detector_example  # noqa: E402
from winpos.d2.export_program import ExportableRCNN, nms_any_count, padded_size  # noqa: E402

MANY = ["model.roi_heads.box_predictor.test_score_thresh=0.0", "model.roi_heads.box_predictor.test_topk_per_image=500"]
NONE = ["model.roi_heads.box_predictor.test_score_thresh=0.99"]


def _same(ours, theirs):
    """Equal field by field: the same ops on the same numbers, so bit-identical."""
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert torch.equal(a, b)


def _detector(config, overrides=()):
    torch.manual_seed(0)
    _, model = build_detector(config, None, list(overrides), random_weights=True)
    return model


@pytest.mark.parametrize("config,overrides", [
    ("shapes/mask_rcnn_vitdet_toy_rope.py", []),
    ("shapes/mask_rcnn_hieradet_toy_paper.py", MANY),
    ("shapes/mask_rcnn_vitdet_toy_abs_relpos.py", MANY),
    ("shapes/mask_rcnn_hieradet_toy_lookhere.py", NONE),
    ("shapes/mask_rcnn_vitdet_toy_abswin.py", ["model.backbone.square_pad=0"]),  # size divisibility only
])
def test_the_exportable_form_computes_detectron2s_inference(config, overrides):
    model = _detector(config, overrides)
    example = detector_example()
    counts = []
    with export_mode():
        adapter, ours = _adapter(model, example((64, 96))), ExportableRCNN(model).eval()
        for size in [(64, 96), (128, 128), (96, 224)]:
            x = example(size)
            theirs = adapter(x)
            assert len(theirs) == 5  # boxes, classes, masks, scores, image size
            _same(ours(x), theirs)
            counts.append(theirs[0].shape[0])
    if overrides == MANY:
        assert min(counts) > 100  # NMS per class over hundreds of candidates
    if overrides == NONE:
        assert counts == [0, 0, 0]


def test_a_box_only_detector_returns_the_adapters_four_outputs():
    model = _detector("shapes/mask_rcnn_hieradet_toy_rope.py")
    model.roi_heads.mask_on = False  # detectron2 skips the mask branch, so the instances have no pred_masks
    example = detector_example()
    with export_mode():
        adapter, ours = _adapter(model, example((64, 96))), ExportableRCNN(model).eval()
        for size in [(64, 96), (128, 128)]:
            x = example(size)
            theirs = adapter(x)
            assert len(theirs) == 4
            _same(ours(x), theirs)


def _cascade_detector():
    """The shapes ViTDet detector with the COCO configs' cascade box heads (three stages), sized for its
    64-channel pyramid."""
    from detectron2.config import instantiate
    from winpos.d2.config import load_config
    from winpos.utils.config_names import config_root

    spec = importlib.util.spec_from_file_location("cascade", config_root() / "common" / "models" / "cascade.py")
    cascade = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cascade)
    cfg = load_config("shapes/mask_rcnn_vitdet_toy_rope.py", ["train.device=cpu"])
    cascade.to_cascade(cfg.model)
    for head in cfg.model.roi_heads.box_heads:
        head.input_shape.channels, head.conv_dims, head.fc_dims = 64, [32], [64]
    for predictor in cfg.model.roi_heads.box_predictors:
        predictor.input_shape.channels = 64
    cfg.model.roi_heads.num_classes = 3
    torch.manual_seed(0)
    return instantiate(cfg.model).eval()


def test_cascade_heads_average_the_stages_as_detectron2_does():
    from detectron2.modeling.roi_heads import CascadeROIHeads

    model = _cascade_detector()
    assert isinstance(model.roi_heads, CascadeROIHeads)
    example = detector_example()
    with export_mode():
        adapter, ours = _adapter(model, example((64, 96))), ExportableRCNN(model).eval()
        assert ours.cascade
        for size in [(64, 96), (128, 128)]:
            x = example(size)
            _same(ours(x), adapter(x))


def _threshold_between(model, images):
    """A score threshold some images pass and some do not (the images' best scores differ)."""
    with export_mode():
        adapter = _adapter(model, images[0])
        best = sorted(float(adapter(x)[3].max()) for x in images)
    return (best[0] + best[-1]) / 2


@pytest.mark.parametrize("dynamic", [False, True])
def test_the_pt2_program_takes_no_one_or_many_detections(dynamic):
    """Exported on one image, run from its saved bytes on others: some with no detection at all, where an NMS
    keeps nothing or one box (torchvision's own shape rule would fail there)."""
    model = _detector("shapes/mask_rcnn_vitdet_toy_rope.py")
    example = detector_example(seed=1)
    images = [example((64, 96)) for _ in range(5)] + [torch.zeros(3, 64, 96), torch.full((3, 64, 96), 128.0)]
    model.roi_heads.box_predictor.test_score_thresh = _threshold_between(model, images)
    with export_mode():
        adapter = _adapter(model, images[0])
        counts = [adapter(x)[0].shape[0] for x in images]
        assert min(counts) == 0 and max(counts) > 0
        shapes = None
        if dynamic:
            h, w = torch.export.Dim("h", min=1, max=8), torch.export.Dim("w", min=1, max=8)
            shapes = ({1: 32 * h, 2: 32 * w},)
        with torch.enable_grad(), nms_any_count():
            program = torch.export.export(ExportableRCNN(model).eval(), (images[counts.index(max(counts))],),
                                          dynamic_shapes=shapes)
        buf = io.BytesIO()
        torch.export.save(program, buf)
        loaded = torch.export.load(io.BytesIO(buf.getvalue())).module()
        for x in images:
            out, ref = loaded(x), adapter(x)
            assert [o.shape for o in out] == [r.shape for r in ref]
            assert all(torch.allclose(o.float(), r.float(), atol=1e-4, rtol=0) for o, r in zip(out, ref))
        if dynamic:
            for size in [(128, 128), (32, 256)]:
                x = example(size)
                out, ref = loaded(x), adapter(x)
                assert [o.shape for o in out] == [r.shape for r in ref]
                assert all(torch.allclose(o.float(), r.float(), atol=1e-4, rtol=0) for o, r in zip(out, ref))


def test_torchvisions_nms_rule_comes_back_after_the_export():
    from torch._library.simple_registry import singleton

    holder = singleton.find("torchvision::nms").fake_impl
    before = holder.kernel.func
    with nms_any_count():
        assert holder.kernel.func is not before
    assert holder.kernel.func is before


@pytest.mark.parametrize("h,w", [(64, 96), (96, 64), (100, 70), (256, 256), (33, 1)])
@pytest.mark.parametrize("divisibility,square", [(32, 0), (16, 0), (32, 256), (0, 0)])
def test_padded_size_is_imagelists(h, w, divisibility, square):
    from detectron2.structures import ImageList

    constraints = {"size_divisibility": divisibility, "square_size": square}
    images = ImageList.from_tensors([torch.zeros(3, h, w)], divisibility, padding_constraints=constraints)
    assert padded_size(h, w, divisibility, constraints) == tuple(images.tensor.shape[-2:])


def test_an_image_larger_than_the_square_padding_is_refused_not_cropped():
    with pytest.raises(WinposError, match="larger than the detector's square padding 256x256.*up to 256x256"):
        padded_size(288, 64, 32, {"square_size": 256})


def test_a_detector_the_pt2_form_does_not_compute_is_refused_naming_the_formats_that_work():
    model = _detector("shapes/mask_rcnn_vitdet_toy_rope.py")
    model.roi_heads.keypoint_on = True
    with pytest.raises(WinposError, match="a keypoint head.*--formats onnx,torchscript"):
        ExportableRCNN(model)
    with pytest.raises(WinposError, match="GeneralizedRCNN"):
        ExportableRCNN(model.backbone)
