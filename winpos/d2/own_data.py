"""One's own COCO-format data in the tools: the class names a config's datasets have, and the class count of its
model checked against them before any work.

``dataset_classes(name)`` reads the class names of a registered dataset from its metadata, or of the embedded
shapes datasets from ``winpos.data.shapes`` (never by generating the data). ``check_num_classes(cfg)`` sets
``model.roi_heads.num_classes`` from the datasets when the config leaves it unset (None), and refuses a count that
differs from theirs in one line that names the override to add: with too few classes training would treat the
extra categories as background, with too many the evaluation stops at the end with detectron2's assertion.
"""
from __future__ import annotations

from omegaconf import OmegaConf

from winpos.errors import WinposError

__all__ = ["dataset_classes", "config_datasets", "check_num_classes", "config_class_names"]

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
        from winpos.data.shapes import SHAPE_CLASSES

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
