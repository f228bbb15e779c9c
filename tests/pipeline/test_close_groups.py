"""The bounded close step on one hot join (fanin.transforms.join_bounded.CloseGroups): it reads the
grouped messages again instead of holding them, parses repeated texts through a memo, and
gives exactly the core's outputs for the join's records read once into a list. The messages it
groups are packed with their sources (fanin.transforms.parse.PackedMessages), which gives both
back exactly."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from apache_beam import pvalue
from apache_beam.transforms.window import IntervalWindow
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming, WindowedValue
from support.builders import make_catalog, open_msg, receipt

from fanin.contracts.parsing import parse_message
from fanin.core.bounded import bounded_outputs
from fanin.transforms.join_bounded import CloseGroups
from fanin.transforms.parse import PackedMessages


def _outputs(step: CloseGroups, join_id: str, grouped: list[bytes]) -> list[str]:
    step.setup()
    step.start_bundle()
    found = [(out.tag, out.value) if isinstance(out, pvalue.TaggedOutput) else ("closes", out)
             for out in step.process((join_id, grouped))]
    assert list(step.finish_bundle()) == []
    step.teardown()
    return sorted(json.dumps(item, sort_keys=True) for item in found)


def test_a_hot_join_gives_the_cores_outputs_for_its_records_read_once() -> None:
    catalog = make_catalog()
    texts = [json.dumps(open_msg(contract="short"))]
    for i in range(3_000):  # repeated texts (the memo's hits), distinct ones, a bad one
        texts.append(json.dumps(receipt("a", 1 + i % 3) if i % 2 else
                                receipt("a", 1 + i % 40, value=i)))
    texts.insert(1_500, '{"join_id": "j", "branch": "a"}')
    texts.append(json.dumps(receipt("b", 30, contract="short")))  # after the tombstone
    lines = [(text.encode(), ("f.jsonl", n)) for n, text in enumerate(texts)]
    parsed = [parse_message(data, source, catalog.contracts) for data, source in lines]
    expected = [("dead_letter", dead) for record, dead in parsed if dead is not None]
    expected += bounded_outputs([r for r, _ in parsed if r is not None], catalog, 1_200, 2**30)
    packing = PackedMessages()
    found = _outputs(CloseGroups(catalog, 1_200), "j", [packing.pack(*line) for line in lines])
    assert found == sorted(json.dumps(item, sort_keys=True) for item in expected)
    assert sum('"join_too_large"' in line for line in found) > 500
    assert sum(line.startswith('["late"') for line in found) > 50
    assert sum('"invalid_message"' in line for line in found) == 1
    assert sum(line.startswith('["closes"') for line in found) == 2


def test_a_packed_message_gives_back_its_bytes_and_source_exactly() -> None:
    lines = [(b"", ("", 0)), (b'{"join_id": "j"}', ("gs://b/in/x.jsonl", 2**64 - 1)),
             (b"\xff\xfe not UTF-8 \n", ("/tmp/\u00e9t\u00e9/\udcff.jsonl", 7)),
             (b"x" * 70_000, ("a" * 5_000, 3))]
    packed = [PackedMessages().pack(*line) for line in lines]  # a fresh packer per message
    unpacking = PackedMessages()
    assert [message for p in packed for message in unpacking.unpack(p)] == lines
    (_, (again, _)), = unpacking.unpack(PackedMessages().pack(b"{}", ("gs://b/in/x.jsonl", 1)))
    (_, (first, _)), = unpacking.unpack(packed[1])
    assert again is first  # one path string per path


def test_packed_values_joined_back_to_back_are_one_value_of_all_their_messages() -> None:
    lines = [(b'{"a": 1}', ("x.jsonl", 1)), (b"", ("y.jsonl", 2)), (b"\n" * 3, ("x.jsonl", 9))]
    packing = PackedMessages()
    joined = b"".join(packing.pack(*line) for line in lines)
    assert list(PackedMessages().unpack(joined)) == lines
    assert list(PackedMessages().unpack(b"")) == []


def test_a_join_split_over_several_packed_values_gives_the_same_outputs() -> None:
    catalog = make_catalog()
    texts = [json.dumps(open_msg(contract="short"))] + [
        json.dumps(receipt(b, 1 + n)) for n, b in enumerate(["a", "b", "a", "c"])]
    packing = PackedMessages()
    packs = [packing.pack(text.encode(), ("f.jsonl", n)) for n, text in enumerate(texts)]
    one_each = _outputs(CloseGroups(catalog, 100), "j", packs)
    together = _outputs(CloseGroups(catalog, 100), "j", [b"".join(packs[:3]), b"".join(packs[3:])])
    assert together == one_each
    assert sum(line.startswith('["closes"') for line in together) == 1


class _InProcessHelpers:
    """Helpers that do every batch here, answering when waited for: where the outputs of a
    batch go is then the close step's choice alone."""

    def __init__(self, work: Any) -> None:
        self._work, self._sent = work, []  # type: ignore[var-annotated]
        self.failures: list[str] = []
        self.forked, self.holding = True, 0

    def idle(self) -> bool:
        return True

    def submit(self, batch: Any, keep: Any = None) -> None:
        self._sent.append((keep, batch, self._work(batch)))

    def finished(self, wait: bool = False) -> list[Any]:
        done, self._sent = (self._sent, []) if wait else ([], self._sent)
        return done

    def close(self) -> None:
        self._sent = []


def test_a_batched_joins_outputs_keep_its_timestamp_windows_and_pane(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CloseGroups, "_BATCH_JOINS", 2)
    catalog = make_catalog()
    packing = PackedMessages()
    step = CloseGroups(catalog, 1_000, processes=2)
    step.setup()
    step._helpers = _InProcessHelpers(step._decided)  # type: ignore[assignment]
    step.start_bundle()
    placed = {}
    released = []
    for n in range(5):
        join_id = f"j{n}"
        texts = [json.dumps(open_msg(join_id, contract="strict")),
                 json.dumps(receipt("a", 1, join_id)), "not json"]
        grouped = [packing.pack(text.encode(), ("f.jsonl", i)) for i, text in enumerate(texts)]
        where = WindowedValue((join_id, grouped), 1_000 + n,
                              (IntervalWindow(n, n + 100),),
                              PaneInfo(n == 0, n == 4, PaneInfoTiming.LATE, n, n))
        placed[join_id] = where
        released += list(step.process((join_id, grouped), where=where))
    released += list(step.finish_bundle())
    assert len(released) == 10  # a close and a dead letter per join
    values = [out.value if isinstance(out, pvalue.TaggedOutput) else out for out in released]
    assert all(isinstance(value, WindowedValue) for value in values)
    for value in values:
        if isinstance(value.value, dict) and "reason" in value.value:  # a close: its join's
            where = placed[value.value["join_id"]]
            assert (value.timestamp, value.windows, value.pane_info) == \
                (where.timestamp, where.windows, where.pane_info)
    assert Counter((v.timestamp, v.windows, v.pane_info) for v in values) == Counter(
        {(w.timestamp, w.windows, w.pane_info): 2 for w in placed.values()})
