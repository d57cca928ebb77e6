"""``python -m raypack.cli``: the same as the ``raypack`` command."""

import sys

from raypack import console_main

if __name__ == "__main__":
    sys.exit(console_main())
