"""The commands an installed winpos has (console scripts; each module also runs as ``python -m winpos.cli.<name>``
and as ``tools/<name>.py`` in a checkout). Each module's ``main(argv=None)`` returns the exit status: bad input is
one ``error:`` line and status 2; ``--help`` and argument errors import neither torch nor detectron2.

Modules (each one command):

    train_net             winpos-train: train or evaluate a LazyConfig (detectron2's flags)
    eval_coco             winpos-eval: COCO box / mask AP, resolution sweeps, speed
    predict               winpos-predict: drawings and predictions.json for images, a video file or a camera
    posemb_viz            winpos-posemb: doctor (configs, presets) and plot (checkpoints)
    convert_checkpoint    winpos-convert: an outside checkpoint into a winpos backbone
    run_demo              winpos-demo: the main job on the embedded data, from the shipped detector
    reproduce             winpos-reproduce: the paper's protocol at CPU scale
    export                winpos-export: a backbone or detector to ONNX, .pt2 and TorchScript, each checked
"""
COMMANDS = {
    "winpos-train": "train_net",
    "winpos-eval": "eval_coco",
    "winpos-predict": "predict",
    "winpos-posemb": "posemb_viz",
    "winpos-convert": "convert_checkpoint",
    "winpos-demo": "run_demo",
    "winpos-reproduce": "reproduce",
    "winpos-export": "export",
}


def require_detectron2() -> None:
    """Import winpos's detectron2 layer now. The commands whose work runs in processes of their own (winpos-demo,
    winpos-reproduce) call it before any folder is made or process started, so that a missing detectron2 is their
    one ``error:`` line with the install command (``winpos.utils.cli.run_cli``), not a failed run's log."""
    import winpos.d2  # noqa: F401 - imported for the check; an ImportError names what is missing
