"""Datasets without detectron2: the embedded shapes set and COCO json validation (``winpos.d2.data`` registers both
with detectron2).

Modules:

    shapes      the embedded "shapes" dataset: deterministic COCO-format instances that train on a CPU
    coco        checks of a COCO instances json, and its cleaned form for registration
    images      an image file read as the RGB the models see, or refused in one line
"""
from .coco import DatasetFileNotFoundError, ValidationReport, cleaned_json_file, validate_coco_json
from .shapes import (SHAPE_CLASSES, Shape, cache_root, compose_scene, ensure_shapes_dataset, generate_shapes,
                     mask_to_polygons, one_class_json)

__all__ = [
    "SHAPE_CLASSES", "Shape", "compose_scene", "generate_shapes", "ensure_shapes_dataset", "mask_to_polygons",
    "one_class_json", "cache_root", "validate_coco_json", "cleaned_json_file", "ValidationReport",
    "DatasetFileNotFoundError",
]
