#!/usr/bin/env python
"""``winpos-demo`` in a checkout: the code and its --help are winpos.cli.run_demo."""
import sys

from winpos.cli.run_demo import main  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
