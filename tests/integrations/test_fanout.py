"""The framework-agnostic reporter both integrations share (``fanin.integrations.fanout``)."""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
from typing import Any

import pydantic
import pytest

from fanin.integrations.fanout import FanOutReporter, jsonable, keyed
from fanin.sdk import Emitter, MemorySink


def _reporter(**options: Any) -> tuple[FanOutReporter, MemorySink]:
    sink = MemorySink()
    return FanOutReporter(Emitter(sink, max_bytes=2048), **options), sink


def _messages(sink: MemorySink) -> list[dict[str, Any]]:
    return [json.loads(line) for line in sink.lines]


def test_a_fan_out_opens_with_every_possible_branch_and_skips_the_routes_not_taken() -> None:
    reporter, sink = _reporter(contract="triage", deadline_s=5)
    ctx = reporter.open({"b", "a", "c"}, {"a"}, "run-1")
    assert ctx is not None and ctx.contract == "triage" and ctx.run_id == "run-1"
    opened, *skips = _messages(sink)
    assert (opened["kind"], opened["required"], opened["deadline_s"]) \
        == ("open", ["a", "b", "c"], 5)
    assert [(m["branch"], m["status"]) for m in skips] == [("b", "skipped"), ("c", "skipped")]


@pytest.mark.parametrize("possible", [set(), {"only"}])
def test_fewer_than_two_branches_are_no_fan_out(possible: set[str]) -> None:
    reporter, sink = _reporter()
    assert reporter.open(possible, possible, None) is None
    assert sink.lines == []


class Doc(pydantic.BaseModel):
    title: str


@dataclasses.dataclass
class Hit:
    doc: Doc
    rank: tuple[int, ...]


def test_models_and_dataclasses_become_json_objects() -> None:
    assert jsonable({"hits": [Hit(Doc(title="t"), (1, 2))]}) \
        == {"hits": [{"doc": {"title": "t"}, "rank": [1, 2]}]}


@pytest.mark.parametrize(("value", "reason"), [({"a set": {1}}, "not JSON-serialisable"),
                                               ("x" * 4096, "(too_large): ")])
def test_a_value_that_cannot_be_sent_is_an_error_receipt_saying_why(value: Any,
                                                                    reason: str) -> None:
    reporter, sink = _reporter()
    ctx = reporter.open({"a", "b"}, {"a", "b"}, None)
    assert ctx is not None
    reporter.ok(ctx, "a", value, key="k", attempt=2)
    receipt = _messages(sink)[-1]
    assert (receipt["branch"], receipt["status"], receipt["attempt"], receipt["key"]) \
        == ("a", "error", 2, "k")
    assert receipt["error"].startswith("unreported value: ") and reason in receipt["error"]


@pytest.mark.parametrize("failure", [OSError(28, "No space left on device"),
                                     ValueError("out.jsonl: sink is closed")])
def test_a_sink_that_fails_is_the_callers_failure_not_the_branchs_error(
        failure: Exception) -> None:
    """A sink's failure to take an ``ok`` receipt was caught as an unsendable value: the
    branch, which had succeeded, was reported as ``error`` on the retry, and nobody saw the
    failure."""
    class FailingOnce(MemorySink):
        armed = False

        def publish(self, message: Any) -> None:
            if self.armed:
                self.armed = False
                raise failure
            super().publish(message)

    sink = FailingOnce()
    reporter = FanOutReporter(Emitter(sink, max_bytes=2048))
    ctx = reporter.open({"a", "b"}, {"a", "b"}, None)
    assert ctx is not None
    sink.armed = True
    with pytest.raises(type(failure)) as raised:
        reporter.ok(ctx, "a", {"answer": 42}, key=None, attempt=1)
    assert raised.value is failure
    assert [m["kind"] for m in _messages(sink)] == ["open"]


def test_keyed_uses_the_single_plain_key_else_the_branch() -> None:
    plain = {"score"}.__contains__
    assert keyed({"score": 0.9}, plain) == ("score", 0.9)
    assert keyed({"log": ["x"]}, plain) == (None, {"log": ["x"]})
    assert keyed({"score": 0.9, "docs": []}, plain) == (None, {"score": 0.9, "docs": []})
    assert keyed(None, plain) == (None, None)


@pytest.mark.parametrize(("extra", "framework"), [("langgraph", "langgraph.types"),
                                                   ("adk", "google.adk.workflow")])
def test_an_integration_without_its_framework_names_the_extra(
        monkeypatch: pytest.MonkeyPatch, extra: str, framework: str) -> None:
    """Imported without its framework, an integration says which extra to install."""
    monkeypatch.setitem(sys.modules, framework, None)  # a module that cannot be imported
    monkeypatch.delitem(sys.modules, f"fanin.integrations.{extra}", raising=False)
    with pytest.raises(ImportError) as raised:
        importlib.import_module(f"fanin.integrations.{extra}")
    assert str(raised.value).startswith(
        f"fanin.integrations.{extra} needs Fanin's {extra} extra: pip install 'fanin[{extra}]' (")
    assert raised.value.name == framework
