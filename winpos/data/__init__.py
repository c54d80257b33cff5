"""Datasets: the embedded shapes set (no detectron2 needed) and checked COCO registration (detectron2, lazily)."""
from .coco import DatasetFileNotFoundError, ValidationReport, register_coco_dataset, register_shapes, validate_coco_json
from .shapes import SHAPE_CLASSES, Shape, compose_scene, ensure_shapes_dataset, generate_shapes, mask_to_polygons

__all__ = [
    "SHAPE_CLASSES", "Shape", "compose_scene", "generate_shapes", "ensure_shapes_dataset", "mask_to_polygons",
    "validate_coco_json", "register_coco_dataset", "register_shapes", "ValidationReport", "DatasetFileNotFoundError",
]
