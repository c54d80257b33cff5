"""winpos: position encodings that work with window attention.

``import winpos`` is cheap (no torch, no detectron2): it gives ``__version__``, the one source of the package's
version (pyproject.toml reads it). The public subpackages, each with its own ``__all__``:

    winpos.backbones    ViTDet and HieraDet as plain ``nn.Module``s: ``create(preset, recipe=...)``, presets
    winpos.posemb       the position encodings (abs, abs-win, RoPE, relpos, LookHere)
    winpos.attention    window / global attention with position terms, one entry point and its backends
    winpos.checkpoints  outside checkpoints (SAM2, Hiera, timm, MAE, detectron2, ...) into winpos backbones
    winpos.diagnostics  window similarity, the position-embedding doctor, plots
    winpos.data         the embedded shapes dataset, COCO json validation
    winpos.model_zoo    configs by name (``get_config``, ``list_configs``), the demo's checkpoint
    winpos.errors       ``WinposError`` (bad input, one line naming the fix) and the commands' error policy
    winpos.d2           the detectron2 layer (needs detectron2): backbones for LazyConfigs, training, evaluation

``from winpos import *`` imports the subpackages listed in ``__all__`` (all but ``winpos.d2``, which needs detectron2).
"""
__version__ = "0.1.0"

__all__ = ["__version__", "attention", "backbones", "checkpoints", "data", "diagnostics", "errors", "model_zoo",
           "posemb"]
