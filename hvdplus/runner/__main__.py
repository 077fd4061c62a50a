"""`python -m hvdplus.runner ...` is `hvdplusrun ...`."""

import sys

from .launch import main

if __name__ == "__main__":
    sys.exit(main())
