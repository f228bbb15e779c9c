"""The bounded plan's key step (fanin.transforms.parse.KeyMessages' DoFn): every message leaves
exactly once, keyed by its join_id, a join's messages of one bundle packed into one value
(fanin.transforms.parse.PackedMessages) unless the step's hold fills first; a message without
a join to key by leaves as its dead letter at once."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from apache_beam import pvalue
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.windowed_value import WindowedValue
from support.builders import make_catalog, open_msg, receipt

from fanin.transforms import parse
from fanin.transforms.parse import PackedMessages

_Lines = list[tuple[bytes, tuple[str, int]]]


def _lines() -> _Lines:
    texts = []
    for n in range(12):  # three joins, interleaved
        join_id = f"j{n % 3}"
        texts.append(json.dumps(open_msg(join_id) if n < 3 else receipt(f"b{n}", n, join_id)))
    texts.insert(5, '{"branch": "no join"}')
    return [(text.encode(), ("in.jsonl", n + 1)) for n, text in enumerate(texts)]


def _run(lines: _Lines) -> tuple[list[tuple[str, Any]], list[Any], list[int]]:
    """(keyed values, dead letters, how many values each call released) of one bundle."""
    step = parse._KeyFn(frozenset(make_catalog().contracts), 1 << 20)
    keyed: list[tuple[str, Any]] = []
    dead: list[Any] = []
    released: list[int] = []
    step.start_bundle()
    for line in lines:
        outs = list(step.process(line))
        dead += [out.value for out in outs if isinstance(out, pvalue.TaggedOutput)]
        values = [out for out in outs if not isinstance(out, pvalue.TaggedOutput)]
        keyed += values
        released.append(len(values))
    at_end = list(step.finish_bundle())
    assert all(isinstance(out, WindowedValue) and out.windows == (GlobalWindow(),)
               for out in at_end)
    keyed += [out.value for out in at_end]
    released.append(len(at_end))
    return keyed, dead, released


def _messages(keyed: list[tuple[str, Any]]) -> Counter[tuple[str, bytes, tuple[str, int]]]:
    unpacking = PackedMessages()
    return Counter((join_id, data, source) for join_id, packed in keyed
                   for data, source in unpacking.unpack(packed))


def _expected(lines: _Lines) -> Counter[tuple[str, bytes, tuple[str, int]]]:
    return Counter((json.loads(data)["join_id"], data, source) for data, source in lines
                   if b"join_id" in data)


def test_a_bundles_messages_leave_once_each_one_value_per_join() -> None:
    lines = _lines()
    keyed, dead, released = _run(lines)
    assert [letter["error"] for letter in dead] == ["invalid_message"]
    assert sorted(join_id for join_id, _ in keyed) == ["j0", "j1", "j2"]
    assert released == [0] * len(lines) + [3]  # held to the bundle's end
    assert _messages(keyed) == _expected(lines)


@pytest.mark.parametrize("hold", [1, 4])
def test_a_full_hold_releases_every_join_it_holds(monkeypatch: pytest.MonkeyPatch,
                                                  hold: int) -> None:
    monkeypatch.setattr(parse._KeyFn, "_HOLD_MESSAGES", hold)
    lines = _lines()
    keyed, _, released = _run(lines)
    held = 0
    for line, count in zip(lines, released, strict=False):  # released when the hold fills
        held = 0 if count else held + (b"join_id" in line[0])
        assert held < hold
    assert sum(released) == len(keyed) > 3
    assert _messages(keyed) == _expected(lines)


def test_a_hot_join_leaves_a_value_per_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parse._KeyFn, "_JOIN_MESSAGES", 2)
    lines = _lines()
    keyed, _, _ = _run(lines)
    assert all(len(list(PackedMessages().unpack(packed))) == 1 for _, packed in keyed)
    assert _messages(keyed) == _expected(lines)


def test_a_hold_full_in_bytes_releases_too(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = _lines()
    first = len(PackedMessages().pack(*lines[0]))
    monkeypatch.setattr(parse._KeyFn, "_HOLD_BYTES", first + 1)
    keyed, _, released = _run(lines)
    assert released[:2] == [0, 2]  # the second message (another join) fills it: both leave
    assert _messages(keyed) == _expected(lines)
