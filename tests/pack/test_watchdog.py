"""The per-shard progress deadline (raypack.pack.watchdog): a packer that makes no progress is
reported (shard, process, how long) and, when asked, ended so that Ray restarts it."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

from raypack.pack.watchdog import STALL_EXIT_CODE, ProgressWatchdog


def test_a_stalled_shard_is_reported_once_per_timeout(caplog):
    caplog.set_level(logging.WARNING, logger="raypack.pack.watchdog")
    with ProgressWatchdog("shard /data/a.parquet", 0.2) as dog:
        time.sleep(1.0)
    assert 2 <= dog.stalls <= 5
    message = caplog.records[0].getMessage()
    assert message.startswith("shard /data/a.parquet has made no progress for ")
    assert "packer pid" in message and "restart_stalled" in message


def test_beats_keep_it_quiet(caplog):
    with ProgressWatchdog("shard x", 0.3) as dog:
        for _ in range(20):
            time.sleep(0.05)
            dog.beat()
    assert dog.stalls == 0 and not caplog.records


def test_zero_turns_it_off():
    with ProgressWatchdog("shard x", 0) as dog:
        assert dog._thread is None


STALL = """
import logging, time
from raypack.pack.watchdog import ProgressWatchdog
logging.basicConfig(level=logging.INFO, format="%(message)s")
with ProgressWatchdog("shard s", 0.2, restart=True):
    time.sleep(30)
"""


def test_restart_ends_the_process_after_saying_why():
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-c", STALL], capture_output=True, text=True, timeout=60)
    assert run.returncode == STALL_EXIT_CODE and time.monotonic() - started < 20
    assert "shard s has made no progress" in run.stderr and "Ray restarts it" in run.stderr


def test_a_packer_stuck_on_a_shard_is_named_in_a_run(tmp_path, monkeypatch, caplog):
    import raypack.pack.packer as shard_pack
    from raypack.pack.config import make_config
    from raypack.pack.job import run_pack
    from raypack.sample import write_sample_corpus

    write_sample_corpus(str(tmp_path / "c"), num_shards=3, docs_per_shard=20, mean_doc_len=10, seed=1)
    real = shard_pack.iter_document_batches

    def slow_on_shard_1(path, *args, **kwargs):
        for item in real(path, *args, **kwargs):
            if path.endswith("shard-00001.parquet"):
                time.sleep(1.0)  # a hung read
            yield item

    monkeypatch.setattr(shard_pack, "iter_document_batches", slow_on_shard_1)
    caplog.set_level(logging.WARNING, logger="raypack.pack.watchdog")
    config = make_config(dict(inputs=[str(tmp_path / "c")], output=str(tmp_path / "out"), context_length=16,
                              progress_timeout_s=0.25))
    run_pack(config, engine="local")
    stalled = {r.getMessage().split(" has made")[0] for r in caplog.records}
    assert stalled == {f"shard {tmp_path / 'c' / 'shard-00001.parquet'} (shard 1)"}
