"""Export a whole detector (a LazyConfig by name or path, plus its weights) to ONNX, ``.pt2`` and TorchScript, with
detectron2's deployment conventions: for ONNX and TorchScript the model is wrapped in
``detectron2.export.TracingAdapter``, which takes the image as one ``(3, H, W)`` tensor (the ``"image"`` field of
detectron2's input dict, pixel values in the config's input format) and returns the instances' fields flattened into
a tuple of tensors (boxes, classes, mask probabilities, scores, then the image size), as
``tools/deploy/export_model.py`` does for tracing: ``model.inference(inputs, do_postprocess=False)``, so boxes are
at the input's size and masks are the ROI heads' 28x28 probabilities, not pasted into the image.

``torch.export`` cannot take that inference (it branches in Python on how many boxes survive each filter), so the
``.pt2`` program is ``winpos.d2.export_program.ExportableRCNN``: the same inference without those branches, the same
outputs, the number of detections left dynamic. Where the detector pads every image to one square (ViTDet's
``square_pad``), the backbone always sees that square and the program takes any input size up to it (multiples of
the size divisibility); otherwise one program per size.

Export and checks are ``winpos.backbones.export``'s (reference attention, one graph per size where the grid
specializes it). Every artifact, the ``.pt2`` included, is run in its runtime and compared with detectron2's own
eager inference (the ``TracingAdapter``).
"""
from __future__ import annotations

import torch

from winpos.backbones.export import export_and_check, export_mode
from winpos.errors import WinposError

__all__ = ["DETECTOR_FORMATS", "DETECTOR_TOLERANCE", "build_detector", "detector_example", "export_detector"]

# Boxes are in pixels and pass RPN / ROI top-k and NMS: an ulp-level difference in the backbone reorders ties or
# moves a box by a fraction of a thousandth of a pixel (measured here: at most 8e-6 for the shapes detectors).
DETECTOR_TOLERANCE = 1e-3


def build_detector(config: str, checkpoint: str | None, overrides=(), random_weights: bool = False):
    """The detector of ``config`` on the CPU in eval mode, with ``checkpoint``'s weights (default: the config's
    ``train.init_checkpoint``) or, with ``random_weights``, none on purpose (the config's init is not loaded either);
    returns ``(cfg, model)``."""
    from winpos.d2.checkpoint import WinposCheckpointer, load_init_checkpoint
    from winpos.d2.config import load_config
    from winpos.d2.engine import build_model

    cfg = load_config(config, list(overrides) + ["train.device=cpu"])
    if checkpoint and random_weights:
        raise WinposError(f"--random-weights and --checkpoint {checkpoint} were both given; drop one of them")
    if not random_weights:  # the config's train.init_checkpoint (a COCO config's pretrained trunk) unless untrained
        checkpoint = checkpoint or cfg.train.init_checkpoint
    if not checkpoint and not random_weights:
        raise WinposError("no weights: pass --checkpoint (or set train.init_checkpoint=...), or --random-weights to "
                          "export the untrained detector on purpose")
    model = build_model(cfg)
    if checkpoint:
        load_init_checkpoint(WinposCheckpointer(model), checkpoint)
    return cfg, model.eval()


def detector_example(seed: int = 0):
    """``size -> (3, H, W)`` float images with pixel values in [0, 255] (a new one per call)."""
    generator = torch.Generator().manual_seed(seed)
    return lambda size: torch.rand(3, *size, generator=generator) * 255


def _adapter(model, example_image):
    from detectron2.export import TracingAdapter
    from detectron2.modeling import GeneralizedRCNN

    if not isinstance(model, GeneralizedRCNN):
        raise WinposError(f"the config's model is a {type(model).__name__}; winpos-export exports detectron2's "
                          "GeneralizedRCNN detectors (Mask R-CNN, Cascade): export the backbone instead "
                          "(winpos-export backbone PRESET)")

    def inference(model, inputs):
        instances = model.inference(inputs, do_postprocess=False)[0]  # boxes at the input size, ROI mask logits
        return [{"instances": instances}]

    return TracingAdapter(model, [{"image": example_image}], inference)


DETECTOR_FORMATS = ("onnx", "pt2", "torchscript")


def export_detector(model, stem: str, sizes, formats=DETECTOR_FORMATS, opset: int = 17,
                    tolerance: float = DETECTOR_TOLERANCE):
    """``export_and_check`` of ``TracingAdapter(model)`` (``ExportableRCNN(model)`` for ``.pt2``) on random images
    of each size, every artifact checked against the ``TracingAdapter``'s eager outputs."""
    from winpos.d2.export_program import ExportableRCNN, nms_any_count, padded_size

    example = detector_example()
    stride = int(getattr(model.backbone, "size_divisibility", 0) or 32)
    for h, w in sizes:
        if h % stride or w % stride:
            raise WinposError(f"--sizes {h}x{w} is not a multiple of the detector's size divisibility {stride}; "
                              f"use e.g. {-(-h // stride) * stride}x{-(-w // stride) * stride}")
        padded_size(h, w, model.backbone.size_divisibility, model.backbone.padding_constraints)  # too large: refused
    square = (model.backbone.padding_constraints or {}).get("square_size", 0)
    with export_mode():
        adapter = _adapter(model, example(tuple(sizes[0]))).eval()
        exported = {"pt2": ExportableRCNN(model).eval()} if "pt2" in formats else {}
    with nms_any_count():
        return export_and_check(adapter, stem, sizes, formats, example=example, stride=stride, opset=opset,
                                tolerance=tolerance, exported=exported, max_side=square or 4096)
