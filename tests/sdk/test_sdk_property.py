"""Property: generated SDK calls — values of any shape (keys that collide once
encoded, nesting around the parser's depth limit, NaN, lone surrogates), branch lists, any
exception text, retries handed between processes — emit only lines ``fanin run`` accepts, and
``fanin run`` closes each join the way the calls imply.

Each example is many joins, folded by one bounded ``fanin run`` (kept cheap: one pipeline per
example). "Processes" are separate ``Emitter`` objects that receive the context as JSON, as a
task queue would hand it over (a real second process: ``test_sdk_refusals.py``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from support.fanin_runs import run_fanin

from fanin.contracts.jsonvalue import JSONRefused, canonical, loads_strict
from fanin.sdk import Emitter, JoinContext, MemorySink, MessageRefused


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


@dataclass(frozen=True)
class Deep:
    """A value nested ``depth`` lists deep, built only when used (its repr stays short)."""

    depth: int


def materialize(value: Any) -> Any:
    return nested(value.depth) if isinstance(value, Deep) else value


def sendable(value: Any) -> bool:
    """The test's oracle: would ``fanin run`` accept this value in a receipt? (Strict JSON as the
    parser reads it, at the depth a message's value sits.)"""
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
        text.encode("utf-8")
        loads_strict('{"value":' + text + "}")
    except (TypeError, ValueError, RecursionError, JSONRefused):
        return False
    return True


TEXTS = st.one_of(
    st.text(max_size=8),
    st.text(st.characters(min_codepoint=0xD7F0, max_codepoint=0xE010), max_size=4),  # surrogates
    st.sampled_from(["", "x" * 300_000, "\"quoted\"\n\\", "\x00\x1f", "\u2028 \x85 \x1c"]),
)
KEYS = st.one_of(st.sampled_from(["1", "null", "true", "1.5", "a"]), st.integers(0, 2),
                 st.none(), st.booleans(), st.just(1.5))
LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20),
                   st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5))
VALUES = st.one_of(
    st.recursive(LEAVES, lambda inner: st.lists(inner, max_size=3)
                 | st.dictionaries(KEYS, inner, max_size=3), max_leaves=8),
    st.builds(Deep, st.integers(58, 66)),
    st.just(Deep(5000)),
)


@dataclass
class Attempt:
    outcome: str  # "ok", "raise", "timeout"
    value: Any = None
    text: str = ""
    elsewhere: bool = False  # run by another process than the previous attempt
    style: str = "decorator"  # "decorator", "with", "async"


@dataclass
class Plan:
    required: list[str]
    optional: list[str]
    overlap: bool
    attempts: dict[str, list[Attempt]]
    optional_action: str  # "skip", "report", "none"
    expected: dict[str, Any] = field(default_factory=dict)


def attempts(outcomes: list[str]) -> st.SearchStrategy[Attempt]:
    return st.builds(Attempt, outcome=st.sampled_from(outcomes), value=VALUES, text=TEXTS,
                     elsewhere=st.booleans(), style=st.sampled_from(["decorator", "with",
                                                                      "async"]))


# An attempt is retried because it failed; the last one may succeed. (A join closes the moment
# it is complete, so an ok attempt followed by more receipts would make those late.)
RETRIED = st.lists(attempts(["raise", "timeout"]), max_size=2)
FINAL = attempts(["ok", "ok", "raise", "timeout"])


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    names = draw(st.lists(st.sampled_from(["a", "b", "c/x", "c/y", "d"]), min_size=1,
                          max_size=3, unique=True))
    overlap = draw(st.booleans()) and draw(st.booleans()) and draw(st.booleans())
    optional = [names[0]] if overlap else ["opt"]
    attempts = {name: [*draw(RETRIED), draw(FINAL)] for name in names}
    action = draw(st.sampled_from(["skip", "report", "none"]))
    return Plan((name for name in names), optional, overlap, attempts, action)  # type: ignore[arg-type]


def run_branch(process: Emitter, ctx: JoinContext, branch: str, attempt: Attempt) -> None:
    """One attempt of ``branch`` in ``process``, as agent code would write it."""
    def body() -> Any:
        if attempt.outcome == "raise":
            raise ValueError(attempt.text)
        if attempt.outcome == "timeout":
            raise TimeoutError(attempt.text)
        return materialize(attempt.value)

    try:
        if attempt.style == "decorator":
            process.branch(ctx, branch)(body)()
        elif attempt.style == "with":
            with process.receipt(ctx, branch) as r:
                r.value = body()
        else:
            async def work() -> Any:
                return body()

            asyncio.run(process.branch(ctx, branch)(work)())
    except (ValueError, TimeoutError, TypeError):
        pass  # the original exception (or the refusal of the value) reached the caller


def execute(plan: Plan, sink: MemorySink, join_id: str) -> None:
    """Make the calls of ``plan`` and record in ``plan.expected`` what the close must say."""
    processes = [Emitter(sink), Emitter(sink)]
    ctx = JoinContext.new(run_id="prop", join_id=join_id)
    required = plan.required  # a generator: read once by the SDK
    try:
        processes[0].open(ctx, required=required, optional=plan.optional, deadline_s=3600)
    except MessageRefused as refused:
        assert plan.overlap and "both required and optional" in str(refused)
        plan.expected = {"refused": True}
        return
    assert not plan.overlap
    messages = 2  # the open, and the optional branch's skip or report (before completion)
    if plan.optional_action == "skip":
        processes[0].skip(ctx, "opt")
    elif plan.optional_action == "report":
        processes[1].emit(ctx, "opt", "ok", value={"seen": True})
    else:
        messages = 1
    branches: dict[str, dict[str, Any]] = {}
    for branch, attempts in plan.attempts.items():
        current = 0
        for number, attempt in enumerate(attempts, start=1):
            if number > 1 and attempt.elsewhere:
                current = 1 - current  # handed over: the context carries the attempt
                handed = JoinContext.from_json(ctx.with_attempt(number).to_json())
                run_branch(processes[current], handed, branch, attempt)
            else:
                run_branch(processes[current], ctx if number == 1 else
                           ctx.with_attempt(number) if current else ctx, branch, attempt)
            messages += 1
        final = attempts[-1]
        status = {"raise": "error", "timeout": "timeout"}.get(final.outcome, "ok")
        if status == "ok" and not sendable(materialize(final.value)):
            status = "error"
        branches[branch] = {"status": status, "attempt": len(attempts), "final": final}
    plan.expected = {"branches": branches, "messages": messages,
                     "superseded": sum(len(a) - 1 for a in plan.attempts.values()),
                     "complete": all(b["status"] == "ok" for b in branches.values())}


def check(plan: Plan, close: dict[str, Any] | None) -> None:
    expected = plan.expected
    if expected.get("refused"):
        assert close is None
        return
    assert close is not None
    assert close["reason"] == ("complete" if expected["complete"] else "timeout")
    assert close["counts"] == {"messages": expected["messages"], "duplicates": 0,
                               "superseded": expected["superseded"]}
    assert close["conflicts"] == []
    assert close["pruned"] == (["opt"] if plan.optional_action == "skip" else [])
    for branch, want in expected["branches"].items():
        got = close["branches"][branch]
        assert (got["status"], got["attempt"]) == (want["status"], want["attempt"]), branch
        final: Attempt = want["final"]
        if want["status"] == "ok":
            sent = json.loads(json.dumps(materialize(final.value)))
            assert canonical(got["value"]) == canonical(sent)
        elif final.outcome == "ok":  # the value was refused: an error receipt says why
            assert "dead-lettered by `fanin run`" in got["error"] or \
                "not JSON-serialisable" in got["error"]
        else:
            kind = "ValueError" if final.outcome == "raise" else "TimeoutError"
            assert got["error"].startswith(kind)
            assert len(got["error"].encode("utf-8")) <= 16 * 1024


_RUNS = itertools.count()


@settings(max_examples=3, deadline=None, derandomize=True,
          phases=[Phase.explicit, Phase.generate],  # no shrinking: each run is a pipeline
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.large_base_example])
@given(st.lists(plans(), min_size=40, max_size=60))
def test_generated_calls_emit_lines_fanin_run_closes_as_implied(batch: list[Plan]) -> None:
    sink = MemorySink()
    run = next(_RUNS)
    for index, plan in enumerate(batch):
        execute(plan, sink, f"p{run}-{index}")
    with TemporaryDirectory() as folder:
        closes = run_fanin(sink.lines, Path(folder))  # asserts: no dead letter, nothing late
    for index, plan in enumerate(batch):
        check(plan, closes.pop(f"p{run}-{index}", None))
    assert closes == {}
