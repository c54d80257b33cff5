"""Run a LazyConfig model on image files and draw its predictions (what ``DefaultPredictor`` + ``demo.py`` do for
yacs configs, which detectron2 does not offer for LazyConfig). Drawings are made with PIL (``draw_instances``) or
with detectron2's ``Visualizer`` (``draw_with_visualizer``, ``drawer="detectron2"``). Videos and cameras:
``winpos.d2.video``.

Outputs follow winpos's output policy (``winpos.utils.outputs``): ``plan_outputs`` checks the output folder before any
work (not the folder of an input image, no existing output file unless ``force``, writable) and gives every input
its own drawing name (``a/x.png`` and ``b/x.png`` get ``x.png`` and ``x-2.png``). The outputs are complete or
absent (``winpos.utils.output_folders.staged_outputs``): the drawings and ``predictions.json`` are written into a
staging folder and moved into place when every image is done, so a run stopped half way (Ctrl-C, a full disk)
leaves the earlier outputs as they were; with ``force`` the earlier drawings the new ``predictions.json`` does not
list are removed. An image that cannot be read is skipped, counted and recorded with its error in
``predictions.json``; the other images are still predicted."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch
from detectron2.config import instantiate
from detectron2.data import transforms as T
import numpy as np
from PIL import Image, ImageDraw

from winpos.d2.own_data import config_class_names, config_datasets
from winpos.data.images import read_image  # 16-bit, palette, alpha with their real range (not detectron2's)
from winpos.errors import MissingInputError, WinposError
from winpos.utils.output_folders import staged_outputs
from winpos.utils.outputs import atomic_write, check_output_dir

__all__ = ["IMAGE_EXTS", "DRAWERS", "list_images", "drawing_names", "plan_outputs", "Predictor", "draw_instances",
           "draw_with_visualizer", "draw", "predict_images", "class_names", "mask_rle", "instances_record"]

logger = logging.getLogger(__name__)
IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")


def list_images(inputs) -> list[Path]:
    """Image files named by ``inputs`` (files, or folders searched non-recursively), sorted per folder."""
    found = []
    for item in [inputs] if isinstance(inputs, (str, os.PathLike)) else inputs:
        p = Path(item)
        if p.is_dir():
            found += sorted(f for f in p.iterdir() if f.suffix.lower() in IMAGE_EXTS)
        elif p.is_file():
            found.append(p)
        else:
            raise MissingInputError(f"--input {p} does not exist; pass image files or folders of images")
    if not found:
        raise WinposError(f"--input: no images ({', '.join(IMAGE_EXTS)}) found in {list(map(str, inputs))}")
    return found


def drawing_names(images) -> list[str]:
    """A distinct drawing file name per image: ``<stem>.png``, with ``-2``, ``-3``... added to later images whose
    stem was taken (two folders holding ``x.png``, or ``x.jpg`` next to ``x.png``)."""
    used, names = set(), []
    for path in images:
        stem = Path(path).stem
        name, n = f"{stem}.png", 1
        while name.lower() in used:
            n += 1
            name = f"{stem}-{n}.png"
        used.add(name.lower())
        names.append(name)
    return names


def plan_outputs(inputs, output_dir, force: bool = False) -> list[tuple[Path, Path]]:
    """``[(image, drawing path)]`` for ``inputs`` after checking ``output_dir`` (see module docstring)."""
    images = list_images(inputs)
    names = drawing_names(images)
    check_output_dir(output_dir, images, names + ["predictions.json"], force=force)
    return [(image, Path(output_dir) / name) for image, name in zip(images, names)]


class Predictor:
    """``predictor(path_or_rgb_array) -> Instances`` (on CPU, in original image coordinates).

    Args:
        cfg: the LazyConfig; its ``dataloader.test.mapper`` gives the test-time resize and the image format.
        model: the built model with weights loaded (``engine.build_model`` + ``load_init_checkpoint``).
    """

    def __init__(self, cfg, model):
        self.model = model.eval()
        mapper = instantiate(cfg.dataloader.test.mapper)
        self.augmentations = T.AugmentationList(list(mapper.augmentations.augs))
        self.image_format = mapper.image_format

    @torch.no_grad()
    def __call__(self, image):
        if isinstance(image, (str, os.PathLike)):
            image = read_image(str(image), format=self.image_format)
        h, w = image.shape[:2]
        aug = T.AugInput(image)
        self.augmentations(aug)
        tensor = torch.as_tensor(aug.image.transpose(2, 0, 1).copy())
        return self.model([{"image": tensor, "height": h, "width": w}])[0]["instances"].to("cpu")


def _color(i: int) -> tuple[int, int, int]:
    # well-separated hues by the golden angle
    h = (i * 0.618033988749895) % 1.0
    r, g, b = (np.clip(np.abs((h * 6 + k) % 6 - 3) - 1, 0, 1) for k in (0, 4, 2))
    return int(255 * r), int(255 * g), int(255 * b)


def draw_instances(rgb: np.ndarray, instances, class_names=None, alpha: float = 0.45) -> Image.Image:
    """``rgb (H, W, 3) uint8`` with each instance's mask tinted, its box outlined and ``class score`` written."""
    image = Image.fromarray(rgb).convert("RGBA")
    overlay = Image.new("RGBA", image.size, (0, 0, 0, 0))
    draw = ImageDraw.Draw(overlay)
    masks = instances.pred_masks.numpy() if instances.has("pred_masks") else None
    for i in range(len(instances)):
        cls, score = int(instances.pred_classes[i]), float(instances.scores[i])
        color = _color(cls)
        if masks is not None:
            tint = Image.new("RGBA", image.size, color + (int(255 * alpha),))
            overlay.paste(tint, (0, 0), Image.fromarray((masks[i] > 0).astype(np.uint8) * 255))
        x0, y0, x1, y1 = instances.pred_boxes.tensor[i].tolist()
        draw.rectangle([x0, y0, x1, y1], outline=color + (255,), width=2)
        name = class_names[cls] if class_names and cls < len(class_names) else str(cls)
        draw.text((x0 + 2, y0 + 1), f"{name} {score:.2f}", fill=(255, 255, 255, 255))
    return Image.alpha_composite(image, overlay).convert("RGB")


def draw_with_visualizer(rgb: np.ndarray, instances, class_names=None) -> Image.Image:
    """The same drawing made by detectron2's ``Visualizer`` (its colours, labels and mask outlines)."""
    from detectron2.data import Metadata
    from detectron2.utils.visualizer import Visualizer

    metadata = Metadata(thing_classes=list(class_names)) if class_names else Metadata()
    return Image.fromarray(Visualizer(rgb, metadata).draw_instance_predictions(instances).get_image())


DRAWERS = {"winpos": draw_instances, "detectron2": draw_with_visualizer}


def check_drawer(drawer: str) -> None:
    if drawer not in DRAWERS:
        raise WinposError(f"--drawer {drawer!r} is unknown; choose one of {', '.join(DRAWERS)}")


def draw(rgb: np.ndarray, instances, class_names=None, drawer: str = "winpos") -> Image.Image:
    """``rgb`` with ``instances`` drawn by ``drawer`` (a key of ``DRAWERS``)."""
    check_drawer(drawer)
    return DRAWERS[drawer](rgb, instances, class_names)


def instances_record(instances, names) -> dict:
    """``{"boxes" (XYXY px), "scores", "classes", "class_names", "masks" (COCO RLE, when predicted)}``."""
    classes = instances.pred_classes.tolist()
    record = {"boxes": instances.pred_boxes.tensor.tolist(), "scores": instances.scores.tolist(), "classes": classes,
              "class_names": [names[c] if names and c < len(names) else str(c) for c in classes]}
    if instances.has("pred_masks"):
        record["masks"] = [mask_rle(m > 0) for m in instances.pred_masks.numpy()]
    return record


def class_names(cfg) -> list[str] | None:
    """The class names of the config's datasets (registered metadata, or the embedded shapes' names), never by
    generating a dataset; None (with a warning: classes are drawn as ids) when none is known."""
    names = config_class_names(cfg)
    if names is None:
        datasets = ", ".join(n for _, n in config_datasets(cfg, ("test", "train"))) or "none"
        logger.warning(f"no class names for the drawings (the config's datasets: {datasets}, none registered); "
                       "classes are drawn as ids: pass --dataset NAME=JSON:IMAGE_ROOT for the test dataset")
    return names


def mask_rle(mask: np.ndarray) -> dict:
    """COCO run-length encoding ``{"size": [h, w], "counts": str}`` of a binary ``(H, W)`` mask (pycocotools)."""
    from pycocotools import mask as mask_utils

    rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    return {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")}


def predict_images(cfg, model, inputs, output_dir, score_thresh: float = 0.5, force: bool = False,
                   progress: bool = False, drawer: str = "winpos") -> list[dict]:
    """Predict every image of ``inputs``; write ``output_dir/<name>.png`` drawings (masks, boxes, class name and
    score above ``score_thresh``) and ``output_dir/predictions.json``. Returns the JSON records: ``{"file",
    "drawing", "boxes" (XYXY px), "scores", "classes", "class_names", "masks" (COCO RLE, when the model predicts
    masks)}`` per image, or ``{"file", "error"}`` for an image that could not be read. The output folder is checked
    first (``plan_outputs``; ``force`` replaces earlier outputs); ``progress``: a tqdm bar over the images;
    ``drawer``: ``"winpos"`` (PIL) or ``"detectron2"`` (its ``Visualizer``)."""
    check_drawer(drawer)  # before any work
    plan = plan_outputs(inputs, output_dir, force=force)
    predictor = Predictor(cfg, model)
    names = class_names(cfg)
    records = []
    planned = [out.name for _, out in plan] + ["predictions.json"]
    with staged_outputs(output_dir, planned, force=force, input_files=[p for p, _ in plan]) as (claim, staging):
        if force:  # an earlier run's drawings that this one does not make again go with its predictions.json
            claim.stale |= earlier_drawings(output_dir) - set(planned)
        for path, out in tqdm_if(progress, plan, desc="predict", unit="image"):
            try:
                rgb = read_image(str(path), format="RGB")
                image = rgb if predictor.image_format == "RGB" else read_image(str(path),
                                                                               format=predictor.image_format)
            except Exception as e:  # noqa: BLE001 - PIL raises several types for unreadable or foreign files
                logger.warning(f"skipped {path}: cannot read it as an image ({type(e).__name__}: {e})")
                records.append({"file": str(path), "error": f"cannot read it as an image ({type(e).__name__}: {e})"})
                continue
            instances = predictor(image)
            instances = instances[instances.scores >= score_thresh]
            drawing = draw(rgb, instances, names, drawer)
            atomic_write(staging / out.name, lambda f: drawing.save(f, format="PNG"), "wb")
            records.append({"file": str(path), "drawing": str(out), **instances_record(instances, names)})
        atomic_write(staging / "predictions.json", lambda f: json.dump(records, f, indent=1), "w")
    skipped = sum("error" in r for r in records)
    logger.info(f"wrote {len(records) - skipped} drawings to {output_dir}" + (f"; skipped {skipped} unreadable "
                                                                                f"images" if skipped else ""))
    return records


def tqdm_if(progress: bool, items, **kw):
    """``items`` under a tqdm bar when ``progress``."""
    if not progress:
        return items
    from tqdm import tqdm

    return tqdm(items, **kw)


def earlier_drawings(output_dir) -> set[str]:
    """The drawing names (in ``output_dir``) that its ``predictions.json`` lists; empty when there is none or it is
    not a list of winpos records."""
    path = Path(output_dir) / "predictions.json"
    try:
        records = json.loads(path.read_text())
    except (OSError, ValueError):
        return set()
    if not isinstance(records, list):
        return set()
    names = {Path(r["drawing"]).name for r in records if isinstance(r, dict) and isinstance(r.get("drawing"), str)}
    return {n for n in names if n.lower().endswith(".png")}


if __name__ == "__main__":  # a library module: name the command instead of exiting 0 having done nothing
    print("error: winpos.d2.predict is a library module, not a command; run winpos-predict (--help says how)",
          file=__import__("sys").stderr)
    raise SystemExit(2)
