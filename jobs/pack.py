"""Entrypoint for ``ray job submit``: the same flags as ``raypack pack``.

    ray job submit --working-dir . -- python jobs/pack.py --config configs/c4k.toml \
        --input /data/corpus --output /data/packed

Inside a submitted job ``ray.init()`` connects to the cluster that runs it.
"""

import sys

from raypack.cli import main

if __name__ == "__main__":
    sys.exit(main(["pack", *sys.argv[1:]]))
