"""Lose a Ray node mid-shard: a raypack job on a 3-node ``ray.cluster_utils.Cluster`` on this
machine, and the worker node hosting a packer is removed while that packer writes a shard.

    python tests/fault_scripts/remove_node.py --input CORPUS --output OUT --report REPORT.json \
        --context-length 512 --read-batch-size 8

Run by tests/pack/test_faults.py as a subprocess (its own Ray, its own process tree). Writes a JSON
report of what happened and exits 0 only if the node was removed mid-shard and the job finished.

Cluster: a head with 1 CPU and two worker nodes with 1 CPU each. The driver runs on the head,
which can never be removed. Packers reserve 0.75 CPU (``worker_num_cpus``), so at most one fits
on any node: of the two packers at least one must run on a worker node, and after the removal
the two remaining nodes still fit both. The node hosting a packer is found without Ray's state
API (which needs the dashboard): every node's raylet is a child of this process and a worker
process is a child of its node's raylet, so a packer's parent pid names its node. The victim
is a packer on a worker node that holds a ``.tmp-*`` chunk file with data in the staging dir.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import traceback

import ray
from ray._private import ray_constants
from ray.cluster_utils import Cluster

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import procs  # noqa: E402

from raypack.pack.config import make_config  # noqa: E402
from raypack.pack.job import run_pack  # noqa: E402


def raylet_pid(node) -> int:
    return node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid


# The GCS declares a node dead after `health_check_failure_threshold` failed checks, one every
# `health_check_period_ms`. With Ray's defaults the actor restart waited ~13 s here; with these,
# ~1.5 s. Faster checks only shorten that wait: the task is retried and the actor restarted the
# same way.
FAST_HEALTH_CHECK = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}


def start_cluster() -> tuple[Cluster, list]:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                            "_system_config": FAST_HEALTH_CHECK})
    workers = [cluster.add_node(num_cpus=1) for _ in range(2)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    return cluster, workers


def run_job_in_thread(config, outcome: dict) -> threading.Thread:
    def target() -> None:
        start = time.monotonic()
        try:
            summary = run_pack(config, engine="ray")
            outcome["content_sha256"] = summary.manifest["content_sha256"]
        except BaseException as e:  # reported, not raised: the thread has no caller
            outcome["error"] = "".join(traceback.format_exception(e))
        outcome["job_seconds"] = time.monotonic() - start

    thread = threading.Thread(target=target, name="raypack-job", daemon=True)
    thread.start()
    return thread


def find_victim(cluster: Cluster, workers: list, output: str, job: threading.Thread, timeout: float,
                seen: dict[int, str]) -> dict | None:
    """A packer on a worker node holding a tmp chunk file with data; None if the job ended first.

    ``seen`` collects every packer pid met on the way (pid -> node id).
    """
    by_raylet = {raylet_pid(node): node for node in workers}
    deadline = time.monotonic() + timeout
    while job.is_alive() and time.monotonic() < deadline:
        seen.update(packer_nodes(cluster))
        for staging in procs.staging_dirs(output):
            for pid in procs.packer_pids(os.getpid()):
                node = by_raylet.get(procs.parent_pid(pid))
                tmp_files = procs.open_tmp_files(pid, staging)
                sizes = [os.path.getsize(t) if os.path.exists(t) else -1 for t in tmp_files]
                if node is not None and tmp_files and min(sizes) > 0:
                    return {"pid": pid, "node": node, "title": procs.command_line(pid),
                            "tmp_files": tmp_files, "tmp_bytes": sizes}
        time.sleep(0.02)
    return None


def packer_nodes(cluster: Cluster) -> dict[int, str]:
    """Live packer pid -> node id of its raylet."""
    node_of = {raylet_pid(n): n.node_id for n in cluster.list_all_nodes()}
    return {pid: node_of.get(procs.parent_pid(pid), "?") for pid in procs.packer_pids(os.getpid())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--report", required=True)
    parser.add_argument("--context-length", type=int, required=True)
    parser.add_argument("--read-batch-size", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=120)
    parser.add_argument("--graceful", action="store_true", help="SIGTERM the node's processes first")
    args = parser.parse_args()

    started = time.monotonic()
    report: dict = {"removed": False}
    cluster, workers = start_cluster()
    report["cluster_start_seconds"] = time.monotonic() - started
    report["nodes"] = {n.node_id: ("head" if n is cluster.head_node else "worker") for n in cluster.list_all_nodes()}
    try:
        config = make_config(dict(inputs=[args.input], output=args.output, context_length=args.context_length,
                                  pad_token=0, read_batch_size=args.read_batch_size, num_workers=2,
                                  worker_num_cpus=0.75))
        outcome: dict = {}
        job = run_job_in_thread(config, outcome)
        seen_before: dict[int, str] = {}
        victim = find_victim(cluster, workers, args.output, job, args.timeout, seen_before)
        if victim is not None:
            node = victim.pop("node")
            seen_before.update(packer_nodes(cluster))
            report["packers_before"] = seen_before
            removed_at = time.monotonic()
            cluster.remove_node(node, allow_graceful=args.graceful)
            report.update(removed=True, removed_node=node.node_id, remove_seconds=time.monotonic() - removed_at,
                          removed_after_seconds=removed_at - started, victim=victim,
                          victim_dead=procs.wait_dead(victim["pid"], 30),
                          tmp_files_after=[t for t in victim["tmp_files"] if os.path.exists(t)])
            seen: dict[int, str] = {}
            while job.is_alive() and time.monotonic() - started < args.timeout:
                seen.update(packer_nodes(cluster))
                time.sleep(0.1)
            report["packers_after"] = {p: n for p, n in seen.items() if p not in report["packers_before"]}
        job.join(timeout=max(1.0, args.timeout - (time.monotonic() - started)))
        report["job_finished"] = not job.is_alive()
        report.update(outcome)
    finally:
        report["total_seconds"] = time.monotonic() - started
        with open(args.report, "w") as f:
            json.dump(report, f, indent=2, default=str)
        ray.shutdown()
        cluster.shutdown()
    ok = report["removed"] and report["job_finished"] and "error" not in report
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
