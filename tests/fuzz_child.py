"""The child of tests/cli/test_fuzz.py: runs raypack's CLI on many mutants under a memory limit.

    python tests/fuzz_child.py LIMIT_BYTES < requests.jsonl > replies.jsonl

One JSON request per line: {"id": ..., "argv": [...], "timeout": seconds}. For each, one reply:
{"id", "rc", "stderr", "seconds", "peak_rss"}. The address space is capped (RLIMIT_AS) before
raypack is imported, so a mutant that makes a reader allocate from a size it states fails here
(MemoryError: a traceback, rc 1), not on the machine. A mutant that runs past its timeout is
reported with rc "timeout" (SIGALRM), and the child goes on with the next.
"""

from __future__ import annotations

import contextlib
import io
import json
import resource
import signal
import sys
import time


class _Timeout(BaseException):
    pass


def _on_alarm(signum, frame):
    raise _Timeout()


def main() -> None:
    limit = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    from raypack.cli import main as cli

    signal.signal(signal.SIGALRM, _on_alarm)
    for line in sys.stdin:
        request = json.loads(line)
        err = io.StringIO()
        start = time.perf_counter()
        signal.alarm(int(request.get("timeout", 20)))
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                rc = cli(request["argv"])
        except _Timeout:
            rc = "timeout"
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 2
        except BaseException as e:  # noqa: BLE001 - a traceback is what the test counts
            rc = f"traceback {type(e).__name__}: {str(e)[:200]}"
        finally:
            signal.alarm(0)
        reply = {"id": request["id"], "rc": rc, "stderr": err.getvalue()[-2000:],
                 "seconds": round(time.perf_counter() - start, 3),
                 "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
