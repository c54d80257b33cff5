#!/usr/bin/env python
"""``winpos-export`` in a checkout: the code and its --help are winpos.cli.export."""
import sys

from winpos.cli.export import build_parser, main  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
