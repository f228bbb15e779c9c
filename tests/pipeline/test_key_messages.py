"""The bounded plan's read and key step: the read gives a file's messages in chunks
(fanin.transforms.read.numbered_chunks); the key step (fanin.transforms.parse.KeyMessages'
DoFn) keys each chunk: every message leaves exactly once, keyed by its join_id, a join's
messages of one chunk packed into one value (fanin.transforms.parse.PackedMessages), a
message without a join to key by as its dead letter; chunks leave in the order they came,
also when helpers key them and answer out of order."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apache_beam import pvalue
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.windowed_value import WindowedValue
from support.builders import make_catalog, open_msg, receipt

from fanin.transforms import parse, read
from fanin.transforms.parse import PackedMessages
from fanin.transforms.read import Message, is_full, numbered_chunks, numbered_lines

CONTRACTS = frozenset(make_catalog().contracts)


def _lines(joins: int = 3, receipts: int = 9) -> list[Message]:
    texts = [json.dumps(open_msg(f"j{n}")) for n in range(joins)]
    texts += [json.dumps(receipt(f"b{n}", n, f"j{n % joins}")) for n in range(receipts)]
    texts.insert(5, '{"branch": "no join"}')
    return [(text.encode(), ("in.jsonl", n + 1)) for n, text in enumerate(texts)]


def _outputs(step: parse._KeyFn, chunks: list[list[Message]]
             ) -> tuple[list[tuple[str, bytes]], list[Any], list[int]]:
    """(keyed values in the order they left, dead letters, how many elements each call
    released) of one bundle."""
    keyed: list[tuple[str, bytes]] = []
    dead: list[Any] = []
    released: list[int] = []

    def take(outs: list[Any]) -> None:
        dead.extend(out.value for out in outs if isinstance(out, pvalue.TaggedOutput))
        keyed.extend(out for out in outs if not isinstance(out, pvalue.TaggedOutput))
        released.append(len(outs))

    step.start_bundle()
    for chunk in chunks:
        take(list(step.process(chunk)))
    at_end = list(step.finish_bundle())
    unwrapped = [out.value if isinstance(out, pvalue.TaggedOutput) else out for out in at_end]
    assert all(isinstance(out, WindowedValue) and out.windows == (GlobalWindow(),)
               for out in unwrapped)
    take([pvalue.TaggedOutput(out.tag, out.value.value)
          if isinstance(out, pvalue.TaggedOutput) else out.value for out in at_end])
    return keyed, dead, released


def _messages(keyed: list[tuple[str, bytes]]) -> Counter[tuple[str, bytes, tuple[str, int]]]:
    unpacking = PackedMessages()
    return Counter((join_id, data, source) for join_id, packed in keyed
                   for data, source in unpacking.unpack(packed))


def _expected(lines: list[Message]) -> Counter[tuple[str, bytes, tuple[str, int]]]:
    return Counter((json.loads(data)["join_id"], data, source) for data, source in lines
                   if b"join_id" in data)


def test_a_chunks_messages_leave_once_each_one_value_per_join() -> None:
    lines = _lines()
    keyed, dead, released = _outputs(parse._KeyFn(CONTRACTS, 1 << 20), [lines])
    assert [letter["error"] for letter in dead] == ["invalid_message"]
    assert sorted(join_id for join_id, _ in keyed) == ["j0", "j1", "j2"]
    assert released == [4, 0]  # keyed as it came: three values and a dead letter
    assert _messages(keyed) == _expected(lines)


def test_each_chunk_is_keyed_on_its_own() -> None:
    lines = _lines()
    chunks = [lines[:4], lines[4:9], lines[9:]]
    keyed, _, released = _outputs(parse._KeyFn(CONTRACTS, 1 << 20), chunks)
    assert released == [3, 4, 3, 0]  # a value per join of each chunk; the second's dead letter
    assert len(keyed) == 9
    assert _messages(keyed) == _expected(lines)


def test_a_hot_join_leaves_a_value_per_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parse._KeyFn, "_JOIN_MESSAGES", 2)
    lines = _lines()
    keyed, _, _ = _outputs(parse._KeyFn(CONTRACTS, 1 << 20), [lines])
    assert all(len(list(PackedMessages().unpack(packed))) == 1 for _, packed in keyed)
    assert _messages(keyed) == _expected(lines)


def _ndjson(path: Path, lines: list[Message]) -> str:
    path.write_bytes(b"".join(data + b"\n" for data, _ in lines) + b"\n\n")
    return str(path)


@pytest.mark.parametrize("limits, sizes", [({"CHUNK_MESSAGES": 5}, [5, 5, 3]),
                                           ({"CHUNK_BYTES": 200}, None)])
def test_the_read_gives_a_files_messages_in_full_chunks_and_the_rest(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, limits: dict[str, int],
        sizes: list[int] | None) -> None:
    for name, value in limits.items():
        monkeypatch.setattr(read, name, value)
    path = _ndjson(tmp_path / "in.jsonl", _lines())
    chunks = list(numbered_chunks(path))
    assert [message for chunk in chunks for message in chunk] == list(numbered_lines(path))
    if sizes is not None:
        assert [len(chunk) for chunk in chunks] == sizes
    assert all(is_full(chunk) for chunk in chunks[:-1]) and len(chunks) > 2
    for chunk in chunks[:-1]:  # the limit is reached by the chunk's last message, not before
        assert not is_full(chunk[:-1])


class _LateHelpers:
    """Helpers that answer every chunk at once when waited for, the last sent first, and
    fail the second (the step then keys it itself): what forked helpers may do when they
    are slow. Runs ``work`` in this process."""

    def __init__(self, work: Any) -> None:
        self._work = work
        self._sent: list[tuple[Any, Any]] = []
        self.failures: list[str] = []
        self.holding = 0

    def idle(self) -> bool:
        return len(self._sent) < 3

    def submit(self, batch: Any, keep: Any = None) -> None:
        self._sent.append((keep, batch))

    def finished(self, wait: bool = False) -> Iterator[tuple[Any, Any, Any]]:
        if not wait:
            return iter(())
        answers = [(keep, batch, None if n == 1 else self._work(batch))
                   for n, (keep, batch) in enumerate(self._sent)]
        self._sent = []
        if answers[1:]:
            self.failures.append("injected")
        return reversed(answers)

    def close(self) -> None:
        self._sent = []


def test_chunks_leave_in_the_order_they_came_however_helpers_answer(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(read, "CHUNK_MESSAGES", 2)
    lines = _lines(joins=2, receipts=12)
    chunks = [lines[n:n + 2] for n in range(0, len(lines), 2)]
    alone, alone_dead, _ = _outputs(parse._KeyFn(CONTRACTS, 1 << 20), chunks)
    step = parse._KeyFn(CONTRACTS, 1 << 20, processes=4)
    step._helpers = _LateHelpers(step.keyed_chunk)  # type: ignore[assignment]
    helped, helped_dead, released = _outputs(step, chunks)
    assert helped == alone and helped_dead == alone_dead  # the same values, in the same order
    assert released[:3] == [0, 0, 0] and sum(released[3:-1]) == 0  # behind the helpers' chunks
    assert "a helper of the key step failed (injected)" in caplog.text
    assert _messages(helped) == _expected(lines)


def test_processes_must_be_at_least_one() -> None:
    with pytest.raises(ValueError, match="processes must be >= 1"):
        parse._KeyFn(CONTRACTS, 1 << 20, processes=0)
    with pytest.raises(ValueError, match="processes must be >= 1"):
        parse.KeyMessages(CONTRACTS, 1 << 20, processes=0)
