"""Windowed backbones as plain ``nn.Module``s (no detectron2 import): ``ViTDet``, ``HieraDet``, and ``create``.

Importing this package imports both model files, so every preset is registered.

Modules:

    common          what both backbones share: attention with per-block position terms, MLP, drop path
    vitdet          ViTDet (plain ViT, 14x14 windows and a few global blocks) and its presets
    hieradet        HieraDet, the hierarchical Hiera trunk (SAM2's image encoder), and its presets
    rope_vits       ViTDet presets for the ViTs pretrained with RoPE (DINOv3, EVA-02, RoPE-ViT)
    sam3_encoder    ViTDet presets for SAM3's image encoder
    dinov2          ViTDet presets for DINOv2 (LayerScale, absolute embedding, patch 14 as stride 16)
    registry        named presets and the one ``create`` entry point
    fused           fused CPU inference steps of the blocks (linear + GELU, linear + residual add)
    export          a model to ONNX, ``.pt2`` and TorchScript, each checked in its runtime
"""
from winpos.backbones.hieradet import HieraDet
from winpos.backbones.registry import create, list_presets, register_preset
from winpos.backbones.vitdet import ViTDet

__all__ = ["HieraDet", "ViTDet", "create", "list_presets", "register_preset"]
