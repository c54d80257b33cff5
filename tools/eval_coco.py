#!/usr/bin/env python
"""``winpos-eval`` in a checkout: the code and its --help are winpos.cli.eval_coco."""
import sys

from winpos.cli.eval_coco import build_parser, main  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
