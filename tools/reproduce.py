#!/usr/bin/env python
"""``winpos-reproduce`` in a checkout: the code and its --help are winpos.cli.reproduce."""
import sys

from winpos.cli.reproduce import main  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
