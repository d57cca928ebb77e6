"""``python -m raypack.cli``: the same as the ``raypack`` command."""

import sys

from raypack.cli import main

if __name__ == "__main__":
    sys.exit(main())
