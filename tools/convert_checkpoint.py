#!/usr/bin/env python
"""``winpos-convert`` in a checkout: the code and its --help are winpos.cli.convert_checkpoint."""
import sys

from winpos.cli.convert_checkpoint import build_parser, main  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
