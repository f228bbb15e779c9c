"""``fanin publish`` against Google's Pub/Sub emulator (real client): the line
rule of ``fanin run --input``, failures by kind, waiting for a service that is down, Ctrl-C."""

from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support.child_env import same_code_env
from support.emulator import PubSubEmulator, wait_for
from support.fanin_runs import jsonl_lines

from fanin.cli import main as fanin_main
from fanin.io.publish import publish_file
from fanin.transforms.read import numbered_lines

FANIN = [sys.executable, "-c", "import sys; from fanin.cli import main; sys.exit(main())"]

OPEN = json.dumps({"join_id": "j", "kind": "open", "opened_at": "2026-01-01T00:00:00Z",
                   "required": ["a"]}).encode()
RECEIPT = json.dumps({"join_id": "j", "branch": "a", "status": "ok",
                      "event_time": "2026-01-01T00:00:01Z", "opened_at": "2025-12-31T23:59:59Z",
                      "message_id": "m-1"}).encode()
# a byte order mark, CRLF, an empty line, a whitespace-only line, a line that is not UTF-8
CONTENT = b"\xef\xbb\xbf" + OPEN + b"\r\n\n" + RECEIPT + b"\n   \n\t\r\nnot json \xff\n"


def fanin(*argv: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FANIN, *argv], capture_output=True, text=True, timeout=timeout_s,
                          env=same_code_env())


def receipts_file(path: Path, count: int) -> Path:
    path.write_text("".join(
        json.dumps({"join_id": f"j{i // 5}", "branch": f"b{i % 5}", "status": "ok",
                    "event_time": "2026-01-01T00:00:01Z", "value": i}) + "\n"
        for i in range(count)), encoding="utf-8")
    return path


def test_publish_sends_exactly_the_messages_fanin_run_reads(
        pubsub_emulator: PubSubEmulator, tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(CONTENT)
    topic, subscription = pubsub_emulator.topic_and_subscription("lines")
    done = fanin("publish", "--topic", topic, "--progress-every", "2", str(path))
    assert (done.returncode, done.stdout) == (0, "sent=5 failed=0\n"), done.stderr
    assert done.stderr.splitlines() == ["published 2 (failed 0)", "published 4 (failed 0)"]
    expected = [line for line, _ in numbered_lines(str(path))]  # fanin run --input's messages
    assert expected == [OPEN, RECEIPT, b"   ", b"\t", b"not json \xff"]
    got = pubsub_emulator.collect(subscription, lambda msgs: len(msgs) >= 5, 30)
    assert sorted(m.data for m in got) == sorted(expected)
    attributes = {m.data: dict(m.attributes) for m in got}
    assert attributes[OPEN] == {"event_time": "2026-01-01T00:00:00Z"}
    assert attributes[RECEIPT] == {"event_time": "2026-01-01T00:00:01Z", "message_id": "m-1"}
    # ...and fanin run --input dead-letters the same whitespace-only lines
    out = tmp_path / "out"
    assert fanin_main(["run", "--input", str(path), "--output", str(out)]) == 0
    dead = [json.loads(line) for f in (out / "dead_letter").glob("*.jsonl")
            for line in jsonl_lines(f)]
    assert sorted(d["raw"] for d in dead if d["error"] == "invalid_json") == ["\t", "   "]


def test_a_missing_topic_is_one_line_per_kind_of_failure(
        pubsub_emulator: PubSubEmulator, tmp_path: Path) -> None:
    path = receipts_file(tmp_path / "in.jsonl", 5000)
    missing = f"projects/{pubsub_emulator.project}/topics/never-created"
    done = fanin("publish", "--topic", missing, "--progress-every", "0", str(path))
    assert (done.returncode, done.stdout) == (1, "sent=0 failed=5000\n")
    (line,) = done.stderr.splitlines()
    assert line.startswith("failed: 5000 x NotFound: 404 ") and line.endswith("(lines 1-5000)")


def test_with_the_emulator_down_it_says_it_waits_and_gives_up(
        pubsub_emulator: PubSubEmulator, tmp_path: Path) -> None:
    path = receipts_file(tmp_path / "in.jsonl", 3000)
    topic = pubsub_emulator.topic("down")
    pubsub_emulator.stop()
    try:
        done = fanin("publish", "--topic", topic, "--timeout", "4", str(path), timeout_s=60)
    finally:
        pubsub_emulator.restart()
    assert (done.returncode, done.stdout) == (1, "sent=0 failed=3000\n"), done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].startswith(f"fanin publish: waiting for the Pub/Sub emulator at "
                               f"{pubsub_emulator.host} (PUBSUB_EMULATOR_HOST): nothing "
                               "confirmed for ")
    assert lines[0].endswith("giving up after 4 s (--timeout)")
    assert lines[1:] == [  # MAX_IN_FLIGHT messages handed to the client, the rest never sent
        "failed: 2000 x not sent: no confirmation from Pub/Sub for 4 s (gave up) "
        "(lines 1001-3000)",
        "failed: 1000 x not confirmed: no confirmation from Pub/Sub for 4 s (gave up); it may "
        "still arrive (lines 1-1000)"]
    assert "Traceback" not in done.stderr


def test_ctrl_c_prints_the_counts_and_exits_130(pubsub_emulator: PubSubEmulator,
                                                 tmp_path: Path) -> None:
    path = receipts_file(tmp_path / "in.jsonl", 200_000)
    topic, subscription = pubsub_emulator.topic_and_subscription("ctrlc", ack_deadline_s=60)
    child = subprocess.Popen([*FANIN, "publish", "--topic", topic, "--progress-every", "1000",
                              str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=same_code_env())
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(child.stderr), daemon=True)
    reader.start()
    try:
        assert wait_for(lambda: any(line.startswith("published") for line in err), 60), err
        child.send_signal(signal.SIGINT)
        out, _ = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    reader.join(10)
    assert child.returncode == 130, err
    assert "Traceback" not in "".join(err)
    sent, failed = (int(part.split("=")[1]) for part in out.split())
    assert out == f"sent={sent} failed={failed}\n" and failed == 0
    assert 1000 <= sent < 200_000
    got = pubsub_emulator.collect(subscription, lambda msgs: len(msgs) >= sent, 60)
    assert len({m.data for m in got}) == sent  # what arrived is exactly what it counted
    assert pubsub_emulator.pull(subscription) == []


def test_without_credentials_or_emulator_it_says_so_in_one_line(tmp_path: Path) -> None:
    path = receipts_file(tmp_path / "in.jsonl", 3)
    env = {name: value for name, value in same_code_env().items()
           if name not in ("PUBSUB_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS")}
    env.update(CLOUDSDK_CONFIG=str(tmp_path / "gcloud"), NO_GCE_CHECK="True")
    done = subprocess.run([*FANIN, "publish", "--topic", "projects/my-project/topics/receipts",
                           str(path)], capture_output=True, text=True, timeout=60, env=env)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.splitlines() == [
        "fanin publish: error: no Google credentials: set PUBSUB_EMULATOR_HOST=HOST:PORT to use "
        "the Pub/Sub emulator, or set up Application Default Credentials"]


def test_publish_reads_a_compressed_file_as_fanin_run_does(
        pubsub_emulator: PubSubEmulator, tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl.gz"
    path.write_bytes(gzip.compress(CONTENT))
    topic, subscription = pubsub_emulator.topic_and_subscription("gzipped")
    done = fanin("publish", "--topic", topic, str(path))
    assert (done.returncode, done.stdout) == (0, "sent=5 failed=0\n"), done.stderr
    got = pubsub_emulator.collect(subscription, lambda msgs: len(msgs) >= 5, 30)
    assert sorted(m.data for m in got) == sorted([OPEN, RECEIPT, b"   ", b"\t", b"not json \xff"])


def test_a_line_beyond_pubsubs_limit_fails_alone_and_is_never_held_whole(
        pubsub_emulator: PubSubEmulator, tmp_path: Path) -> None:
    """docs/spec.md §1 "Long lines": 50 MB in one line of a small .gz (it was decompressed
    and held whole, then refused by the client) is one failure; the others are sent."""
    path = tmp_path / "in.jsonl.gz"
    path.write_bytes(gzip.compress(OPEN + b"\n" + b"x" * 50_000_000 + b"\n" + RECEIPT + b"\n"))
    topic, subscription = pubsub_emulator.topic_and_subscription("long-line")
    done = fanin("publish", "--topic", topic, "--progress-every", "0", str(path))
    assert (done.returncode, done.stdout) == (1, "sent=2 failed=1\n"), done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("failed: 1 x MessageTooLargeError: ") and line.endswith("(line 2)")
    got = pubsub_emulator.collect(subscription, lambda msgs: len(msgs) >= 2, 30)
    assert sorted(m.data for m in got) == sorted([OPEN, RECEIPT])


def test_a_file_not_of_its_suffixs_format_is_one_line_and_nothing_is_sent(
        pubsub_emulator: PubSubEmulator, tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl.gz"
    path.write_bytes(CONTENT)  # not gzip
    topic, subscription = pubsub_emulator.topic_and_subscription("not-gzip")
    done = fanin("publish", "--topic", topic, str(path))
    assert done.returncode == 2
    assert done.stderr.startswith(f"fanin publish: error: input {path} cannot be decompressed "
                                  "at its start (zlib.error: ")
    assert len(done.stderr.splitlines()) == 1 and done.stdout == ""
    assert pubsub_emulator.pull(subscription) == []


def test_a_file_cut_short_sends_and_counts_the_lines_before_the_cut(
        pubsub_emulator: PubSubEmulator, tmp_path: Path) -> None:
    """The lines before the damage were published, and no count was printed (exit 2, no
    ``sent=N failed=M``): what went out was counted nowhere."""
    whole = gzip.compress(receipts_file(tmp_path / "in.jsonl", 3000).read_bytes())
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(whole[:len(whole) // 2])
    topic, subscription = pubsub_emulator.topic_and_subscription("cut")
    done = fanin("publish", "--topic", topic, "--progress-every", "0", str(path))
    (line,) = done.stderr.splitlines()
    read = int(line.split("after line ")[1].split()[0])
    assert line.startswith(f"fanin publish: error: input {path} cannot be decompressed after "
                           f"line {read} (the file is cut short)")
    assert (done.returncode, done.stdout) == (2, f"sent={read} failed=0\n")
    assert 0 < read < 3000
    got = pubsub_emulator.collect(subscription, lambda msgs: len(msgs) >= read, 30)
    assert sorted(json.loads(m.data)["value"] for m in got) == list(range(read))


def test_bad_use_is_one_line_before_anything_is_sent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A ``PUBSUB_EMULATOR_HOST`` that is not HOST:PORT (the client took it and waited, then
    failed every message: ``sent=0 failed=117``, exit 1; a newline in it split the error), a
    folder as FILE (it said ``no such file``); a negative ``--progress-every`` (accepted)."""
    data = tmp_path / "in.jsonl"
    data.write_bytes(OPEN + b"\n")
    topic = ["--topic", "projects/my-project/topics/fanin-in"]
    for host in ("garbage", "127.0.0.1:99999", "::::", "a\nb:1"):
        monkeypatch.setenv("PUBSUB_EMULATOR_HOST", host)
        assert fanin_main(["publish", *topic, str(data)]) == 2
        assert capsys.readouterr().err.splitlines() == [
            f"fanin publish: error: PUBSUB_EMULATOR_HOST={host!r}: give HOST:PORT (such as "
            "localhost:8085), or unset it to use Pub/Sub"]
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", "localhost:1")
    assert fanin_main(["publish", *topic, str(tmp_path)]) == 2
    assert capsys.readouterr().err.splitlines() == \
        [f"fanin publish: error: a folder, not a file: {tmp_path}"]
    fifo = tmp_path / "fifo"  # what <(...) gives: it was refused with no way out named
    os.mkfifo(fifo)
    assert fanin_main(["publish", *topic, str(fifo)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "fanin publish: error: not a regular file (a pipe or a device: give - and send it to "
        f"standard input): {fifo}"]
    with pytest.raises(SystemExit) as refused:
        fanin_main(["publish", *topic, "--progress-every", "-1", str(data)])
    assert refused.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == \
        "fanin: error: argument --progress-every: must be >= 0, not -1"


def test_ctrl_c_while_it_waits_for_confirmations_is_an_interrupt(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every line read, the confirmations awaited (nothing listens at the emulator's address),
    then Ctrl-C: the messages in flight get the grace period and count as interrupted (exit
    130), where the wait's end was taken for a timeout (exit 1, "not confirmed ... gave up")."""
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", f"127.0.0.1:{port}")
    stop = threading.Event()
    summary = publish_file("projects/my-project/topics/receipts",
                           str(receipts_file(tmp_path / "in", 20)),
                           timeout_s=30, waiting=lambda silent_s: stop.set(), stop=stop,
                           grace_s=0.5)
    assert (summary.sent, summary.failed, summary.interrupted) == (0, 20, True)
    assert [(k.error, k.count) for k in summary.kinds] == [
        ("interrupted before Pub/Sub confirmed it (it may still arrive)", 20)]
