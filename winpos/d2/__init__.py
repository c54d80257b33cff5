"""winpos' detectron2 layer: the only part of winpos that imports detectron2.

``import winpos`` (and ``winpos.backbones``, ``winpos.posemb``, ...) never imports detectron2. ``import winpos.d2``
does, and registers ``build_hieradet_fpn_backbone`` / ``build_vitdet_sfp_backbone`` in detectron2's
``BACKBONE_REGISTRY`` for yacs configs (call ``add_winpos_config(cfg)`` first). LazyConfig files name the
classes directly (``HieraDetBackbone``, ``ViTDetBackbone``) and need no registration.

Modules:

    backbone        detectron2 ``Backbone`` adapters around the plain winpos backbones
    registry        ``BACKBONE_REGISTRY`` builders for yacs configs
    config          LazyConfig files loaded with strict ``key=value`` overrides
    safe_config     a saved config.yaml read as data: safe YAML, trusted ``_target_`` only
    data            registration, the LSJ mapper, a resumable, reproducible training loader
    own_data        one's own COCO data in the commands: its class names and the config's class count
    optim           parameter groups: layer decay, no weight decay on norms and embeddings
    freeze          ``train.freeze``: the parts of a detector that do not train (small data)
    best            ``train.keep_best``: the weights of the best periodic evaluation
    train_loop      the AMP trainer, on any device
    hooks           the training loop's hooks and schedule
    checkpoint      atomic periodic saves, safe and foreign loads, exact RNG resume
    run_dir         one run per output folder, never taken over, never shared
    startup         what a run is about to do, said once at its start, and its batch arithmetic
    engine          train / test entry points behind ``winpos-train``
    launch          starting training processes: local, ``srun`` / ``torchrun``, and their reports
    slurm           jobs through submitit that requeue and resume (``winpos-train --slurm``)
    evaluate        COCO box / mask AP, resolution sweep, fps (``winpos-eval``)
    predict         a model on image files, its predictions drawn (``winpos-predict``)
    video           prediction on a video file or a camera, the annotated video written
    export          a whole detector to ONNX, ``.pt2`` and TorchScript, checked (``winpos-export``)
    export_program  the detector's inference in a form torch.export takes (its ``.pt2`` program)
    doctor          the doctor (``winpos.diagnostics.doctor``) for LazyConfig files as well as presets
    peers           detectron2's own models built for comparison (``winpos.bench.peers`` times them)
"""
from winpos.d2.backbone import HieraDetBackbone, ViTDetBackbone
from winpos.d2.optim import get_optimizer_params
from winpos.d2.registry import add_winpos_config, build_hieradet_fpn_backbone, build_vitdet_sfp_backbone

__all__ = ["HieraDetBackbone", "ViTDetBackbone", "add_winpos_config", "build_hieradet_fpn_backbone",
           "build_vitdet_sfp_backbone", "get_optimizer_params"]
