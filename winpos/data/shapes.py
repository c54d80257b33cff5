"""The embedded "shapes" dataset: a deterministic, COCO-format instance-segmentation set that trains on a CPU.

``generate_shapes`` writes a split: images drawn by ``winpos.data.scenes`` (textured backgrounds, 1-6 overlapping
objects of ``SHAPE_CLASSES``, exact COCO polygon masks), each from its own random stream (seed, split, index), and
its COCO json. ``ensure_shapes_dataset`` generates a whole dataset once into a cache folder keyed by its parameters,
atomically; ``one_class_json`` is its one-class view. No detectron2 import here: only numpy, PIL and the scenes.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import zlib
from pathlib import Path

import numpy as np
from PIL import Image
from winpos.data.scenes import SHAPE_CLASSES, scene_hw, random_scene
from winpos.errors import WinposError

__all__ = ["cache_root", "ensure_shapes_dataset", "generate_shapes", "one_class_json", "shapes_val_dir"]

_VERSION = 1  # bump when the generator's output changes: it is part of the cache key
_MANIFEST = "winpos_shapes.json"


def generate_shapes(root: str | Path, split: str, num_images: int, image_size=256, seed: int = 0,
                    min_objects: int = 1, max_objects: int = 6, object_side: int | None = None,
                    force: bool = False) -> Path:
    """Write ``root/split/NNNNNN.png`` and ``root/annotations/instances_{split}.json``; return the json path.
    A split already in ``root`` (its json or a non-empty image folder) is refused unless ``force``.

    ``image_size``: int or (height, width). ``object_side``: draw object sizes as for an image of this short side
    (default: the image's own), e.g. a 256 px canvas holding the objects of a 64 px image (``object_side=64``;
    scale ``min_objects`` / ``max_objects`` with the area to keep the density). Image ``i`` depends only on
    (seed, split, i), so a larger ``num_images`` extends a smaller set, and the same arguments give
    byte-identical files.
    """
    h, w = scene_hw(image_size)
    if not split or any(c in split for c in "/\\") or split.startswith("."):
        raise WinposError(f"split={split!r} must be a plain folder name such as 'train' or 'val'")
    if num_images < 1:
        raise WinposError(f"num_images={num_images} must be >= 1")
    if object_side is not None and not (isinstance(object_side, int) and object_side >= 32):
        raise WinposError(f"object_side={object_side!r} must be an int >= 32 px (the short side object sizes are "
                          "drawn for), or None for the image's own")
    if not 0 <= min_objects <= max_objects or max_objects < 1:
        raise WinposError(f"need 0 <= min_objects <= max_objects and max_objects >= 1, got {min_objects}, {max_objects}")
    from winpos.utils.outputs import atomic_write_text, check_output_file

    root = Path(root)
    json_path = root / "annotations" / f"instances_{split}.json"
    check_output_file(json_path, force=force, flag="the shapes dataset's")
    if not force and (root / split).is_dir() and any((root / split).iterdir()):
        raise WinposError(f"the shapes split folder {root / split} already holds files; pass force=True to replace "
                          "them, or choose another root")
    (root / split).mkdir(parents=True, exist_ok=True)
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    for i in range(num_images):
        rng = np.random.default_rng([seed, zlib.crc32(split.encode()), i])
        image, anns = random_scene(rng, h, w, int(rng.integers(min_objects, max_objects + 1)), object_side)
        file_name = f"{i:06d}.png"
        # noisy pixels barely compress; ensure_shapes_dataset stages a whole dataset and renames it into place
        Image.fromarray(image).save(root / split / file_name, compress_level=1)  # output-policy: split checked above
        images.append({"id": i + 1, "file_name": file_name, "height": h, "width": w, "license": 1})
        for ann in anns:
            annotations.append({"id": len(annotations) + 1, "image_id": i + 1, **ann})
    dataset = {
        "info": {"description": f"winpos shapes v{_VERSION}, split {split}, seed {seed}", "version": str(_VERSION),
                 "year": 2024, "contributor": "winpos", "date_created": "2024-01-01"},
        "licenses": [{"id": 1, "name": "CC0-1.0", "url": "https://creativecommons.org/publicdomain/zero/1.0/"}],
        "images": images,
        "annotations": annotations,
        "categories": [{"id": k + 1, "name": n, "supercategory": "shape"} for k, n in enumerate(SHAPE_CLASSES)],
    }
    atomic_write_text(json_path, json.dumps(dataset, separators=(",", ":")))
    return json_path


def cache_root() -> Path:
    """Where generated datasets and cleaned COCO jsons go: ``$WINPOS_DATA``, else ``~/.cache/winpos``."""
    return Path(os.environ.get("WINPOS_DATA") or Path.home() / ".cache" / "winpos")


def one_class_json(json_path: str | Path) -> Path:
    """The one-class view of a shapes json (every object in class 1, "shape"), written once next to it
    (``<stem>_one_class.json``, atomically); returns its path. Detection without shape classification."""
    from winpos.utils.outputs import atomic_write

    json_path = Path(json_path)
    one = json_path.with_name(json_path.stem + "_one_class.json")
    if not one.is_file():
        data = json.loads(json_path.read_text())
        data["categories"] = [{"id": 1, "name": "shape", "supercategory": "shape"}]
        for ann in data["annotations"]:
            ann["category_id"] = 1
        atomic_write(str(one), lambda f: f.write(json.dumps(data, separators=(",", ":"))), "w")
    return one


def _remove_stale_temps(parent: Path, digest: str) -> None:
    """Delete temp dirs of earlier generations of this dataset whose process is gone (crashed or killed)."""
    for tmp in parent.glob(f".tmp-{digest}-*"):
        try:
            pid = int(tmp.name.split("-")[2])  # .tmp-<digest>-<pid>-<random>
            os.kill(pid, 0)
            continue  # still generating in another process: leave it alone
        except (IndexError, ValueError, ProcessLookupError):
            shutil.rmtree(tmp, ignore_errors=True)
        except PermissionError:
            continue  # alive, owned by another user


def ensure_shapes_dataset(root: str | Path | None = None, train_images: int = 600, val_images: int = 100,
                          image_size=256, seed: int = 0, min_objects: int = 1,
                          max_objects: int = 6, object_side: int | None = None,
                          val_seed: int | None = None) -> dict[str, tuple[Path, Path]]:
    """Generate the shapes dataset once into ``<root>/shapes_v1/<params-hash>/`` and return its paths.

    ``root`` defaults to ``$WINPOS_DATA``, else ``~/.cache/winpos``. Generation goes to a temp dir that is
    renamed into place when complete, so a crashed run is never picked up (its leftover is deleted later);
    a second call finds the finished dir and writes nothing.
    ``val_seed``: draw the ``val`` split from this seed instead of ``seed`` (an evaluation set of its own, e.g. one
    per independent experiment): the ``train`` split is then the one ``seed`` gives, byte for byte, and each split
    is kept in a folder of its own (``<params-hash>`` of that split), so sets that differ only in ``val_seed`` share
    their training images. Images of the two splits come from different random streams (seed, split name, index),
    so an evaluation image is never a training image.
    Returns ``{"shapes_train": (json_path, image_root), "shapes_val": (json_path, image_root)}``.
    """
    plan = _split_plan(root, train_images, val_images, image_size, seed, min_objects, max_objects, object_side,
                       val_seed)
    out = {}
    for split, (final, params, splits) in plan.items():
        _ensure_generated(final, params, splits)
        out[f"shapes_{split}"] = (final / "annotations" / f"instances_{split}.json", final / split)
    return out


def shapes_val_dir(root: str | Path | None = None, *, val_seed: int, **params) -> Path:
    """The folder in which ``ensure_shapes_dataset(root, val_seed=val_seed, **params)`` keeps its ``val`` split (an
    evaluation set of its own), whether or not it has been generated: to remove it once nothing reads it (it is
    made again, byte for byte, when asked for)."""
    return _split_plan(root, val_seed=val_seed, **params)["val"][0]


def _split_plan(root=None, train_images: int = 600, val_images: int = 100, image_size=256, seed: int = 0,
                min_objects: int = 1, max_objects: int = 6, object_side: int | None = None,
                val_seed: int | None = None) -> dict:
    """``{split: (folder, params, {split: (images, seed)})}`` of ``ensure_shapes_dataset``'s arguments: one folder
    for both splits without ``val_seed``, one per split with it."""
    params = {"version": _VERSION, "train_images": train_images, "val_images": val_images,
              "image_size": list(scene_hw(image_size)), "seed": seed, "min_objects": min_objects,
              "max_objects": max_objects}
    if object_side is not None:  # only when set, so the default datasets keep their cache key
        params["object_side"] = object_side
    parent = (Path(root) if root is not None else cache_root()) / "shapes_v1"
    if val_seed is None:
        both = {"train": (train_images, seed), "val": (val_images, seed)}
        return {split: (parent / _digest(params), params, both) for split in ("train", "val")}
    plan = {}
    for split, n, split_seed in (("train", train_images, seed), ("val", val_images, val_seed)):
        one = {k: v for k, v in params.items() if k not in ("train_images", "val_images")}
        one.update(split=split, images=n, seed=split_seed)
        plan[split] = (parent / _digest(one), one, {split: (n, split_seed)})
    return plan


def _digest(params: dict) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:12]


def _ensure_generated(final: Path, params: dict, splits: dict) -> None:
    """``final`` (``<parent>/<digest of params>``) holding ``splits`` (``{split: (images, seed)}``), generated once
    (see ``ensure_shapes_dataset``)."""
    parent, digest = final.parent, final.name
    if not (final / _MANIFEST).is_file():
        parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temps(parent, digest)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{digest}-{os.getpid()}-", dir=parent))
        size = params["image_size"]
        try:
            for split, (n, split_seed) in splits.items():
                generate_shapes(tmp, split, n, size, split_seed, params["min_objects"], params["max_objects"],
                                params.get("object_side"))
            (tmp / _MANIFEST).write_text(json.dumps(params, sort_keys=True))  # output-policy: staging folder
            if final.exists() and not (final / _MANIFEST).is_file():
                shutil.rmtree(final)  # an incomplete dir not made by this function: replace it
            try:
                os.rename(tmp, final)
            except OSError:
                if not (final / _MANIFEST).is_file():
                    raise
                shutil.rmtree(tmp, ignore_errors=True)  # another process finished the same dataset first
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
