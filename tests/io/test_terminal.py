"""What a user sees on the terminal (issue 15): one line for bad input found inside Ray workers,
for a worker that failed, for Ctrl-C and for an unreachable cluster; quiet closed pipes;
raypack's own progress line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raypack.cli import main
from raypack.errors import InputError, WorkerError
from raypack.io.progress import Progress
from raypack.io.terminal import interrupted_line
from raypack.outputs import read_packed

from helpers import write_long_token_shards

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write_parquet(path, docs, type=pa.list_(pa.int32())):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(pa.table({"input_ids": pa.array(docs, type)}), path)


def corpus(tmp_path, bad_docs):
    """in/a.parquet good, in/b.parquet with ``bad_docs`` (found only when a packer reads it)."""
    write_parquet(tmp_path / "in" / "a.parquet", [[1, 2, 3], [4]])
    write_parquet(tmp_path / "in" / "b.parquet", bad_docs)
    return str(tmp_path / "in")


BAD_DOCS = {
    "null document": ([[5, 6], None], [], "b.parquet row 1: the document is null"),
    "token too large for uint16": ([[5, 70000]], ["--token-dtype", "uint16"], "b.parquet row 0: token 70000"),
    "null token": ([[5, None, 7]], [], "b.parquet row 0: token 1 of the document is null"),
}


def assert_one_error_line(err: str, message: str, tmp_path) -> None:
    lines = [line for line in err.splitlines() if not line.startswith("packed ")]  # raypack's progress
    assert len(lines) == 1 and lines[0].startswith("raypack: error: ") and message in lines[0], err
    assert "Traceback" not in err and "RayTaskError" not in err, err
    assert sorted(os.listdir(tmp_path)) == ["in"], "no output, no staging, no lock"


# Each case once, the strategies alternating (each run starts Ray workers: ~5 s apiece in CI).
@pytest.mark.parametrize(("case", "strategy"),
                         [(case, ("best_fit", "concat")[k % 2]) for k, case in enumerate(sorted(BAD_DOCS))])
def test_bad_input_inside_a_ray_packer_is_one_line(ray_session, tmp_path, capsys, case, strategy):
    docs, extra, message = BAD_DOCS[case]
    root = corpus(tmp_path, docs)
    code = main(["pack", "--input", root, "--output", str(tmp_path / "out"), "--context-length", "4",
                 "--pad-token", "0", "--strategy", strategy, *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    assert_one_error_line(err, message, tmp_path)


def test_bad_text_inside_a_ray_tokenizer_is_one_line(ray_session, tmp_path, capsys):
    from tests.helpers import train_byte_level_bpe

    tok = tmp_path / "tok.json"
    train_byte_level_bpe(["hello world"] * 20, 300).save(str(tok))
    os.makedirs(tmp_path / "in")
    pq.write_table(pa.table({"text": ["hello", None]}), tmp_path / "in" / "t.parquet")
    code = main(["tokenize", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
                 "--tokenizer", str(tok)])
    err = capsys.readouterr().err
    os.remove(tok)
    assert code == 2, err
    lines = [line for line in err.splitlines() if not line.startswith("tokenized ")]
    assert len(lines) == 1 and "t.parquet row 1: 'text' is null" in lines[0], err
    assert sorted(os.listdir(tmp_path)) == ["in"]


def test_a_worker_failure_that_is_not_bad_input_is_one_line_naming_rays_logs():
    from raypack.engine.session import on_ray

    def crash(pipeline):
        raise RuntimeError("The actor died unexpectedly before finishing this task.\n  more detail")

    with pytest.raises(WorkerError) as info:
        on_ray(crash, "a packer")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("a packer on Ray failed: RuntimeError: The actor died unexpectedly") and "logs" in message
    with pytest.raises(InputError, match="bad shard"):
        on_ray(lambda pipeline: (_ for _ in ()).throw(InputError("bad shard")), "a packer")


def run_cli(*args, timeout=120, **kwargs):
    env = {**os.environ, "PYTHONPATH": REPO}
    kwargs.setdefault("stdout", subprocess.PIPE)
    return subprocess.run([sys.executable, "-m", "raypack.cli", *args], stderr=subprocess.PIPE, text=True,
                          timeout=timeout, env=env, cwd=REPO, **kwargs)


@pytest.mark.slow  # starts Ray or an S3 server: not the fast tier (tests/conftest.py)
def test_unreachable_address_fails_fast_with_one_line_and_no_staging(tmp_path):
    root = corpus(tmp_path, [[5, 6]])
    start = time.monotonic()
    proc = run_cli("pack", "--input", root, "--output", str(tmp_path / "out"), "--context-length", "4",
                   "--pad-token", "0", "--address", "127.0.0.1:1", timeout=60)
    assert time.monotonic() - start < 30
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "127.0.0.1:1" in lines[0] and "--address auto" in lines[0], proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["in"]


@pytest.mark.slow  # starts Ray or an S3 server: not the fast tier (tests/conftest.py)
def test_token_mode_without_a_token_is_one_line_and_no_staging(tmp_path):
    """RAY_AUTH_MODE=token, no token anywhere (a HOME without ~/.ray/auth_token): Ray's
    AuthenticationError becomes one line naming the variables, exit 2, before any staging dir."""
    import socket

    root = corpus(tmp_path, [[5, 6]])
    listener = socket.create_server(("127.0.0.1", 0))  # something listens: the reachability check passes
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(tmp_path / "home"), RAY_AUTH_MODE="token", PYTHONPATH=REPO)
    with listener:
        proc = subprocess.run([sys.executable, "-m", "raypack.cli", "pack", "--input", root, "--output",
                               str(tmp_path / "out"), "--context-length", "4", "--pad-token", "0",
                               "--address", address], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, timeout=60, env=env, cwd=REPO)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("raypack: error: could not connect"), proc.stderr
    assert address in lines[0] and "no authentication token" in lines[0] and "RAY_AUTH_TOKEN" in lines[0]
    assert sorted(os.listdir(tmp_path)) == ["in"]


def test_connect_hint_names_the_token_variables():
    from raypack.engine.connect import connect_hint

    hint = connect_hint("10.0.0.1:6379", ConnectionError("InvalidAuthToken: no token\nretrying"))
    assert "\n" not in hint and "RAY_AUTH_MODE=token" in hint and "RAY_AUTH_TOKEN_PATH" in hint
    assert "--address auto" in hint and "InvalidAuthToken" in hint and "check the address" in hint


def _stop_a_run(tmp_path, signum: int, engine: list[str], shards: int = 150) -> tuple[int, list[str], list[str]]:
    """``raypack pack`` in a child, sent ``signum`` (to it alone) once two tasks are recorded."""
    write_long_token_shards(tmp_path / "in", shards, 400)
    env = {**os.environ, "PYTHONPATH": REPO}
    args = ["pack", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
            "--context-length", "64", "--pad-token", "0", "--workers", "1", *engine]
    proc = subprocess.Popen([sys.executable, "-m", "raypack.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # not ignored
    records = tmp_path / ".out.raypack-staging-partial" / "_results"
    deadline = time.monotonic() + 240
    while not (records.is_dir() and len(os.listdir(records)) >= 2) and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    lines = [line for line in err.splitlines() if not line.startswith(("packed ", "Ray's logs are in "))]
    assert records.is_dir(), "the work is kept for --resume"
    return proc.returncode, args, lines


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_is_one_line_with_the_resume_command(tmp_path, signum):
    """On Ray, SIGINT once a few shards are packed: one line, exit 130, the work kept. SIGTERM (a
    scheduler's preemption, ``kill``): the same, exit 143; it was the core worker's stack trace
    (``*** SIGTERM received ...``) above "the run failed"."""
    code, args, lines = _stop_a_run(tmp_path, signum, [])
    assert code == (130 if signum == signal.SIGINT else 143), lines
    assert len(lines) == 1, lines
    what = "interrupted" if signum == signal.SIGINT else "terminated (SIGTERM)"
    assert lines[0].startswith(f"raypack: {what}; the finished work is kept in ") and "staging" in lines[0]
    assert lines[0].endswith("finish with: raypack " + " ".join(args) + " --resume"), lines


def test_sigterm_is_one_line_with_the_resume_command_locally(tmp_path):
    """``--local``: SIGTERM killed the process at once, with no line (exit -15)."""
    code, args, lines = _stop_a_run(tmp_path, signal.SIGTERM, ["--local", "--read-batch-size", "16"], shards=40)
    assert code == 143 and len(lines) == 1, lines
    assert lines[0].startswith("raypack: terminated (SIGTERM); the finished work is kept in "), lines
    assert main([*args, "--resume"]) == 0


_HANGING = """
import sys, threading, time
import raypack.tokenize.onepass as onepass
import raypack.packed.writer as writer

hang, marker = sys.argv[1], sys.argv[2]
real_tokenize, real_commit = onepass.tokenize_held, writer.AtomicFile.commit

def tokenize_held(text, *args):  # a read that hangs on a store that stopped answering, from the second task on
    if hang == "read" and text.task_index >= 1:
        open(marker, "w").close()
        time.sleep(600)
    return real_tokenize(text, *args)

uploads = []

def commit(self, *args):  # an upload on the publishing thread that hangs, from the second on
    if hang == "upload" and threading.current_thread().name.startswith("raypack-publish"):
        uploads.append(self)
        if len(uploads) >= 2:
            open(marker, "w").close()
            time.sleep(600)
    return real_commit(self, *args)

onepass.tokenize_held, writer.AtomicFile.commit = tokenize_held, commit
import raypack
sys.exit(raypack.console_main(sys.argv[3:]))
"""


@pytest.mark.parametrize("hang", ["read", "upload"])
def test_sigterm_ends_a_run_whose_read_or_upload_hangs_within_seconds(tmp_path, hang):
    """A store that stopped answering (an S3 server frozen mid-run): each read or upload in flight waits out
    its timeouts and retries, and a SIGTERM took 590 s to end the run (an operator's trial). Now the command
    waits at most JOIN_TIMEOUT_S for its background jobs, all together, prints its line and leaves: exit 143."""
    from helpers import CORPUS, train_byte_level_bpe

    train_byte_level_bpe(CORPUS * 20, 600).save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "in").mkdir()
    for k in range(4):
        (tmp_path / "in" / f"part-{k}.jsonl").write_text("".join(
            json.dumps({"text": f"{k} {i} " + CORPUS[i % len(CORPUS)]}) + "\n" for i in range(300)))
    script = tmp_path / "hanging.py"
    script.write_text(_HANGING)
    args = ["pack", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--context-length", "64",
            "--tokenizer", str(tmp_path / "tokenizer.json"), "--local"]
    marker = tmp_path / "hanging"
    env = {**os.environ, "PYTHONPATH": REPO}
    proc = subprocess.Popen([sys.executable, str(script), hang, str(marker), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert marker.exists(), proc.communicate()
    time.sleep(0.3)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=90)
    finally:
        proc.kill()
    took = time.monotonic() - sent
    assert proc.returncode == 143, err
    assert took < 20, took  # the stop's one shared 10 s deadline (raypack.io.threads), not the hang's 600 s
    lines = err.strip().splitlines()
    assert lines[-1].startswith("raypack: terminated (SIGTERM)") and lines[-1].endswith("--resume"), err
    assert "Traceback" not in err


@pytest.fixture
def signals_kept(monkeypatch):
    """console_main sets SIGINT and SIGTERM handlers (ignored once it returns): put this process's back."""
    from raypack.io import terminal

    monkeypatch.setattr(terminal, "_TERMINATED", [])
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


def test_console_sigterm_is_the_ctrl_c_line_and_143(monkeypatch, capsys, signals_kept):
    import raypack
    import raypack.cli

    def main(argv=None):
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)  # the KeyboardInterrupt is raised here
        raise AssertionError("not stopped")

    monkeypatch.setattr(raypack.cli, "main", main)
    monkeypatch.delitem(sys.modules, "ray", raising=False)  # else, as on Ray, it would leave the process
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as a shell gives it
    assert raypack.console_main() == 143
    assert capsys.readouterr().err == "raypack: terminated (SIGTERM); nothing was written\n"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN  # Ray's shutdown at exit runs whole


def test_console_ctrl_c_while_the_cli_loads_is_one_line(monkeypatch, capsys, signals_kept):
    """A Ctrl-C before main's own handler runs (importing numpy and pyarrow, building the parser)
    was a traceback."""
    import raypack
    import raypack.cli

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(raypack.cli, "main", interrupted)
    monkeypatch.delitem(sys.modules, "ray", raising=False)  # else, as on Ray, it would leave the process
    before = signal.getsignal(signal.SIGINT)
    try:
        assert raypack.console_main() == 130
    finally:
        signal.signal(signal.SIGINT, before)
    assert capsys.readouterr().err == "raypack: interrupted; nothing was written\n"


def test_console_ignores_a_second_ctrl_c_after_the_first(monkeypatch, capsys, signals_kept):
    """Two SIGINTs (a double tap; ``timeout`` signals the child and its group): one line, not a
    traceback from the second landing in the first one's handler or in Ray's shutdown at exit."""
    import raypack
    import raypack.cli

    def main():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)  # the KeyboardInterrupt is raised here
        raise AssertionError("not interrupted")

    def main_twice(argv=None):
        try:
            main()
        except KeyboardInterrupt:
            os.kill(os.getpid(), signal.SIGINT)  # the second, while the first is handled
            time.sleep(0.01)
            print("raypack: interrupted; the finished work is kept", file=sys.stderr)
            return 130

    monkeypatch.setattr(raypack.cli, "main", main_twice)
    monkeypatch.delitem(sys.modules, "ray", raising=False)  # else, as on Ray, it would leave the process
    before = signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as a shell gives it (pytest-xdist may not)
        assert raypack.console_main() == 130
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
    assert capsys.readouterr().err == "raypack: interrupted; the finished work is kept\n"


def test_interrupted_line():
    assert interrupted_line(["pack", "--output", "o o"], "/x/s") == (
        "raypack: interrupted; the finished work is kept in /x/s; finish with: raypack pack --output 'o o' --resume")
    assert interrupted_line(["pack", "--resume"], "/x/s").endswith("raypack pack --resume")
    assert interrupted_line(["pack"], None) == "raypack: interrupted; nothing was written"
    assert interrupted_line(["pack", "--overwrite", "--output", "o"], "/x/s").endswith(
        "finish with: raypack pack --output o --resume")  # --overwrite and --resume are refused together


def test_lines_stay_one_line_whatever_a_path_holds(tmp_path, capsys):
    """A hostile trial: a file named with a newline made the error two lines, and the interrupted line's
    command broke where a shell would take it as two. Control characters are escaped, and the command uses
    bash's $'...' quoting, which a shell reads back as the same path."""
    line = interrupted_line(["pack", "--input", "a\nb.jsonl", "--output", "it's"], "/x/s\n")
    assert "\n" not in line
    assert line.endswith("""finish with: raypack pack --input $'a\\x0ab.jsonl' --output 'it'"'"'s' --resume""")
    assert "kept in /x/s\\n;" in line
    said = subprocess.run(["bash", "-c", "printf %s " + line.split("--input ")[1].split(" --output")[0]],
                          capture_output=True, text=True).stdout
    assert said == "a\nb.jsonl"
    bad = tmp_path / "bad\nname.jsonl"
    bad.write_text('{"text": 5}\n')
    assert main(["pack", "--local", "--input", str(bad), "--output", str(tmp_path / "out"), "--context-length", "8",
                 "--tokenizer", "tiktoken:cl100k_base"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad\\nname.jsonl line 1: 'text' is a JSON number" in err, err


def test_info_and_warning_lines_stay_one_line_whatever_a_path_holds(tmp_path):
    """Left open at stop 55: the error lines were escaped, the WARNING and INFO lines were not, so an output
    named with a newline broke verify's warning in two (a terminal shows the second half as its own line)."""
    out = tmp_path / "out\nput"
    assert main(["pack", "--local", "--input", corpus(tmp_path, [[5, 6]]), "--output", str(out),
                 "--context-length", "4"]) == 0
    (out / "notes.txt").write_text("mine")
    said = run_cli("verify", str(out)).stderr
    warning = [line for line in said.splitlines() if "does not list" in line]
    assert len(warning) == 1 and warning[0].startswith(f"{tmp_path}/out\\nput holds 'notes.txt'"), said


@pytest.mark.parametrize("typed, said", [(".venv/bin/raypack", ".venv/bin/raypack"), ("/x y/raypack", "'/x y/raypack'"),
                                         ("/x/raypack/cli/__main__.py", "raypack")])
def test_the_interrupted_line_names_the_command_as_it_was_typed(monkeypatch, typed, said):
    """A new user ran .venv/bin/raypack as the README says; the line said "finish with: raypack ...", which
    is not on the PATH outside the venv."""
    monkeypatch.setattr(sys, "argv", [typed, "pack"])
    assert interrupted_line(["pack", "--output", "o"], "/x/s").endswith(f"finish with: {said} pack --output o --resume")


@pytest.mark.parametrize("command", ["verify", "stats"])
def test_a_closed_pipe_ends_quietly(tmp_path, command):
    root = corpus(tmp_path, [[5, 6], [7]])
    out = str(tmp_path / "out")
    assert main(["pack", "--local", "--input", root, "--output", out, "--context-length", "4", "--pad-token", "0"]) == 0
    read_end, write_end = os.pipe()
    os.close(read_end)  # like `| head` that has already exited
    try:
        proc = run_cli(command, out, stdout=write_end)
    finally:
        os.close(write_end)
    assert proc.returncode in (0, 141), proc.stderr
    assert proc.stderr == "", proc.stderr


def test_progress_is_at_most_one_line_a_second(caplog):
    now = [0.0]
    progress = Progress("packed", 16, "shards", clock=lambda: now[0])
    with caplog.at_level("INFO", logger="raypack.io.progress"):
        for k in range(16):
            now[0] = 0.4 * (k + 1)
            progress.add(600_000)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 6, lines  # at 1.2, 2.4, 3.6, 4.8, 6.0 s and the last shard
    assert lines[0] == "packed 3/16 shards, 1.5M tokens/s"  # 0.8 s since the first: no pace yet, no ETA
    assert lines[1] == "packed 6/16 shards, 1.5M tokens/s, ETA 4s"  # 0.4 s a shard since the first
    assert lines[-1] == "packed 16/16 shards, 1.5M tokens/s"


def test_progress_paces_from_the_first_finished_item(caplog):
    """Start-up (Ray's, 20 s here) before the first item is not the pace of the rest: 0.5 s a shard."""
    now = [0.0]
    progress = Progress("packed", 11, "shards", clock=lambda: now[0])
    with caplog.at_level("INFO", logger="raypack.io.progress"):
        now[0] = 20.0
        progress.add(1_000_000)
        for _ in range(2):
            now[0] += 0.5
            progress.add(1_000_000)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["packed 1/11 shards, 50.0k tokens/s", "packed 3/11 shards, 2.0M tokens/s, ETA 4s"]


def test_progress_of_items_that_finish_together_is_the_pace_since_the_start(caplog):
    """Eight workers' tasks finishing within a millisecond of each other: not tokens over microseconds."""
    now = [0.0]
    progress = Progress("packed", 4, "tasks", clock=lambda: now[0])
    with caplog.at_level("INFO", logger="raypack.io.progress"):
        for k in range(4):
            now[0] = 2.0 + k * 1e-4
            progress.add(1_500_000)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["packed 1/4 tasks, 750.0k tokens/s", "packed 4/4 tasks, 3.0M tokens/s"]


def test_progress_counts_kept_items_as_done_but_not_in_the_pace(caplog):
    now = [0.0]
    progress = Progress("packed", 6, "tasks", clock=lambda: now[0])
    with caplog.at_level("INFO", logger="raypack.io.progress"):
        for _ in range(4):
            progress.add(10_000_000, kept=True)  # at once, from their resume records
        for _ in range(2):
            now[0] += 1.0
            progress.add(1_000_000)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[-1] == "packed 6/6 tasks, 1.0M tokens/s (4 kept from the run before)"
    assert lines[0] == "packed 5/6 tasks, 1.0M tokens/s (4 kept from the run before)"  # no pace yet: no ETA


def test_progress_gives_no_rate_while_only_kept_items_have_finished(caplog):
    """Kept items met after Ray's start-up: the line said "0 tokens/s (1 kept from the run before)"."""
    now = [0.0]
    progress = Progress("packed", 3, "shards", clock=lambda: now[0])
    with caplog.at_level("INFO", logger="raypack.io.progress"):
        now[0] = 5.0
        progress.add(10_000_000, kept=True)
        now[0] = 6.5
        progress.add(2_000_000)
        now[0] = 8.0
        progress.add(10_000_000, kept=True)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["packed 1/3 shards (1 kept from the run before)",
                     "packed 2/3 shards, 307.7k tokens/s (1 kept from the run before)",
                     "packed 3/3 shards, 250.0k tokens/s (2 kept from the run before)"]
    every = Progress("packed", 1, "shards", clock=lambda: now[0])
    assert every.add(5, kept=True) is None and every.line(now[0]) == "packed 1/1 shards (1 kept from the run before)"


@pytest.mark.slow
def test_a_fresh_ray_run_shows_only_raypacks_lines(tmp_path):
    """A new process with its own Ray: no Ray INFO/WARNING/C++ lines, no tracebacks; the one error line."""
    root = corpus(tmp_path, [[5, 6], None])
    proc = run_cli("pack", "--input", root, "--output", str(tmp_path / "out"), "--context-length", "4",
                   "--pad-token", "0", "--workers", "1", timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("packed ")]
    assert lines[0].startswith("Ray's logs are in ") and lines[0].endswith("(-v shows them here)"), proc.stderr
    assert len(lines) == 2 and lines[1].startswith("raypack: error: ") and "b.parquet row 1" in lines[1], proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["in"]


@pytest.mark.slow
def test_the_python_apis_ray_reads_are_as_quiet_as_the_cli(tmp_path):
    """read_packed(out).to_ray_dataset() in a fresh script: Ray starts quietly (no INFO / WARNING /
    C++ log lines on stderr), as under the CLI; the chunks come back in order."""
    root = corpus(tmp_path, [[5, 6, 7]])
    assert main(["pack", "--local", "--input", root, "--output", str(tmp_path / "out"), "--context-length", "2"]) == 0
    script = ("import numpy as np\nfrom raypack import read_packed\n"
              f"ds = read_packed({str(tmp_path / 'out')!r}).to_ray_dataset()\n"
              "rows = ds.take_all()\nprint(len(rows), [list(r['input_ids']) for r in rows][:1])\n")
    env = {**os.environ, "PYTHONPATH": REPO}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env,
                          cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0] == str(len(read_packed(str(tmp_path / "out")))), proc.stdout
    noisy = [line for line in proc.stderr.splitlines() if line.strip()]
    assert noisy == [], proc.stderr


def test_a_ctrl_c_once_the_command_has_ended_is_ignored(monkeypatch, signals_kept):
    """A Ctrl-C after the output was published, while Ray shut down at exit, was a KeyboardInterrupt
    traceback in Ray's atexit callback (exit 0 under it): once main returns, SIGINT is ignored."""
    import raypack
    import raypack.cli

    monkeypatch.setattr(raypack.cli, "main", lambda argv=None: 0)
    monkeypatch.delitem(sys.modules, "ray", raising=False)  # else, as on Ray, it would leave the process
    before = signal.getsignal(signal.SIGINT)
    try:
        assert raypack.console_main() == 0
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_sigterm_while_ray_starts_is_the_terminated_line(monkeypatch, signals_kept):
    """Ray's own SIGTERM handlers, active inside ray.init, leave by sys.exit(15) (or 1 once its node
    is up): the command exited 15 with no line. Now it is raypack's SIGTERM: its line, exit 143."""
    from raypack.engine import pipeline
    from raypack.io import terminal

    def init(*args, **kwargs):
        raise SystemExit(signal.SIGTERM)

    monkeypatch.setattr(pipeline.ray, "init", init)
    monkeypatch.setattr(pipeline.ray, "is_initialized", lambda: False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    signal.signal(signal.SIGTERM, lambda signum, frame: None)  # the command's own (stop_on_sigterm's)
    with pytest.raises(KeyboardInterrupt):
        pipeline.init_ray(None, verbose=False)
    assert terminal.interrupted_code() == 143
    assert terminal.interrupted_line(["pack"], None) == "raypack: terminated (SIGTERM); nothing was written"


@pytest.mark.slow
def test_a_sigterm_after_a_finished_ray_run_does_not_fail_it(tmp_path):
    """Ray's shutdown at exit set SIGTERM back to its default action: a SIGTERM in the second after
    the summary killed a finished run (-15). Now the embedded Ray is left to its reaper: exit 0."""
    write_long_token_shards(tmp_path / "in", 4, 100)
    args = ["pack", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--context-length", "64",
            "--pad-token", "0"]
    proc = subprocess.Popen([sys.executable, "-m", "raypack.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": REPO})
    for line in proc.stdout:
        if line.strip().startswith("time"):
            break
    deadline = time.monotonic() + 3
    while proc.poll() is None and time.monotonic() < deadline:  # SIGTERMs all through the exit
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.05)
    proc.communicate(timeout=120)
    assert proc.returncode == 0
    assert (tmp_path / "out" / "manifest.json").is_file()


def test_a_signal_once_the_command_is_done_is_ignored_and_only_raypacks_handlers_are_touched():
    """A SIGTERM as the summary was flushed turned a finished run into exit 143 (CI saw it once in
    test_a_sigterm_after_a_finished_ray_run_does_not_fail_it): command_done() ignores signals from there,
    where raypack's own handlers are installed; a caller's handler is left as it is."""
    code = ("import os, signal\n"
            "from raypack.io.terminal import command_done, stop_on_sigterm\n"
            "stop_on_sigterm()\n"
            "try:\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    for _ in range(1000): pass\n"
            "    print('not stopped')\n"
            "except KeyboardInterrupt:\n"
            "    print('stopped')\n"
            "signal.signal(signal.SIGTERM, signal.SIG_DFL); stop_on_sigterm(); command_done()\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "for _ in range(1000): pass\n"
            "print('done')\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": REPO})
    assert run.returncode == 0 and run.stdout.split() == ["stopped", "done"], run.stderr[-500:]

    from raypack.io.terminal import command_done

    def callers(signum, frame):
        pass

    before = signal.signal(signal.SIGTERM, callers)
    try:
        command_done()
        assert signal.getsignal(signal.SIGTERM) is callers
    finally:
        signal.signal(signal.SIGTERM, before)
