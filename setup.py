from setuptools import find_packages, setup

TEST_EXTRAS = [
    "pytest>=7",
    "hypothesis>=6",
    "timm==1.0.31",
    "sam2==1.1.0",
    "hiera-transformer==0.1.4",
    "segment-anything==1.0",
]

setup(
    name="winpos",
    version="0.1.0",
    description="Position encodings that work with window attention: a detectron2 plugin for HieraDet and ViTDet",
    packages=find_packages(include=["winpos", "winpos.*"]) + ["winpos.kernels"],
    package_dir={"winpos.kernels": "kernels"},
    python_requires=">=3.10",
    install_requires=["torch>=2.1", "numpy", "safetensors", "matplotlib", "tqdm", "pycocotools", "Pillow"],
    extras_require={"test": TEST_EXTRAS},
)
