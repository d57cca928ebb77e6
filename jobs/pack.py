"""Entrypoint for ``ray job submit``: the same flags as ``raypack pack``.

    RAY_AUTH_MODE=token RAY_AUTH_TOKEN=... ray job submit --address http://HEAD:8265 --working-dir . \
        -- /opt/venv/bin/python jobs/pack.py --config configs/c4k.toml --input /data/corpus --output /data/packed

Name the cluster's interpreter (a bare ``python`` is whatever ``ray start`` had on its PATH) and
absolute paths (relative ones resolve in Ray's copy of the working directory). Inside a
submitted job ``ray.init()`` connects to the cluster that runs it. See the README's "On a cluster".
"""

import sys

from raypack import console_main

if __name__ == "__main__":
    sys.exit(console_main(["pack", *sys.argv[1:]]))
