"""One's own COCO-format data in the tools: the class names a config's datasets have, and the class count of its
model checked against them before any work.

``dataset_classes(name)`` reads the class names of a registered dataset from its metadata, or of the embedded
shapes datasets from ``winpos.data.shapes`` (never by generating the data). ``check_num_classes(cfg)`` sets
``model.roi_heads.num_classes`` from the datasets when the config leaves it unset (None), and refuses a count that
differs from theirs in one line that names the override to add: with too few classes training would treat the
extra categories as background, with too many the evaluation stops at the end with detectron2's assertion.

``check_dataset_content(cfg)`` fits the config to what the registered data holds (``winpos.d2.data.register_coco``
records it): RLE masks make the training mapper use detectron2's ``bitmask`` format (its ``polygon`` format
cannot hold them), and a mask model on data without masks is refused for training (evaluated on boxes only).
``record_datasets(cfg, output_dir, resume)`` keeps the SHA-256 of each dataset's json in the run folder, and
refuses a resume whose dataset of the same name is another file.
"""
from __future__ import annotations

from omegaconf import OmegaConf

from winpos.errors import WinposError

__all__ = ["dataset_classes", "config_datasets", "check_num_classes", "config_class_names", "check_dataset_content",
           "record_datasets", "DATASETS_FILE"]

_SHAPES = {"shapes_train", "shapes_val"}
_SHAPES_ONE_CLASS = {"shapes1_train", "shapes1_val"}


def dataset_classes(name: str) -> list[str] | None:
    """Class names of dataset ``name`` (contiguous-id order), or None when it is neither registered nor embedded."""
    from detectron2.data import DatasetCatalog, MetadataCatalog

    if name in DatasetCatalog.list():
        classes = MetadataCatalog.get(name).get("thing_classes", None)
        if classes is not None:
            return list(classes)
    if name in _SHAPES:
        from winpos.data.scenes import SHAPE_CLASSES

        return list(SHAPE_CLASSES)
    if name in _SHAPES_ONE_CLASS:
        return ["shape"]
    return None


def config_datasets(cfg, which=("train", "test")) -> list[tuple[str, str]]:
    """``[(key, dataset name)]`` of the config's ``dataloader.<which>.dataset.names``."""
    out = []
    for split in which:
        names = OmegaConf.select(cfg, f"dataloader.{split}.dataset.names", default=None)
        for name in [names] if isinstance(names, str) else list(names or []):
            out.append((f"dataloader.{split}.dataset.names", str(name)))
    return out


def config_class_names(cfg) -> list[str] | None:
    """Class names for drawing the predictions of ``cfg``'s model: those of its test (else train) dataset."""
    for _, name in config_datasets(cfg, ("test", "train")):
        classes = dataset_classes(name)
        if classes is not None:
            return classes
    return None


def check_num_classes(cfg, which=("train", "test")) -> int | None:
    """Check ``model.roi_heads.num_classes`` against the classes of the config's datasets (``which`` splits);
    unset (None) takes their count. Returns the count in force (None: no roi_heads, or no dataset known here).

    Raises WinposError when the datasets disagree with each other or with the model, naming the override.
    """
    if OmegaConf.select(cfg, "model.roi_heads", default=None) is None:
        return None
    known = [(key, name, dataset_classes(name)) for key, name in config_datasets(cfg, which)]
    known = [(key, name, classes) for key, name, classes in known if classes is not None]
    if not known:
        return OmegaConf.select(cfg, "model.roi_heads.num_classes", default=None)
    key0, name0, classes0 = known[0]
    for key, name, classes in known[1:]:
        if len(classes) != len(classes0):
            raise WinposError(f"{key0}={name0} has {len(classes0)} classes but {key}={name} has {len(classes)}; "
                              "train and evaluate on datasets with the same categories")
    count = OmegaConf.select(cfg, "model.roi_heads.num_classes", default=None)
    shown = ", ".join(classes0[:8]) + (", ..." if len(classes0) > 8 else "")
    if count is None:
        cfg.model.roi_heads.num_classes = len(classes0)
        return len(classes0)
    if int(count) != len(classes0):
        raise WinposError(f"model.roi_heads.num_classes={count} but dataset {name0} has {len(classes0)} classes "
                          f"({shown}); add the override model.roi_heads.num_classes={len(classes0)} (after the flags)")
    return int(count)


def _metadata(name: str):
    from detectron2.data import DatasetCatalog, MetadataCatalog

    return MetadataCatalog.get(name) if name in DatasetCatalog.list() else None


def _has_mask_head(cfg) -> bool:
    return OmegaConf.select(cfg, "model.roi_heads.mask_head", default=None) is not None


def check_dataset_content(cfg, which=("train", "test")) -> None:
    """Fit ``cfg`` to its registered datasets (see the module docstring); the embedded shapes and datasets
    registered without winpos (no such metadata) are left as they are."""
    import logging

    log = logging.getLogger(__name__)
    for key, name in config_datasets(cfg, which):
        meta = _metadata(name)
        if meta is None or meta.get("has_masks", None) is None:
            continue
        split = key.split(".")[1]
        if _has_mask_head(cfg) and not meta.get("has_masks"):
            if split == "train":
                raise WinposError(f"dataset {name} has no segmentation, but the config's model predicts masks (Mask "
                                  "R-CNN); add segmentations to the json, or train boxes only: "
                                  "model.roi_heads.mask_in_features=None model.roi_heads.mask_pooler=None "
                                  "model.roi_heads.mask_head=None")
            if OmegaConf.select(cfg, "dataloader.evaluator", default=None) is not None:
                cfg.dataloader.evaluator.tasks = ["bbox"]
                log.warning(f"dataset {name} has no segmentation: evaluating boxes only (no mask AP)")
        mapper = OmegaConf.select(cfg, f"dataloader.{split}.mapper", default=None)
        if split == "train" and meta.get("has_rle_masks") and mapper is not None \
                and mapper.get("instance_mask_format", "polygon") != "bitmask":
            mapper.instance_mask_format = "bitmask"
            log.info(f"dataset {name} has RLE masks: the training mapper uses detectron2's bitmask format")


DATASETS_FILE = "datasets.json"  # in a run folder: {name: {"json": path, "sha256": hex}} of the data it trained on


def record_datasets(cfg, output_dir, resume: bool = False) -> dict:
    """Write ``output_dir/datasets.json`` (the json file and SHA-256 of each registered dataset of ``cfg``); on a
    resume, first refuse (one line) a dataset whose name the run recorded with another file's SHA-256. Returns
    what was recorded."""
    import json
    import os
    from pathlib import Path

    from winpos.utils.outputs import atomic_write_json

    now = {}
    for _, name in config_datasets(cfg):
        meta = _metadata(name)
        if meta is not None and meta.get("json_sha256", None):
            now[name] = {"json": meta.get("source_json_file", meta.get("json_file", "")), "sha256": meta.json_sha256}
    path = os.path.join(output_dir, DATASETS_FILE)
    before = {}
    if resume and os.path.isfile(path):
        try:
            before = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            before = {}
        for name, entry in now.items():
            was = before.get(name) if isinstance(before, dict) else None
            if isinstance(was, dict) and was.get("sha256") not in (None, entry["sha256"]):
                raise WinposError(f"--resume: dataset {name} is now {entry['json']} (SHA-256 {entry['sha256'][:12]}), "
                                  f"but the run in {output_dir} trained on {was.get('json')} "
                                  f"({str(was.get('sha256'))[:12]}); resume with that json, or start a new run "
                                  "(another train.output_dir, or --force)")
    recorded = {**(before if isinstance(before, dict) else {}), **now}
    if recorded:
        atomic_write_json(path, recorded)
    return recorded
