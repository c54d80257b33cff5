"""Datasets without detectron2: the embedded shapes set and COCO json validation (``winpos.d2.data`` registers both
with detectron2).

Modules:

    scenes      one shapes image: the objects' polygons, their exact COCO masks, the painted scene
    shapes      the embedded "shapes" dataset: deterministic COCO-format instances that train on a CPU
    coco        checks of a COCO instances json, and its cleaned form for registration
    images      an image file read as the RGB the models see, or refused in one line
"""
from .coco import DatasetFileNotFoundError, ValidationReport, cleaned_json_file, validate_coco_json
from .scenes import SHAPE_CLASSES, Shape, compose_scene, mask_to_polygons
from .shapes import cache_root, ensure_shapes_dataset, generate_shapes, one_class_json

__all__ = [
    "SHAPE_CLASSES", "Shape", "compose_scene", "generate_shapes", "ensure_shapes_dataset", "mask_to_polygons",
    "one_class_json", "cache_root", "validate_coco_json", "cleaned_json_file", "ValidationReport",
    "DatasetFileNotFoundError",
]
