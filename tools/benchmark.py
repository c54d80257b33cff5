#!/usr/bin/env python
"""Benchmarks, each timing winpos and its peers interleaved in one process and printing ratios.

    python tools/benchmark.py posemb [--json out.json]     # relpos: augmented-QK vs materialized (ViTDet-B global block)
    python tools/benchmark.py backbone [--which vitdet|hiera|all] [--size 1024] [--bf16]
    python tools/benchmark.py scaling [--plot scaling.png]     # time/memory vs input size, growth exponent
    python -m winpos.kernels.bench --json OUT.json            # Triton kernels vs SDPA (GPU only; --dry-run on CPU)
"""
import argparse

import torch

from winpos.bench.timing import write_json


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["posemb", "backbone", "scaling"], help="which benchmark")
    parser.add_argument("--which", default="all", choices=["all", "vitdet", "hiera"], help="backbone families")
    parser.add_argument("--size", type=int, default=1024, help="square input size in px")
    parser.add_argument("--bf16", action="store_true", help="also time bf16 autocast")
    parser.add_argument("--plot", default=None, help="scaling: write the plot to this PNG")
    parser.add_argument("--json", default=None, help="write every number to this JSON file")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.what == "posemb":
        from winpos.bench import posemb

        write_json(args.json, posemb.run(repeats=args.repeats))
    elif args.what == "backbone":
        from winpos.bench import backbone

        write_json(args.json, backbone.run(img_size=args.size, which=args.which, repeats=args.repeats, bf16=args.bf16))
    elif args.what == "scaling":
        from winpos.bench import scaling

        write_json(args.json, scaling.run(repeats=args.repeats, plot_path=args.plot))


if __name__ == "__main__":
    main()
