"""Windowed backbones as plain ``nn.Module``s (no detectron2 import): ``ViTDet``, ``HieraDet``, and ``create``.

Importing this package imports both model files, so every preset is registered.
"""
from winpos.backbones.hieradet import HieraDet
from winpos.backbones.registry import create, list_presets, register_preset
from winpos.backbones.vitdet import ViTDet

__all__ = ["HieraDet", "ViTDet", "create", "list_presets", "register_preset"]
