"""Datasets and loaders for detectron2: registration helpers and a resumable, reproducible training loader.

Registration: ``register_coco`` registers a COCO json after ``winpos.data.validate_coco_json`` (bad entries
counted and skipped); ``register_shapes`` / ``register_shapes_one_class`` the embedded shapes data.
``get_dataset_dicts`` is a drop-in for detectron2's ``get_detection_dataset_dicts`` that first registers the embedded ``shapes_*`` (and one-class ``shapes1_*``) datasets when a config names them, so a
LazyConfig needs no registration code and works in every process (``launch`` workers, a reloaded ``config.yaml``).

Training loader: ``build_resumable_train_loader`` draws sample ``p`` of an endless stream (epoch ``p // N``,
shuffled by a permutation seeded by ``(seed, epoch)``), and runs the mapper with numpy / ``random`` seeded by
``(seed, p)``. Iteration ``i`` on rank ``r`` of ``w`` reads stream positions ``i * B + r * B / w + j``. So the
batches of iteration ``i`` (images *and* augmentations) are a function of ``(seed, i)`` only: a run resumed at
iteration ``i`` (``start_iter=i``) sees exactly the data an uninterrupted run would, whatever ``num_workers``.
Batches are not grouped by aspect ratio: LSJ crops and pads every image to one square size anyway.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import logging
import random

import numpy as np
import torch
import torch.utils.data as torchdata
from detectron2.data import DatasetCatalog, DatasetFromList, DatasetMapper, get_detection_dataset_dicts
from detectron2.data import detection_utils
from detectron2.data import transforms as T
from detectron2.utils import comm

from winpos.data.images import read_image
from winpos.errors import WinposError

__all__ = ["register_coco", "register_shapes", "register_shapes_one_class", "ensure_registered", "get_dataset_dicts",
           "build_lsj_mapper", "WinposDatasetMapper",
           "build_test_mapper", "StreamDataset", "IterationBatchSampler", "build_resumable_train_loader"]

logger = logging.getLogger(__name__)
SHAPES_NAMES = ("shapes_train", "shapes_val")
SHAPES_ONE_CLASS_NAMES = ("shapes1_train", "shapes1_val")


def register_coco(name: str, json_file, image_root, on_error: str = "skip", metadata: dict | None = None,
                  check_images: bool = True, cache_dir=None):
    """Validate a COCO json (``winpos.data.validate_coco_json``), then register ``name`` in detectron2's
    DatasetCatalog and MetadataCatalog from its cleaned records; returns the ``ValidationReport``.

    Like ``detectron2.data.datasets.register_coco_instances``, but ``on_error="skip"`` drops and counts bad
    entries (``"raise"`` stops), and when entries were skipped both the loader and the evaluator (metadata
    ``json_file``) read the cleaned json (``winpos.data.cleaned_json_file``: ``<cache_dir>/cleaned/<name>-<hash>.json``,
    ``cache_dir`` defaulting to $WINPOS_DATA or ~/.cache/winpos); ``source_json_file`` keeps the original path.
    Registering a name again replaces it. Metadata: thing_classes (by category id),
    thing_dataset_id_to_contiguous_id, json_file, image_root, evaluator_type="coco", json_sha256 (of the source
    json), has_masks and has_rle_masks (``winpos.d2.own_data.check_dataset_content`` reads them), plus
    ``metadata``.
    """
    from detectron2.data import MetadataCatalog
    from detectron2.data.datasets import load_coco_json

    from winpos.data.coco import cleaned_json_file, validate_coco_json

    if not isinstance(name, str) or not name:
        raise WinposError(f"dataset name must be a non-empty string, got {name!r}")
    report = validate_coco_json(json_file, image_root, on_error=on_error, check_images=check_images)
    cleaned = cleaned_json_file(report, name, json_file, cache_dir)
    if name in DatasetCatalog.list():
        DatasetCatalog.remove(name)
    if name in MetadataCatalog.list():
        MetadataCatalog.remove(name)
    DatasetCatalog.register(name, functools.partial(load_coco_json, str(cleaned), str(image_root), name))
    cats = sorted(report.dataset["categories"], key=lambda c: c["id"])
    MetadataCatalog.get(name).set(
        thing_classes=[c["name"] for c in cats],
        thing_dataset_id_to_contiguous_id={c["id"]: i for i, c in enumerate(cats)},
        json_file=str(cleaned), image_root=str(image_root), evaluator_type="coco",
        source_json_file=str(json_file), json_sha256=report.sha256, has_masks=report.has_masks,
        has_rle_masks=report.has_rle, **copy.deepcopy(metadata or {}))
    return report


def register_shapes(root=None, **params) -> dict:
    """Generate (once, cached) and register the embedded shapes dataset as ``shapes_train`` / ``shapes_val``.

    ``root`` and ``params`` go to ``winpos.data.ensure_shapes_dataset``; the generator's output is validated with
    ``on_error="raise"``. Returns ``{name: (json_path, image_root)}``.
    """
    from winpos.data.shapes import ensure_shapes_dataset

    paths = ensure_shapes_dataset(root, **params)
    for name, (json_path, image_root) in paths.items():
        register_coco(name, json_path, image_root, on_error="raise")
    _SHAPES_REGISTERED[SHAPES_NAMES] = _record(root, params)
    return paths


def register_shapes_one_class(root=None, **params):
    """Register ``shapes1_train`` / ``shapes1_val``: the shapes images with every object in one class, "shape".

    Detection without shape classification: what a from-scratch tiny model learns within a CPU test budget
    (telling the four outlines apart takes far longer). The one-class json is written once next to the
    four-class one (``winpos.data.one_class_json``). Returns ``{name: (json_path, image_root)}``.
    """
    from winpos.data.shapes import ensure_shapes_dataset, one_class_json

    out = {}
    for name, (json_path, image_root) in ensure_shapes_dataset(root, **params).items():
        one = one_class_json(json_path)
        new_name = name.replace("shapes_", "shapes1_")
        register_coco(new_name, one, image_root, on_error="raise")
        out[new_name] = (one, image_root)
    _SHAPES_REGISTERED[SHAPES_ONE_CLASS_NAMES] = _record(root, params)
    return out


_SHAPES_REGISTERED: dict = {}  # (train name, val name) -> the generator parameters they were registered from


def _record(root, params) -> dict:
    """The generator parameters a registration stands for (``root`` only when given)."""
    out = dict(params)
    root = out.pop("root", None) if root is None else root
    if root is not None:
        out["root"] = str(root)
    return out


def _plain(shapes) -> dict:
    from omegaconf import DictConfig, OmegaConf

    return dict(OmegaConf.to_container(shapes) if isinstance(shapes, DictConfig) else shapes)


def ensure_registered(names, shapes: dict | None = None) -> list[str]:
    """Register the embedded ``shapes_*`` datasets if named and missing; raise for any other unknown name.

    ``shapes``: parameters for ``winpos.data.ensure_shapes_dataset`` (``root``, ``train_images``, ...). Names
    registered here from other parameters are registered again from these (the first registration used to win,
    so a test loader whose dict differed from the training loader's evaluated the training loader's split); no
    ``shapes`` means the generator's defaults. A direct ``register_shapes`` call is recorded the same way.
    Returns the names as a list.
    """
    names = [names] if isinstance(names, str) else list(names)
    if not names:
        raise WinposError("no dataset names given; set dataloader.train.dataset.names (e.g. 'shapes_train')")
    for pair, register in ((SHAPES_NAMES, register_shapes), (SHAPES_ONE_CLASS_NAMES, register_shapes_one_class)):
        if not any(n in pair for n in names):
            continue
        params = _record(None, _plain(shapes or {}))  # no dict: the generator's defaults
        held = _SHAPES_REGISTERED.get(pair)
        registered = set(DatasetCatalog.list())
        if any(n not in registered for n in pair) or (held is not None and held != params):
            # missing, or registered from other generator parameters than this loader states (e.g. a test
            # loader whose shapes dict differs from the training loader's): these names mean these parameters
            if held is not None and held != params:
                logger.info(f"{', '.join(pair)}: registered again from {params} (were {held})")
            register(**params)  # register_coco replaces a name's catalog entries; register_* records params
    registered = set(DatasetCatalog.list())
    missing = [n for n in names if n not in registered]
    if missing:
        raise WinposError(
            f"dataset(s) {missing} are not registered; register them before training with "
            "winpos.d2.data.register_coco(name, json_file, image_root) (or winpos-train --dataset "
            "NAME=JSON:IMAGE_ROOT), or use the embedded 'shapes_train' / 'shapes_val' (one-class: 'shapes1_*')")
    return names


def get_dataset_dicts(names, filter_empty: bool = True, shapes: dict | None = None, **kwargs) -> list[dict]:
    """``get_detection_dataset_dicts(names, filter_empty, **kwargs)`` after ``ensure_registered(names, shapes)``.

    A dataset left with no usable image (every entry bad, or none with annotations when ``filter_empty``) raises a
    WinposError naming it, instead of detectron2's bare assertion.
    """
    names = ensure_registered(names, shapes)
    try:
        return get_detection_dataset_dicts(names, filter_empty=filter_empty, **kwargs)
    except AssertionError as e:
        from winpos.errors import WinposError

        raise WinposError(f"dataset {names} has no usable images ({e}); every entry was dropped as bad or has no "
                          "annotations: fix the json (the registration warning lists the problems) or choose "
                          "another dataset") from e


class WinposDatasetMapper(DatasetMapper):
    """detectron2's ``DatasetMapper`` reading each image with ``winpos.data.images.read_image``: 16-bit, palette and
    alpha images with their real range, EXIF orientation applied, other modes refused naming the file and mode
    (detectron2's reader clips 16-bit values at 255: a white image). Instance annotations only."""

    def __call__(self, dataset_dict):
        dataset_dict = copy.deepcopy(dataset_dict)
        if "sem_seg_file_name" in dataset_dict or self.proposal_topk is not None:
            raise WinposError("WinposDatasetMapper maps instance annotations only; semantic segmentation and "
                              "precomputed proposals need detectron2's DatasetMapper")
        image = read_image(dataset_dict["file_name"], format=self.image_format)
        detection_utils.check_image_size(dataset_dict, image)
        aug_input = T.AugInput(image)
        transforms = self.augmentations(aug_input)
        image = aug_input.image  # (H, W, 3) -> (3, H, W) below
        dataset_dict["image"] = torch.as_tensor(np.ascontiguousarray(image.transpose(2, 0, 1)))
        if not self.is_train:
            dataset_dict.pop("annotations", None)
        elif "annotations" in dataset_dict:
            self._transform_annotations(dataset_dict, transforms, image.shape[:2])
        return dataset_dict


def build_lsj_mapper(is_train: bool = True, image_size: int = 1024, min_scale: float = 0.1, max_scale: float = 2.0,
                     use_instance_mask: bool = True, image_format: str = "RGB",
                     instance_mask_format: str = "polygon") -> WinposDatasetMapper:
    """ViTDet's large-scale-jitter mapper: flip, resize by a random scale of ``image_size``, crop to
    ``image_size`` (no pad: the model pads). Box targets are recomputed from the cropped masks when masks are
    used (a crop cuts polygons, not boxes); without masks the cropped boxes are used as they are.
    ``instance_mask_format``: detectron2's ``"polygon"`` or ``"bitmask"`` (needed for RLE masks; set from the data
    by ``winpos.d2.own_data.check_dataset_content``)
    ``is_train=False`` gives the test mapper (``build_test_mapper``)."""
    if not is_train:
        return build_test_mapper(image_size, image_format)
    if not 0 < min_scale <= max_scale:
        raise WinposError(f"LSJ scales must satisfy 0 < min_scale <= max_scale, got {min_scale}, {max_scale}")
    augs = [T.RandomFlip(horizontal=True),
            T.ResizeScale(min_scale=min_scale, max_scale=max_scale, target_height=image_size,
                          target_width=image_size),
            T.FixedSizeCrop(crop_size=(image_size, image_size), pad=False)]
    return WinposDatasetMapper(is_train=True, augmentations=augs, image_format=image_format,
                               use_instance_mask=use_instance_mask, recompute_boxes=use_instance_mask,
                               instance_mask_format=instance_mask_format)


def build_test_mapper(image_size: int = 1024, image_format: str = "RGB") -> WinposDatasetMapper:
    """Resize the longer side to ``image_size`` (ViTDet's test transform for square inputs)."""
    return WinposDatasetMapper(is_train=False,
                               augmentations=[T.ResizeShortestEdge(image_size, max_size=image_size)],
                               image_format=image_format)


@contextlib.contextmanager
def _seeded_host_rng(*key: int):
    """Seed numpy's and Python's global RNGs (what detectron2 augmentations draw from) from ``key``; restore after."""
    np_state, py_state = np.random.get_state(), random.getstate()
    seed = int(np.random.SeedSequence([int(k) & 0xFFFFFFFF for k in key]).generate_state(1)[0])
    np.random.seed(seed)
    random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)


class StreamDataset(torchdata.Dataset):
    """Position ``p`` of an endless, seeded sample stream -> ``mapper(dataset[index(p)])``.

    A mapper that returns None (an image it cannot use) is retried on the next dataset index, deterministically.
    """

    def __init__(self, dataset, mapper, seed: int = 0, shuffle: bool = True):
        if len(dataset) == 0:
            raise WinposError("the training dataset is empty; check dataloader.train.dataset.names and that its "
                              "json lists images with annotations (filter_empty drops images without any)")
        self._data = dataset if isinstance(dataset, torchdata.Dataset) else DatasetFromList(dataset, copy=False)
        self._mapper, self._seed, self._shuffle = mapper, int(seed), shuffle
        self._perm_epoch, self._perm = None, None

    def __len__(self) -> int:
        return len(self._data)

    def index(self, p: int) -> int:
        epoch, offset = divmod(int(p), len(self._data))
        if not self._shuffle:
            return offset
        if self._perm_epoch != epoch:
            g = torch.Generator().manual_seed(self._seed * 1_000_003 + epoch)
            self._perm, self._perm_epoch = torch.randperm(len(self._data), generator=g), epoch
        return int(self._perm[offset])

    def __getitem__(self, p: int):
        n = len(self._data)
        first = self.index(p)
        for attempt in range(n):
            with _seeded_host_rng(self._seed, p, attempt):
                out = self._mapper(self._data[(first + attempt) % n])
            if out is not None:
                return out
        raise WinposError("the mapper rejected every image of the dataset (returned None); check its transforms")


class IterationBatchSampler(torchdata.Sampler):
    """Endless batches of stream positions: iteration ``i`` on ``rank`` yields
    ``[i * total + rank * b + j for j < b]`` with ``b = total / world_size``, from ``start_iter`` on."""

    def __init__(self, total_batch_size: int, start_iter: int = 0, rank: int | None = None,
                 world_size: int | None = None):
        world_size = comm.get_world_size() if world_size is None else world_size
        rank = comm.get_rank() if rank is None else rank
        if total_batch_size <= 0 or total_batch_size % world_size:
            raise WinposError(f"total_batch_size={total_batch_size} must be a positive multiple of the number of "
                              f"processes ({world_size}); set dataloader.train.total_batch_size accordingly")
        if start_iter < 0:
            raise WinposError(f"start_iter={start_iter} must be >= 0")
        self.total, self.start_iter, self.rank = total_batch_size, start_iter, rank
        self.batch = total_batch_size // world_size

    def __iter__(self):
        i = self.start_iter
        while True:
            base = i * self.total + self.rank * self.batch
            yield list(range(base, base + self.batch))
            i += 1


def _as_list(batch):
    return batch


def build_resumable_train_loader(dataset, mapper, total_batch_size: int, num_workers: int = 0, seed: int = 0,
                                 shuffle: bool = True, start_iter: int = 0) -> torchdata.DataLoader:
    """Endless training loader: each item is this rank's ``list`` of ``total_batch_size / world`` mapped dicts.

    Args:
        dataset: list of detectron2 dataset dicts (``get_dataset_dicts(...)``) or a map-style dataset of them.
        mapper: e.g. ``build_lsj_mapper(...)``.
        total_batch_size: images per iteration over all processes.
        num_workers: loader processes per rank (the output does not depend on it).
        seed: the stream seed (shuffling and augmentation).
        shuffle: shuffle each epoch.
        start_iter: the first iteration to produce (set by the trainer on resume).
    """
    data = StreamDataset(dataset, mapper, seed=seed, shuffle=shuffle)
    sampler = IterationBatchSampler(total_batch_size, start_iter=start_iter)
    # Its own generator: creating the iterator must not draw from the global torch RNG, or a resumed run's
    # random stream (drop path, RoI sampling) would be shifted by one draw.
    return torchdata.DataLoader(data, batch_sampler=sampler, num_workers=num_workers, collate_fn=_as_list,
                                generator=torch.Generator().manual_seed(int(seed)))
