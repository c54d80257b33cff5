#!/usr/bin/env python
"""``winpos-posemb`` in a checkout: the code and its --help are winpos.cli.posemb_viz."""
import sys

from winpos.cli.posemb_viz import build_parser, main  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
