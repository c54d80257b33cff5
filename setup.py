"""winpos: position encodings that work with window attention (a detectron2 plugin for HieraDet and ViTDet).

Install with the extras you need: ``pip install .`` gives the backbones, kernels, checkpoint converters and
diagnostics (no detectron2); ``.[d2]`` adds what training, evaluation and prediction need besides detectron2 itself
(torchvision, shapely, detectron2's pure-Python dependencies; detectron2 is not on PyPI: install it from its
repository, or run tools/setup_env.sh, which installs its pure-Python part); ``.[bench]`` the peer implementations
the benchmarks time; ``.[export]`` onnx and onnxruntime for ``winpos-export``'s ONNX files; ``.[test]`` everything
the test suite uses (its parity oracles).

The repository's ``configs/`` is installed as ``winpos.configs``, its ``docs/`` pages and figures as ``winpos/docs``
and the demo's checkpoint (``tools/checkpoints/``) as ``winpos.demo_checkpoint`` (one source each: ``winpos.model_zoo`` finds them in a checkout or installed), and
every command is a console script (``winpos.cli``).

The project's metadata (name, version from ``winpos.__version__``, description, readme, license, Python versions,
dependencies, classifiers, URLs) is in pyproject.toml; this file keeps what needs code: the packages and their
folders, package data, the console scripts and the extras.
"""
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
D2_EXTRAS = [  # what winpos.d2 needs at run time besides detectron2 itself
    "torchvision",  # detectron2.layers imports it
    "shapely",  # fvcore's polygon crop in the LSJ augmentation
    "fvcore", "iopath", "omegaconf>=2.1,<2.4", "hydra-core>=1.1", "yacs", "termcolor", "tabulate", "cloudpickle",
    "tensorboard", "setuptools<81",  # detectron2.model_zoo imports pkg_resources
]
PEERS = ["timm==1.0.31", "sam2==1.1.0", "hiera-transformer==0.1.4", "segment-anything==1.0"]
BENCH_EXTRAS = PEERS
SLURM_EXTRAS = ["submitit>=1.5"]  # winpos-train --slurm (winpos.d2.launch.submit)
EXPORT_EXTRAS = ["onnx>=1.16", "onnxruntime>=1.17"]  # winpos-export's ONNX files and their check
# ruff: pyproject.toml [tool.ruff]
TEST_EXTRAS = ["pytest>=7", "hypothesis>=6", "ruff>=0.4"] + PEERS + D2_EXTRAS + SLURM_EXTRAS + EXPORT_EXTRAS

# configs/ installed as winpos.configs: each folder of it is a (data-only) package of the wheel
CONFIG_PACKAGES = ["winpos.configs"] + sorted(
    "winpos.configs." + ".".join(p.relative_to(ROOT / "configs").parts)
    for p in (ROOT / "configs").rglob("*") if p.is_dir() and p.name != "__pycache__")
COMMANDS = {  # winpos.cli's modules; winpos.cli.COMMANDS says the same (a test keeps them equal)
    "winpos-train": "train_net", "winpos-eval": "eval_coco", "winpos-predict": "predict",
    "winpos-posemb": "posemb_viz", "winpos-convert": "convert_checkpoint", "winpos-demo": "run_demo",
    "winpos-reproduce": "reproduce", "winpos-export": "export",
}

setup(
    packages=find_packages(include=["winpos", "winpos.*"]) + ["winpos.kernels", "winpos.demo_checkpoint"]
    + CONFIG_PACKAGES + ["winpos.docs", "winpos.docs.figures"],
    package_dir={"winpos.kernels": "kernels", "winpos.configs": "configs",
                 "winpos.demo_checkpoint": "tools/checkpoints", "winpos.docs": "docs"},
    # docs/ (its pages and figures, not the studies' raw results) as winpos/docs: the commands' --help names pages
    # there, and ``python -m winpos`` prints where they are
    package_data={"winpos": ["py.typed"], "winpos.demo_checkpoint": ["*.pth", "*.json"], "winpos.docs": ["*.md"],
                  "winpos.docs.figures": ["*.png"]},
    entry_points={"console_scripts": [f"{cmd} = winpos.cli.{module}:main" for cmd, module in COMMANDS.items()]
                  + ["winpos-bench-decode = winpos.bench.decode:main"]},
    extras_require={"d2": D2_EXTRAS, "bench": BENCH_EXTRAS, "test": TEST_EXTRAS, "slurm": SLURM_EXTRAS,
                    "export": EXPORT_EXTRAS},
)
