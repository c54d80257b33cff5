r"""Convert an outside checkpoint (official Hiera, SAM2, timm, SAM, MAE, detectron2 ViTDet, SAM3, DINOv2, DINOv3,
EVA-02, RoPE-ViT, LookHere, winpos; SAM, SAM2, SAM3, Hiera, ViTDet, DINOv2, DINOv3 and ViT also in Hugging Face names,
e.g. a downloaded model.safetensors) into a winpos backbone, or a winpos checkpoint into another pos_embed choice.

    winpos-convert --input sam2.1_hiera_base_plus.pt --output hieradet_bplus.safetensors \
        [--to hieradet_bplus] [--recipe paper] [--pos-embed abswin] [--pos-global-size 56] [--format auto] [--force]

Without --to the target is the preset the file records (winpos-convert's output), its run's (a winpos-train
checkpoint with config.yaml beside it), else the preset whose embedding width and depth fit the checkpoint's trunk
(the family's own first; printed). The output holds the backbone's state dict (safetensors, or a .pth/.pt saved for weights_only loading; the suffix
chooses) and loads with ``create(PRESET, recipe=...).load_state_dict(...)`` or as ``train.init_checkpoint``. A
trained detector's checkpoint with its run's config.yaml beside it (a winpos-train output_dir) converts into the
backbone that run built: its recipe and constructor arguments (window sizes, img_size, ...) unless a flag says
otherwise; they go into the output's metadata (``winpos_kwargs``, with the training size as ``winpos_image_size``)
and into the printed line that builds the model. The load report is printed, then the line that builds the model it
loads into. An abs-win target whose global embedding grid differs from the checkpoint's (a HieraDet's, or SAM's
64x64 grid into a ViTDet with recipe paper) is converted lossily (the report says so); --pos-global-size N builds
the target with an NxN grid (pos_global_size=N) and keeps it exact. A ViTDet target with the abs embedding is built
with the checkpoint's pretraining grid (SAM's 64x64 without a cls row: pretrain_img_size=1024,
pretrain_use_cls_token=False), said in the report and the printed line, unless --set gives either. The output is
checked before the conversion starts: it may not be the input, an existing file is replaced only with --force, and
it is written atomically (an interrupted or failed write leaves the previous file as it was and no temporary file).
A winpos-convert output converted again keeps the build it records (recipe and constructor arguments: LookHere's
slopes, RoPE's base, ...) for the same preset; another preset, recipe or --set changes them on purpose and the
report lists each setting that carries no tensor and differs. A partial conversion (trunk weights of the source
that do not load, such as LayerScale, register tokens, learned RoPE frequencies or biases, or trunk weights of the
target left at their initialization) is refused, naming what would be lost, and nothing is written; --allow-loss
accepts it and records the loss in the output's metadata (``winpos_lost``). Exit status 2 for bad input, 1 when
writing fails.
"""
import json
import sys
from pathlib import Path

from winpos.errors import WinposError
from winpos.utils.cli import ArgumentParser, constructor_overrides, positive_int, run_cli

SUFFIXES = (".safetensors", ".pth", ".pt")
POS_EMBEDS = ("abs", "abswin", "abswin_recursive", "none")
# winpos.checkpoints.formats.FORMATS, written out so that --help imports no torch (a test keeps them equal)
FORMATS = ("sam2", "hiera", "timm_hiera", "timm_abswin", "sam", "mae", "detectron2", "winpos", "lookhere", "dinov2",
           "dinov3", "eva02", "rope_vit", "sam3")


def build_parser():
    import argparse

    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True, help="checkpoint file (.pth/.pt/.pkl/.safetensors), or a Hugging "
                        "Face model folder (model.safetensors, sharded or not)")
    parser.add_argument("--output", required=True, help=f"output file ({', '.join(SUFFIXES)})")
    parser.add_argument("--to", default=None,
                        help="winpos preset, e.g. vitdet_b or hieradet_bplus (default: the one the file records, "
                             "for winpos-convert's output; its run's, for a trained detector with its config.yaml "
                             "beside it; else the preset whose width and depth fit the checkpoint, the family's own "
                             "first)")
    parser.add_argument("--recipe", default=None,
                        help="original | paper | rope | lookhere (default: the run's, for a trained detector with its "
                             "config.yaml beside it; else original)")
    parser.add_argument("--format", default="auto", choices=("auto",) + FORMATS,
                        help="source format (default: detect from the keys; the names of winpos-posemb plot --format)")
    parser.add_argument("--pos-embed", default=None, choices=POS_EMBEDS,
                        help="override the target's token embedding (e.g. abswin)")
    parser.add_argument("--img-size", type=positive_int, default=None,
                        help="target image size in px (sizes global relpos tables)")
    parser.add_argument("--pos-global-size", type=positive_int, default=None, metavar="N",
                        help="an NxN abs-win global embedding grid (pos_global_size=N); the checkpoint's own "
                             "size keeps the conversion exact")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a constructor argument of the target (repeatable), e.g. --set window_size=16; "
                             "pretrain_img_size / pretrain_use_cls_token given here replace the grid taken from "
                             "the checkpoint")
    parser.add_argument("--allow-loss", action="store_true",
                        help="write a partial conversion (trunk weights dropped or left at init), recorded in the "
                             "output's metadata as winpos_lost")
    parser.add_argument("--force", action="store_true", help="replace an existing --output")
    return parser


def run(argv=None):
    args = build_parser().parse_args(argv)
    from winpos.utils.outputs import check_output_file

    out = check_output_file(args.output, inputs=[args.input], force=args.force, suffixes=SUFFIXES)
    if not Path(args.input).exists():
        raise WinposError(f"--input {args.input} does not exist; check the path")

    import torch

    from winpos.checkpoints import load_external
    from winpos.utils.outputs import atomic_write

    from winpos.diagnostics.extract import native_size_from_config, run_backbone_beside

    # a trained detector's run: its backbone's settings (window sizes, image size, ...) build the target, unless a
    # flag says otherwise, and its training image size is recorded in the output
    run = run_backbone_beside(args.input)
    source = args.input
    if args.to is None:
        args.to, source = _default_target(args.input, args.format, run)
    overrides = {}
    if run is not None and run[0] == args.to:
        preset, recipe, carried, config = run
        overrides.update(carried)
        args.recipe = args.recipe or recipe
        print(f"from the run's {config}: recipe {recipe!r}, " + ", ".join(f"{k}={v!r}" for k, v in carried.items()))
    elif run is not None:
        print(f"note: the run's {run[3]} is for preset {run[0]!r}, not --to {args.to}: its settings are not used")
    # a winpos-convert output converted again: the build it records (LookHere's slopes, RoPE's base, ...) carries
    # over into the same preset and recipe; another recipe, or --set, changes those settings on purpose
    on_purpose = bool(args.overrides)
    if source is args.input and Path(args.input).suffix.lower() in (".pth", ".pt"):
        from winpos.checkpoints import load_checkpoint_object

        source = load_checkpoint_object(args.input)  # read once: its top-level winpos_* entries, then its weights
    from winpos.checkpoints.recorded import recorded_build

    build = recorded_build(args.input, source if isinstance(source, dict) else None)
    if build is not None and build.preset == args.to and args.recipe in (None, build.recipe):
        args.recipe = build.recipe
        overrides.update(build.kwargs)
        if build.kwargs:
            print(f"from {build.where}: recipe {build.recipe!r}, "
                  + ", ".join(f"{k}={v!r}" for k, v in build.kwargs.items()))
    elif build is not None:
        on_purpose = True  # another preset or recipe than the file's: its settings are the target's, said below
    args.recipe = args.recipe or "original"
    overrides.update(constructor_overrides(args.overrides))
    if args.pos_embed:
        overrides["pos_embed"] = args.pos_embed
    if args.img_size:
        overrides["img_size"] = args.img_size
    if args.pos_global_size:
        overrides["pos_global_size"] = args.pos_global_size
    sd, report = load_external(source, args.to, format=args.format, recipe=args.recipe,
                               allow_loss=args.allow_loss, fit_pretrain_grid=True,
                               allow_other_settings=on_purpose, **overrides)
    if args.pos_global_size and "pos_embed.global_embed" not in sd:  # checked before anything is written
        raise WinposError(f"--pos-global-size sizes an abs-win embedding's global grid, but {args.to} with recipe "
                          f"{args.recipe!r} has none; drop it, or convert into abs-win (--recipe paper or --pos-embed "
                          "abswin)")
    print(report.summary())
    overrides.update(report.built_with)  # the checkpoint's pretraining grid: recorded and in the create() line
    sd = {k: v.contiguous() for k, v in sd.items()}
    meta = {"winpos_preset": args.to, "winpos_recipe": args.recipe}
    if overrides:  # every constructor argument the output needs besides preset and recipe, as JSON
        meta["winpos_kwargs"] = json.dumps(overrides)
    size = native_size_from_config(args.input)
    if size is not None:  # the training image size (winpos-posemb plot reads it; 1024 is assumed otherwise)
        meta["winpos_image_size"] = str(size[0])
    if report.lost:
        meta["winpos_lost"] = "; ".join(f"{k}: {why}" for k, why in report.lost)
    if args.pos_embed:
        meta["winpos_pos_embed"] = args.pos_embed
    if args.pos_global_size:
        meta["winpos_pos_global_size"] = str(args.pos_global_size)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix.lower() == ".safetensors":
        from safetensors.torch import save

        data = save(sd, metadata=meta)
        atomic_write(out, lambda f: f.write(data), "wb")
    else:
        atomic_write(out, lambda f: torch.save({"model": sd, **meta}, f), "wb")
    print(f"wrote {out} ({len(sd)} tensors)")
    args_text = "".join(f", {k}={v!r}" for k, v in overrides.items())
    print(f"load it with: create({args.to!r}, recipe={args.recipe!r}{args_text}).load_state_dict(sd, strict=False)")
    return 0


def _recorded_preset(path) -> str | None:
    """The preset winpos-convert recorded in a safetensors output's metadata (a .pth's top-level ``winpos_preset``
    is read from the loaded object by ``_default_target``)."""
    from winpos.checkpoints.io import safetensors_metadata

    return safetensors_metadata(path).get("winpos_preset")


def _default_target(path, format: str, run):
    """``--to`` when it is not given: the recorded preset, the run's, else the one the checkpoint's width and depth
    fit; ``(preset, what load_external reads)`` (the loaded object, so that the file is read once)."""
    recorded = _recorded_preset(path)
    if recorded:
        print(f"--to {recorded}: the preset {path} records (winpos_preset)")
        return recorded, path
    if run is not None:
        print(f"--to {run[0]}: the preset of the run's {run[3]}")
        return run[0], path
    from winpos.checkpoints import fitting_presets, load_checkpoint_object

    obj = load_checkpoint_object(path)
    if isinstance(obj, dict) and isinstance(obj.get("winpos_preset"), str):
        print(f"--to {obj['winpos_preset']}: the preset {path} records (winpos_preset)")
        return obj["winpos_preset"], obj
    fmt, width, depth, found = fitting_presets(obj, format)
    if not found:
        from winpos.backbones import list_presets

        told = f"width {width} and {depth} blocks" if width else "no patch embedding to read a width from"
        raise WinposError(f"no winpos preset fits this {fmt} checkpoint ({told}); name one with --to "
                          f"({', '.join(list_presets())}) and the sizes with --set")
    others = f" (also: {', '.join(found[1:])})" if len(found) > 1 else ""
    print(f"--to {found[0]}: the {fmt} checkpoint's width {width} and {depth} blocks fit it{others}")
    return found[0], obj


def main(argv=None) -> int:
    """The command: ``run`` with bad input turned into one ``error:`` line and exit status 2."""
    return run_cli(run, argv)


if __name__ == "__main__":
    sys.exit(main())
