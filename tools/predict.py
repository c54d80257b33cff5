#!/usr/bin/env python
"""``winpos-predict`` in a checkout: the code and its --help are winpos.cli.predict."""
import sys

from winpos.cli.predict import build_parser, main  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
