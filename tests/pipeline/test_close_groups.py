"""The bounded close step on one hot join (fanin.transforms.join_bounded.CloseGroups): it reads the
grouped messages again instead of holding them, parses repeated texts through a memo, and
gives exactly the core's outputs for the join's records read once into a list. The messages it
groups are packed with their sources (fanin.transforms.parse.PackedMessages), which gives both
back exactly."""

from __future__ import annotations

import json

from apache_beam import pvalue
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
