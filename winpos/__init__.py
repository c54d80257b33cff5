"""winpos: position encodings that work with window attention.

``import winpos`` is cheap (no torch, no detectron2): it gives ``__version__``, the one source of the package's
version (pyproject.toml reads it).

Modules (the public ones, listed in ``__all__`` below, first; a subpackage ends in /):

    backbones/      ViTDet and HieraDet as plain ``nn.Module``s: ``create(preset, recipe=...)``, presets
    posemb/         the position encodings (abs, abs-win, RoPE, relpos, LookHere)
    attention/      window / global attention with position terms, one entry point and its backends
    checkpoints/    outside checkpoints (SAM2, Hiera, timm, MAE, detectron2, ...) into winpos backbones
    diagnostics/    window similarity, the position-embedding doctor, plots
    data/           the embedded shapes dataset, COCO json validation
    model_zoo       configs by name (``get_config``, ``list_configs``), the demo's checkpoint
    errors          ``WinposError`` (bad input, one line naming the fix) and the validators that raise it
    d2/             the detectron2 layer (needs detectron2): backbones for LazyConfigs, training, evaluation
    kernels/        the fused Triton window-attention and RoPE kernels (the repository's ``kernels/``)
    experiments/    the reproduction of "Window Attention is Bugged" at CPU scale and its studies
    bench/          benchmarks against the peers, and the prepared GPU check
    cli/            the installed commands (``winpos-train``, ...)
    utils/          the plumbing below every layer: atomic outputs and output folders (every writer: data,
                    diagnostics, backbones, bench, experiments, d2, the commands), config names, the command line
    windows         the one padding and windowing helper (reference path, backbones, kernel tests)
    cache           the one cache of values that depend on the token grid
    install_d2      detectron2 into this environment without a compiler (``python -m winpos.install_d2``)
    __main__        ``python -m winpos``: the list of commands

``from winpos import *`` imports the subpackages listed in ``__all__`` (all but ``winpos.d2``, which needs detectron2).
"""
__version__ = "0.1.0"

__all__ = ["__version__", "attention", "backbones", "checkpoints", "data", "diagnostics", "errors", "model_zoo",
           "posemb"]
