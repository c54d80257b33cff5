"""winpos: position encodings that work with window attention (a detectron2 plugin for HieraDet and ViTDet).

Install with the extras you need: ``pip install .`` gives the backbones, kernels, checkpoint converters and
diagnostics (no detectron2); ``.[d2]`` adds what detectron2 needs besides itself (detectron2 is not on PyPI:
install it from its repository, or run tools/setup_env.sh, which installs its pure-Python part); ``.[bench]`` the
peer implementations the benchmarks time; ``.[test]`` everything the test suite uses (its parity oracles).
"""
from setuptools import find_packages, setup

INSTALL = ["torch>=2.1", "numpy", "safetensors", "matplotlib", "tqdm", "pycocotools", "Pillow", "pyyaml"]
D2_EXTRAS = [  # detectron2's own dependencies (detectron2 itself is installed separately)
    "fvcore", "iopath", "omegaconf>=2.1,<2.4", "hydra-core>=1.1", "yacs", "termcolor", "tabulate", "cloudpickle",
    "tensorboard", "setuptools<81",  # detectron2.model_zoo imports pkg_resources
]
PEERS = ["timm==1.0.31", "sam2==1.1.0", "hiera-transformer==0.1.4", "segment-anything==1.0"]
BENCH_EXTRAS = PEERS
TEST_EXTRAS = ["pytest>=7", "hypothesis>=6"] + PEERS + D2_EXTRAS

setup(
    name="winpos",
    version="0.1.0",
    description="Position encodings that work with window attention: a detectron2 plugin for HieraDet and ViTDet",
    packages=find_packages(include=["winpos", "winpos.*"]) + ["winpos.kernels"],
    package_dir={"winpos.kernels": "kernels"},
    python_requires=">=3.10",
    install_requires=INSTALL,
    extras_require={"d2": D2_EXTRAS, "bench": BENCH_EXTRAS, "test": TEST_EXTRAS},
)
