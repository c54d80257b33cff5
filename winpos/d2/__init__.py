"""winpos' detectron2 layer: the only part of winpos that imports detectron2.

``import winpos`` (and ``winpos.backbones``, ``winpos.posemb``, ...) never imports detectron2. ``import winpos.d2``
does, and registers ``build_hieradet_fpn_backbone`` / ``build_vitdet_sfp_backbone`` in detectron2's
``BACKBONE_REGISTRY`` for yacs configs (call ``add_winpos_config(cfg)`` first). LazyConfig files name the
classes directly (``HieraDetBackbone``, ``ViTDetBackbone``) and need no registration.

Modules: ``backbone`` (adapters), ``registry`` (yacs builders), ``optim`` (layer decay, no-WD groups), ``data``
(registration, LSJ mapper, resumable loader), ``train_loop`` (AMP trainer), ``checkpoint`` (atomic saves, safe
and foreign loads), ``config`` (strict overrides), ``safe_config`` (a config.yaml read as data: safe YAML, trusted
``_target_`` only), ``engine`` (train / test), ``launch`` (processes: local, srun / torchrun), ``slurm`` (jobs
through submitit that requeue and resume), ``evaluate`` (COCO eval, resolution sweep, fps), ``predict`` (visualizations).
"""
from winpos.d2.backbone import HieraDetBackbone, ViTDetBackbone
from winpos.d2.optim import get_optimizer_params
from winpos.d2.registry import add_winpos_config, build_hieradet_fpn_backbone, build_vitdet_sfp_backbone

__all__ = ["HieraDetBackbone", "ViTDetBackbone", "add_winpos_config", "build_hieradet_fpn_backbone",
           "build_vitdet_sfp_backbone", "get_optimizer_params"]
