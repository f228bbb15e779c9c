"""``JsonlFileSink`` when the file system fails it: a full disk part-way through a line, a file
deleted while written, a file that cannot be synchronised (docs/sdk.md "Delivery").

The full disk is real: a child interpreter limits its own file size (``RLIMIT_FSIZE``: the
kernel writes what fits, then fails the write, as on a full disk), then lifts the limit, as
space is freed, before the agent's retry."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fanin.contracts.parsing import parse_message
from fanin.sdk import Emitter, JoinContext, JsonlFileSink, NotDurableError, PublishError
from fanin.sdk.sinks import EncodedMessage
from tests.support.child_env import same_code_env

# argv: path, how many bytes of the receipt's line fit before the disk is full
_FULL_DISK_AGENT = """
import os, resource, sys
from fanin.sdk import Emitter, JoinContext, JsonlFileSink, PublishError
path, room = sys.argv[1], int(sys.argv[2])
emitter = Emitter(JsonlFileSink(path))
ctx = JoinContext.new(join_id="p1")
emitter.open(ctx, required=["a"], deadline_s=5)
resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(path) + room, resource.RLIM_INFINITY))
try:
    emitter.emit(ctx, "a", "ok", value="x" * 300)
except PublishError as exc:
    print(type(exc.failures[0][1]).__name__, exc.failures[0][1].errno)
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
emitter.emit(ctx, "a", "ok", value="y")  # the agent's retry: attempt 2
emitter.close()
"""


def _full_disk(tmp_path: Path, room: int) -> tuple[str, list[bytes]]:
    path = tmp_path / "agent.jsonl"
    done = subprocess.run([sys.executable, "-c", _FULL_DISK_AGENT, str(path), str(room)],
                          capture_output=True, text=True, env=same_code_env(), check=True)
    return done.stdout, path.read_bytes().split(b"\n")


def _parsed(line: bytes) -> tuple[dict[str, object] | None, str | None]:
    """The line's message (its JSON) when the pipeline's parser takes it, else its code."""
    record, letter = parse_message(line, {}, set())
    return (json.loads(line), None) if record is not None else (None, letter and letter["error"])


def test_a_line_a_full_disk_cut_short_never_spoils_the_retry(tmp_path: Path) -> None:
    said, lines = _full_disk(tmp_path, room=100)
    assert said.split() == ["OSError", str(errno.EFBIG)]  # a PublishError, its cause given
    opened, cut, retry, end = lines
    assert len(cut) == 100 and end == b""  # the part of the line that fitted, on its own
    assert _parsed(cut) == (None, "invalid_json")
    assert _parsed(opened)[0] is not None
    message, _ = _parsed(retry)
    assert message is not None and message["value"] == "y" and message["attempt"] == 2


def test_a_line_missing_only_its_newline_is_read_and_the_retry_supersedes_it(
        tmp_path: Path) -> None:
    probe = tmp_path / "probe.jsonl"
    with Emitter(JsonlFileSink(probe)) as emitter:  # a line of the same length
        emitter.emit(JoinContext.new(join_id="p1"), "a", "ok", value="x" * 300)
    size = len(probe.read_bytes()) - 1
    said, lines = _full_disk(tmp_path, room=size)
    assert said.split() == ["OSError", str(errno.EFBIG)]
    _, first, retry, end = lines
    assert end == b""
    attempts = [(m["value"], m["attempt"]) for m in (_parsed(first)[0], _parsed(retry)[0])
                if m is not None]
    assert attempts == [("x" * 300, 1), ("y", 2)]


def test_a_file_deleted_while_written_takes_no_more_lines(tmp_path: Path) -> None:
    path = tmp_path / "gone" / "agent.jsonl"
    path.parent.mkdir()
    sink = JsonlFileSink(path)
    sink.publish(EncodedMessage("{}", "j", "m1", "t"))
    path.unlink()
    path.parent.rmdir()
    message = EncodedMessage("{}", "j", "m2", "t")
    with pytest.raises(PublishError, match="deleted") as refused:
        sink.publish(message)
    assert refused.value.failures[0][0] is message
    with pytest.raises(NotDurableError, match="1 message") as lost:  # m1 went with the file
        sink.flush()
    assert lost.value.count == 1 and isinstance(lost.value.cause, FileNotFoundError)
    sink.close()  # nothing written since: nothing to report


def test_a_file_replaced_at_its_path_is_not_taken_for_a_deleted_one(tmp_path: Path) -> None:
    path = tmp_path / "agent.jsonl"
    with JsonlFileSink(path) as sink:
        sink.publish(EncodedMessage("{}", "j", "m1", "t"))
        path.rename(tmp_path / "rotated.jsonl")  # a log rotation: the lines are kept there
        sink.publish(EncodedMessage("{}", "j", "m2", "t"))
    assert (tmp_path / "rotated.jsonl").read_text() == "{}\n{}\n"


def test_a_pipe_has_nothing_to_synchronise(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    try:
        with JsonlFileSink(f"/dev/fd/{write_end}") as sink:
            sink.publish(EncodedMessage('{"a":1}', "j", "m", "t"))
            sink.flush()
        assert os.read(read_end, 100) == b'{"a":1}\n'
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_full_device_refuses_the_message_as_a_publish_error() -> None:
    sink = JsonlFileSink("/dev/full")
    message = EncodedMessage("{}", "j", "m", "t")
    with pytest.raises(PublishError) as refused:
        sink.publish(message)
    failed, cause = refused.value.failures[0]
    assert failed is message and isinstance(cause, OSError) and cause.errno == errno.ENOSPC
    sink.close()  # a device that cannot be synchronised: no failure
