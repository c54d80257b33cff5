"""``python -m winpos``: the list of winpos's commands (each has --help)."""
import sys

USAGE = """winpos's commands (each takes --help; ``python -m winpos.cli.<module>`` runs the same):
  winpos-train      train or evaluate a LazyConfig, e.g. --config-file shapes/mask_rcnn_hieradet_toy_abswin.py
  winpos-eval       COCO box / mask AP of a checkpoint, resolution sweeps (--sizes), speed (--fps)
  winpos-predict    drawings and predictions.json for images, a video file (--video-input) or a camera (--webcam)
  winpos-posemb     doctor (does a config or preset interpolate its embedding?) and plot (checkpoints)
  winpos-convert    an outside checkpoint (SAM2, Hiera, MAE, timm, detectron2, ...) into a winpos backbone
  winpos-demo       the window-attention bug and its fix on the embedded data, from the shipped detector
  winpos-reproduce  the paper's protocol at CPU scale
  winpos-export     a backbone preset or a detector config to ONNX, .pt2 and TorchScript, each run and checked
Configs by name: python -c 'from winpos.model_zoo import list_configs; print(list_configs())'"""


def _docs_line() -> str:
    from winpos.utils.config_names import docs_root

    try:
        return f"Documentation (the docs/<page>.md each --help names): {docs_root()}"
    except Exception as e:  # noqa: BLE001 - the list of commands is printed whatever happens here
        return f"Documentation: not found ({e})"


if __name__ == "__main__":
    print(USAGE)
    print(_docs_line())
    sys.exit(0 if sys.argv[1:] in ([], ["--help"], ["-h"]) else 2)
