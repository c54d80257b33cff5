#!/usr/bin/env python
"""Convert an outside checkpoint (official Hiera, SAM2, timm, SAM, MAE, detectron2 ViTDet) into a winpos backbone.

    python tools/convert_checkpoint.py --input sam2.1_hiera_base_plus.pt --output hieradet_bplus.safetensors \
        --to hieradet_bplus [--recipe paper] [--pos-embed abswin] [--format auto]

The output holds the backbone's state dict (safetensors, or a .pth saved for weights_only loading) and loads with
``create(PRESET, recipe=...).load_state_dict(...)`` or as ``train.init_checkpoint``. The load report is printed.
"""
import argparse
import sys
from pathlib import Path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True, help="checkpoint file (.pth/.pt/.pkl/.safetensors)")
    parser.add_argument("--output", required=True, help="output file (.safetensors or .pth)")
    parser.add_argument("--to", required=True, help="winpos preset, e.g. vitdet_b or hieradet_bplus")
    parser.add_argument("--recipe", default="original", help="original | paper | rope | lookhere")
    parser.add_argument("--format", default="auto", help="source format (default: detect from the keys)")
    parser.add_argument("--pos-embed", default=None, help="override the target's token embedding (e.g. abswin)")
    parser.add_argument("--img-size", type=int, default=None, help="target image size (sizes global relpos tables)")
    args = parser.parse_args(argv)

    import torch

    from winpos.checkpoints import load_external

    overrides = {}
    if args.pos_embed:
        overrides["pos_embed"] = args.pos_embed
    if args.img_size:
        overrides["img_size"] = args.img_size
    try:
        sd, report = load_external(args.input, args.to, format=args.format, recipe=args.recipe, **overrides)
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")
    print(report.summary())
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    sd = {k: v.contiguous() for k, v in sd.items()}
    if out.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(sd, str(out), metadata={"winpos_preset": args.to, "winpos_recipe": args.recipe})
    else:
        torch.save({"model": sd, "winpos_preset": args.to, "winpos_recipe": args.recipe}, out)
    print(f"wrote {out} ({len(sd)} tensors)")


if __name__ == "__main__":
    main()
