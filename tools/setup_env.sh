#!/usr/bin/env bash
# Create .venv and install winpos with everything its tests and tools need, along the proven route:
# torch 2.14.1 / torchvision 0.29.1, detectron2 (an importable official install, else the pure-Python part of
# sal-detectron2==0.7.2), the oracle packages, and winpos in editable mode. Idempotent: a second run checks a
# stamp and returns in seconds.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${WINPOS_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
STAMP="$VENV/.winpos-setup-v1"
HASH="$(cat "$ROOT/setup.py" "$ROOT/pyproject.toml" "$ROOT/tools/setup_env.sh" | sha256sum | cut -d' ' -f1)"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$HASH" ]] && "$PY" -c "import winpos, detectron2, sam2, timm" 2>/dev/null; then
  echo "[setup_env] $VENV is up to date"
  exit 0
fi

[[ -x "$PY" ]] || python3 -m venv "$VENV"
PIP=("$PY" -m pip install --disable-pip-version-check -q)

"${PIP[@]}" "torch==2.14.1" "torchvision==0.29.1"

# detectron2 dependencies (pure Python); setuptools<81 keeps pkg_resources for detectron2.model_zoo.
"${PIP[@]}" "setuptools<81" wheel pycocotools fvcore iopath "omegaconf>=2.1,<2.4" "hydra-core>=1.1" yacs \
  termcolor tabulate cloudpickle tqdm matplotlib Pillow tensorboard black shapely opencv-python-headless

if ! "$PY" -c "import detectron2, detectron2.modeling" 2>/dev/null; then
  D2="$VENV/d2-pure"
  rm -rf "$D2"
  "$PY" -m pip download -q --no-deps --python-version 3.10 --only-binary=:all: -d "$D2.whl" "sal-detectron2==0.7.2" 2>/dev/null || true
  "$PY" -m pip install -q --no-deps --python-version 3.10 --only-binary=:all: --target "$D2" "sal-detectron2==0.7.2"
  rm -rf "$D2.whl"
  find "$D2" -name '_C*.so' -delete
  SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  echo "$D2" > "$SITE/winpos-detectron2.pth"
fi

# Oracles for parity tests. sam2 builds no CUDA extension here (SAM2_BUILD_CUDA=0).
SAM2_BUILD_CUDA=0 SAM2_BUILD_ALLOW_ERRORS=1 "${PIP[@]}" --no-build-isolation sam2==1.1.0
"${PIP[@]}" hiera-transformer==0.1.4 "timm==1.0.31" segment-anything==1.0 safetensors
# SAM3's encoder (sam3.model.vitdet.ViT) is the oracle of the sam3 format; sam3 imports einops, iopath, ftfy and psutil
# without declaring all of them. onnx + onnxruntime check winpos-export's graphs (the [export] extra); submitit runs
# winpos-train --slurm (the [slurm] extra; its tests use submitit's local executor). transformers is the oracle of the
# checkpoints saved in Hugging Face names (winpos.checkpoints.hf); in the same call, so that pip keeps sam3's
# huggingface-hub < 2 and typing_extensions < 4.16 (transformers 5.25 would need hub 2).
"${PIP[@]}" sam3==0.1.4 einops iopath ftfy psutil onnx onnxruntime "submitit>=1.5" "transformers==5.24.0" \
  "huggingface-hub>=0.30,<2.0" "typing_extensions>=4.8,<4.16"

# winpos itself, editable, with test extras.
"${PIP[@]}" --no-build-isolation -e "$ROOT[test]"

"$PY" -c "import winpos, detectron2, sam2, timm, hiera, segment_anything, sam3, onnxruntime, submitit, transformers; print('[setup_env] ok: torch', __import__('torch').__version__)"
echo "$HASH" > "$STAMP"
