#!/usr/bin/env python
"""``winpos-train`` in a checkout: the code and its --help are winpos.cli.train_net."""
import sys

from winpos.cli.train_net import build_parser, main  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
