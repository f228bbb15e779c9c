"""What the SDK refuses (exactly what ``fanin run`` would refuse),
one receipt for any branch exception, generators as branch lists, attempts across processes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from support.child_env import same_code_env
from support.fanin_runs import jsonl_lines, run_fanin

from fanin.contracts.parsing import parse_message
from fanin.sdk import (
    ERROR_TEXT_LIMIT,
    ClockError,
    Emitter,
    EncodedMessage,
    JoinContext,
    JsonlFileSink,
    MemorySink,
    MessageRefused,
    PubSubSink,
    fit_error,
    now_rfc3339,
)


def nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def parsed(line: str) -> dict[str, Any]:
    """``line`` as ``fanin run``'s parser sees it; fails the test if it would dead-letter it."""
    _, dead = parse_message(line, {"kind": "test"}, _Any())
    assert dead is None, dead
    return json.loads(line)


class _Any:
    def __contains__(self, name: object) -> bool:
        return True


@pytest.fixture
def sink() -> MemorySink:
    return MemorySink()


@pytest.fixture
def emitter(sink: MemorySink) -> Emitter:
    return Emitter(sink)


@pytest.fixture
def ctx() -> JoinContext:
    return JoinContext.new(run_id="r", join_id="j-1")


# -- item 7: the parser decides --------------------------------------------------------------

REFUSED_RECEIPTS = [
    pytest.param({"value": nested(64)}, "invalid_json", "nesting deeper than 64", id="depth-64"),
    pytest.param({"value": nested(100_000)}, "invalid_json", "nesting deeper than 64",
                 id="depth-100000"),
    pytest.param({"value": {1: "a", "1": "b"}}, "invalid_json", "repeated field name '1'",
                 id="keys-1"),
    pytest.param({"value": {None: "a", "null": "b"}}, "invalid_json",
                 "repeated field name 'null'", id="keys-null"),
    pytest.param({"value": {True: 1, "true": 2}}, "invalid_json",
                 "repeated field name 'true'", id="keys-true"),
    pytest.param({"value": "x" * 300_000}, "too_large", "> limit 262144", id="too-large"),
]


@pytest.mark.parametrize(("fields", "code", "reason"), REFUSED_RECEIPTS)
def test_a_receipt_the_pipeline_would_dead_letter_is_refused_at_the_call(
        emitter: Emitter, sink: MemorySink, ctx: JoinContext, fields: dict[str, Any], code: str,
        reason: str) -> None:
    with pytest.raises(MessageRefused) as refused:
        emitter.emit(ctx, "rank", "ok", **fields)
    assert (refused.value.error, sink.lines) == (code, [])
    assert reason in str(refused.value) and "branch 'rank'" in str(refused.value)
    assert isinstance(refused.value, ValueError)  # callers catching ValueError still do


def test_an_integer_deadline_beyond_double_range_is_sent_as_the_pipeline_takes_it(
        emitter: Emitter, sink: MemorySink, ctx: JoinContext) -> None:
    emitter.open(ctx, ["a"], deadline_s=10**400)  # the pipeline caps it like 1e300
    assert len(sink.lines) == 1


@pytest.mark.parametrize(("fields", "code", "reason"), [
    pytest.param({"required": ["a", "b"], "optional": ["b"]}, "invalid_message",
                 "branches both required and optional: ['b']", id="required-and-optional"),
])
def test_an_open_the_pipeline_would_dead_letter_is_refused_at_the_call(
        emitter: Emitter, sink: MemorySink, ctx: JoinContext, fields: dict[str, Any], code: str,
        reason: str) -> None:
    with pytest.raises(MessageRefused) as refused:
        emitter.open(ctx, **fields)
    assert (refused.value.error, sink.lines) == (code, [])
    assert reason in str(refused.value)


def test_the_limit_is_the_emitters_max_bytes(sink: MemorySink, ctx: JoinContext) -> None:
    small = Emitter(sink, max_bytes=400)
    small.emit(ctx, "rank", "ok", value="x" * 100)
    with pytest.raises(MessageRefused, match=r"too_large\): \d+ bytes > limit 400"):
        small.emit(ctx, "rank", "ok", value="x" * 400)
    assert len(sink.lines) == 1


def test_what_the_parser_accepts_is_sent_unchanged(emitter: Emitter, sink: MemorySink,
                                                   ctx: JoinContext) -> None:
    value = {"deep": nested(60), "1": 1, "text": "é\u2028\x00", "n": 10**30}
    emitter.emit(ctx, "rank", "ok", value=value)
    emitter.open(ctx, required=["a"], optional=["b"], deadline_s=1e-3)
    receipt, opened = (parsed(line) for line in sink.lines)
    assert receipt["value"] == value
    assert (opened["required"], opened["optional"], opened["deadline_s"]) == (["a"], ["b"], 1e-3)


# -- item 8 ----------------------------------------------------------------------------------

def test_a_generator_of_branch_names_is_emitted_whole(emitter: Emitter, sink: MemorySink,
                                                      ctx: JoinContext) -> None:
    emitter.open(ctx, required=(name for name in ["a", "b"]),
                 optional=iter(["c"]))
    opened = parsed(sink.lines[0])
    assert (opened["required"], opened["optional"]) == (["a", "b"], ["c"])
    with pytest.raises(ValueError, match="required must be a list"):
        emitter.open(ctx, required=(name for name in ["a", ""]))
    with pytest.raises(ValueError, match="required must be a list"):
        emitter.open(ctx, required="ab")


# -- item 6: any exception, exactly one receipt, the original re-raised ----------------------

class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


@pytest.mark.parametrize("exc", [
    pytest.param(ValueError("x" * 300_000), id="text-over-256KiB"),
    pytest.param(TypeError("bad \udc80 surrogate"), id="lone-surrogate"),
    pytest.param(KeyError("\"quotes\" and \x00 controls " * 5000), id="escapes-grow"),
    pytest.param(Unprintable(), id="str-raises"),
    pytest.param(RecursionError("maximum recursion depth exceeded"), id="recursion"),
])
def test_any_branch_exception_gives_one_error_receipt_and_is_reraised(
        emitter: Emitter, sink: MemorySink, ctx: JoinContext, exc: Exception) -> None:
    @emitter.branch(ctx, "work")
    def work() -> None:
        raise exc

    with pytest.raises(type(exc)) as raised:
        work()
    assert raised.value is exc
    (line,) = sink.lines
    receipt = parsed(line)
    assert (receipt["status"], receipt["attempt"]) == ("error", 1)
    assert receipt["error"].startswith(f"{type(exc).__name__}: ")
    assert len(receipt["error"].encode("utf-8")) <= ERROR_TEXT_LIMIT


def test_the_error_text_rule(emitter: Emitter, sink: MemorySink, ctx: JoinContext) -> None:
    assert fit_error("short \"text\"") == "short \"text\""
    assert fit_error("a\udc80b") == "a\\udc80b"
    cut = fit_error("é" * 20_000)
    assert cut.endswith(" [truncated: 20000 characters]")
    assert cut.startswith("é" * 100) and len(json.dumps(cut, ensure_ascii=False)) - 2 <= 16384
    assert len(fit_error("x" * 1000, budget=100).encode()) <= 100
    # an error that the message size limit cuts further than 16 KiB: the receipt still fits
    small = Emitter(sink, max_bytes=2000)
    with pytest.raises(ValueError), small.receipt(ctx, "work"):
        raise ValueError("y" * 5000)
    receipt = parsed(sink.lines[-1])
    assert receipt["error"].endswith("[truncated: 5012 characters]")
    assert len(sink.lines[-1].encode()) <= 2000
    # cut twice (16 KiB, then the size limit): the count is still the whole text's
    with pytest.raises(ValueError), small.receipt(ctx, "work"):
        raise ValueError("z" * 100_000)
    assert parsed(sink.lines[-1])["error"].endswith("[truncated: 100012 characters]")
    assert len(sink.lines[-1].encode()) <= 2000


def test_a_value_the_parser_refuses_gives_an_error_receipt(emitter: Emitter, sink: MemorySink,
                                                           ctx: JoinContext) -> None:
    @emitter.branch(ctx, "work")
    def work() -> Any:
        return nested(100_000)

    with pytest.raises(MessageRefused, match="nesting deeper than 64"):
        work()
    (line,) = sink.lines
    receipt = parsed(line)
    assert receipt["status"] == "error" and "nesting deeper than 64" in receipt["error"]


def test_a_branch_that_could_never_report_is_refused_before_its_body(
        sink: MemorySink, ctx: JoinContext) -> None:
    ran = []
    emitter = Emitter(sink, max_bytes=1000)
    with pytest.raises(MessageRefused, match="too_large"), emitter.receipt(ctx, "b" * 2000):
        ran.append(1)
    assert (ran, sink.lines) == ([], [])


LAST_ATTEMPT = 2**63 - 1
"""The highest attempt the pipeline accepts (docs/spec.md §1)."""


def _unreportable(**changes: Any) -> dict[str, Any]:
    """Arguments of a branch run whose receipt the pipeline would dead-letter, whatever its
    outcome: ``ctx``, ``branch``, ``key``, ``attempt``, and the emitter's ``contracts``."""
    ctx = JoinContext.new(run_id="r", join_id="j-1")
    return {"ctx": ctx, "branch": "b", "key": None, "attempt": None, "contracts": None,
            **changes}


UNREPORTABLE = [
    pytest.param(_unreportable(branch="br\ud800"), "not_utf8", "field(s) branch",
                 id="branch-surrogate"),
    pytest.param(_unreportable(key="k\udc00"), "not_utf8", "field(s) key", id="key-surrogate"),
    pytest.param(_unreportable(ctx=JoinContext.new(join_id="j\ud800")), "not_utf8",
                 "field(s) join_id", id="join_id-surrogate"),
    pytest.param(_unreportable(ctx=JoinContext.new(run_id="r\udfff")), "not_utf8",
                 "field(s) run_id", id="run_id-surrogate"),
    pytest.param(_unreportable(ctx=JoinContext.new(contract="c\ud800")), "not_utf8",
                 "field(s) contract", id="contract-surrogate"),
    pytest.param(_unreportable(ctx=JoinContext.new(contract="nope"), contracts={"triage"}),
                 "unknown_contract", "no contract named 'nope'", id="unknown-contract"),
    pytest.param(_unreportable(attempt=LAST_ATTEMPT + 1), "invalid_message", "attempt",
                 id="explicit-attempt-2**63"),
]


@pytest.mark.parametrize("way", ["with", "async with", "decorator", "async decorator"])
@pytest.mark.parametrize(("run", "code", "reason"), UNREPORTABLE)
def test_a_branch_whose_receipt_would_be_dead_lettered_is_refused_before_its_body(
        sink: MemorySink, run: dict[str, Any], code: str, reason: str, way: str) -> None:
    emitter = Emitter(sink, contracts=run["contracts"])
    ran = []
    options = {"key": run["key"], "attempt": run["attempt"]}

    def body() -> None:
        ran.append(1)
        raise KeyError("real failure")

    async def async_body() -> None:
        body()

    async def in_async_with() -> None:
        async with emitter.receipt(run["ctx"], run["branch"], **options):
            body()

    with pytest.raises(MessageRefused) as refused:
        if way == "with":
            with emitter.receipt(run["ctx"], run["branch"], **options):
                body()
        elif way == "async with":
            asyncio.run(in_async_with())
        elif way == "decorator":
            emitter.branch(run["ctx"], run["branch"], **options)(body)()
        else:
            asyncio.run(emitter.branch(run["ctx"], run["branch"], **options)(async_body)())
    assert (ran, sink.lines) == ([], [])
    assert refused.value.error == code
    assert f"({code})" in str(refused.value) and reason in str(refused.value)
    assert f"branch {run['branch']!r}" in str(refused.value)


def test_a_retry_past_the_last_attempt_is_refused_before_its_body(sink: MemorySink) -> None:
    emitter = Emitter(sink)
    ctx = JoinContext.new(run_id="r").with_attempt(LAST_ATTEMPT)
    with emitter.receipt(ctx, "c") as first:
        first.value = 1
    ran = []
    with pytest.raises(MessageRefused, match=r"\(invalid_message\): .*attempt"), \
            emitter.receipt(ctx, "c") as again:  # a retry: attempt 2**63, past the last
        ran.append(1)
        again.value = 2

    @emitter.branch(ctx, "c")
    def retry() -> None:
        ran.append(1)
        raise KeyError("real failure")

    with pytest.raises(MessageRefused, match="attempt"):
        retry()
    with pytest.raises(MessageRefused, match="attempt"):  # a callable attempt is checked too
        emitter.branch(ctx, "d", attempt=lambda: LAST_ATTEMPT + 1)(retry)()
    assert ran == []
    assert [parsed(line)["attempt"] for line in sink.lines] == [LAST_ATTEMPT]


def test_a_reportable_branch_still_runs_and_raises_its_own_exception(sink: MemorySink) -> None:
    emitter = Emitter(sink, contracts={"triage"})
    ctx = JoinContext.new(contract="triage").with_attempt(LAST_ATTEMPT)
    failure = KeyError("real failure")

    @emitter.branch(ctx, "b\u00e9", key="k\U0001f600")
    def work() -> None:
        raise failure

    with pytest.raises(KeyError) as raised:
        work()
    assert raised.value is failure and raised.value.__cause__ is None
    assert not getattr(failure, "__notes__", None)
    (line,) = sink.lines
    receipt = parsed(line)
    assert (receipt["status"], receipt["attempt"]) == ("error", LAST_ATTEMPT)
    assert receipt["error"] == "KeyError: 'real failure'"


def test_a_body_exception_is_never_replaced_by_a_refused_receipt(sink: MemorySink) -> None:
    """The one way past the check: another run of the same branch takes the last attempt while
    this one runs; its receipt cannot be sent, and its exception still reaches the caller."""
    emitter = Emitter(sink)
    ctx = JoinContext.new(run_id="r").with_attempt(LAST_ATTEMPT)
    failure = KeyError("real failure")
    with pytest.raises(KeyError) as raised, emitter.receipt(ctx, "c"):
        with emitter.receipt(ctx, "c") as other:  # finishes first: attempt 2**63-1
            other.value = 1
        raise failure
    assert raised.value is failure
    assert any("no receipt was sent for branch 'c'" in note and "attempt" in note
               for note in failure.__notes__)
    assert [parsed(line)["attempt"] for line in sink.lines] == [LAST_ATTEMPT]
    with pytest.raises(MessageRefused, match="attempt") as refused, \
            emitter.receipt(ctx, "e") as late:  # the same race, the body returning a value
        with emitter.receipt(ctx, "e") as other:
            other.value = 1
        late.value = 2
    assert any("no receipt was sent for branch 'e'" in note
               for note in refused.value.__notes__)
    assert len(sink.lines) == 2


# -- item 2: the attempt travels -------------------------------------------------------------

RETRY_WORKER = textwrap.dedent("""
    import sys
    from fanin.sdk import Emitter, JoinContext, JsonlFileSink

    ctx = JoinContext.from_json(sys.argv[1])
    with Emitter(JsonlFileSink(sys.argv[2])) as emitter:
        @emitter.branch(ctx, "work")
        def work() -> str:
            return "done on retry"

        work()
""")


def test_a_retry_in_another_process_supersedes_the_failed_attempt(tmp_path: Path) -> None:
    traffic = tmp_path / "traffic.jsonl"
    from fanin.sdk import JsonlFileSink

    with Emitter(JsonlFileSink(traffic)) as emitter:
        ctx = JoinContext.new(run_id="retry")
        emitter.open(ctx, required=["work", "check"], deadline_s=30)

        @emitter.branch(ctx, "work")
        def work() -> None:
            raise ConnectionError("worker 1 lost its connection")

        with pytest.raises(ConnectionError):
            work()
        handed_over = ctx.with_attempt(2).to_json()  # what a task queue carries
        with emitter.receipt(ctx, "check") as r:
            r.value = True
    subprocess.run([sys.executable, "-c", RETRY_WORKER, handed_over, str(traffic)], check=True,
                   cwd=tmp_path, env=same_code_env())
    lines = jsonl_lines(traffic)
    assert [json.loads(line).get("attempt") for line in lines] == [None, 1, 1, 2]
    close = run_fanin(lines, tmp_path)[ctx.join_id]
    assert close["reason"] == "complete"
    assert close["branches"]["work"] == {
        "status": "ok", "key": "work", "attempt": 2, "value": "done on retry", "error": None,
        "event_time": json.loads(lines[-1])["event_time"]}
    assert close["counts"] == {"messages": 4, "duplicates": 0, "superseded": 1}


def test_attempt_sources_and_their_precedence(emitter: Emitter, sink: MemorySink,
                                              ctx: JoinContext) -> None:
    @emitter.branch(lambda task: task["ctx"], "work", attempt=lambda task: task["retries"] + 1)
    def from_queue(task: dict[str, Any]) -> int:
        return int(task["retries"])

    from_queue({"ctx": ctx, "retries": 2})  # explicit: as given
    handed = ctx.with_attempt(5)
    with emitter.receipt(handed, "other") as r:  # the context's attempt is a floor
        r.value = 1
    with emitter.receipt(handed, "other") as again:  # ...a retry here still counts up
        again.value = 2
    emitter.emit(ctx, "work", "ok")  # the counter continues after an explicit attempt
    assert [(m["branch"], m["attempt"]) for m in map(parsed, sink.lines)] == [
        ("work", 3), ("other", 5), ("other", 6), ("work", 4)]
    assert (r.attempt, again.attempt) == (5, 6)
    assert JoinContext.from_json(handed.to_json()) == handed
    assert "attempt" not in ctx.to_dict()  # unchanged on the wire when not set
    with pytest.raises(ValueError, match="attempt"):
        ctx.with_attempt(0)


def test_contract_names_are_checked_when_the_emitter_knows_them(sink: MemorySink) -> None:
    emitter = Emitter(sink, contracts={"triage"})
    emitter.open(JoinContext.new(contract="triage"))
    with pytest.raises(MessageRefused, match=r"\(unknown_contract\): no contract named 'triag'"):
        emitter.open(JoinContext.new(contract="triag"))
    Emitter(sink).open(JoinContext.new(contract="triag"))  # without names: any contract passes
    assert len(sink.lines) == 2


class _NoPublisher:
    """Stands for Pub/Sub's client where nothing is published (a test double)."""

    def publish(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("nothing is published")

    def resume_publish(self, *args: Any) -> None:
        raise AssertionError("nothing is published")


def test_an_emitter_allowing_more_than_its_sink_can_send_is_refused() -> None:
    """Pub/Sub takes at most 10 MB a message: an 11 MB value checked against max_bytes=16 MB
    failed to send, with no receipt to say so."""
    sink = PubSubSink("projects/my-project/topics/receipts", publisher=_NoPublisher())
    with pytest.raises(ValueError, match="over what PubSubSink"):
        Emitter(sink, max_bytes=16_000_000)
    assert Emitter(sink, max_bytes=sink.max_message_bytes).max_bytes == 9_900_000


# -- values and clocks that fail while the receipt is made (review, round 16) ----------------

class _ItemsRaise(dict):  # type: ignore[type-arg]
    """A mapping whose reading raises something other than TypeError (a lazy proxy)."""

    def items(self) -> Any:
        raise RuntimeError("lazy mapping failed")


def test_a_value_whose_reading_raises_gives_an_error_receipt(
        emitter: Emitter, sink: MemorySink, ctx: JoinContext) -> None:
    with pytest.raises(TypeError, match="reading it raised RuntimeError: lazy mapping failed"), \
            emitter.receipt(ctx, "b") as r:
        r.value = _ItemsRaise(k=1)
    (receipt,) = [parsed(line) for line in sink.lines]
    assert (receipt["status"], receipt["attempt"]) == ("error", 1)
    assert "reading it raised RuntimeError" in receipt["error"]


@pytest.mark.parametrize("limit", [0, 100_000])
def test_the_integer_limit_holds_whatever_the_process_s_digit_limit(
        emitter: Emitter, sink: MemorySink, ctx: JoinContext, limit: int) -> None:
    """An agent that lifted Python's limit sent 5,000-digit integers ``fanin run`` refuses."""
    before = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(limit)
    try:
        emitter.emit(ctx, "a", "ok", value=10**4299)  # 4,300 digits
        with pytest.raises(MessageRefused, match="more than 4300 digits"):
            emitter.emit(ctx, "b", "ok", value=10**4300)
    finally:
        sys.set_int_max_str_digits(before)
    assert [len(str(parsed(line)["value"])) for line in sink.lines] == [4300]


@pytest.mark.parametrize("answer", [float("nan"), 1.7e18, -1e12, "now"],
                         ids=["nan", "time_ns", "before-year-1", "not-a-number"])
def test_a_clock_that_does_not_answer_seconds_is_refused_not_clamped(
        sink: MemorySink, answer: Any) -> None:
    emitter = Emitter(sink, clock=lambda: answer)
    with pytest.raises(ClockError, match="not seconds since 1970-01-01"):
        JoinContext.new(clock=emitter.clock)
    ctx = JoinContext.new(run_id="r")
    failure = KeyError("the body's own")
    with pytest.raises(KeyError) as raised, emitter.receipt(ctx, "b"):
        raise failure
    assert raised.value is failure
    assert any("no receipt was sent for branch 'b'" in note and "the clock returned" in note
               for note in failure.__notes__)
    with pytest.raises(ClockError), emitter.receipt(ctx, "c") as r:
        r.value = 1
    assert sink.lines == []


@pytest.mark.parametrize(("seconds", "text"), [
    (-0.0005, "1969-12-31T23:59:59.999Z"), (-1.5, "1969-12-31T23:59:58.500Z"),
    (0.0009, "1970-01-01T00:00:00.000Z"), (1.25, "1970-01-01T00:00:01.250Z")])
def test_a_clocks_time_is_truncated_toward_the_past(seconds: float, text: str) -> None:
    """``now_rfc3339``: the millisecond the instant lies in, before 1970 too (it gave the
    next one there)."""
    assert now_rfc3339(lambda: seconds) == text


FORKED_POOL = textwrap.dedent("""
    import multiprocessing, os, sys
    from fanin.sdk import Emitter, JoinContext, JsonlFileSink

    folder = sys.argv[1]
    parent = Emitter(JsonlFileSink(os.path.join(folder, "parent.jsonl")))  # never flushed
    ctx = JoinContext.new(run_id="pool")
    parent.open(ctx, required=["a", "b"])
    parent.emit(ctx, "a", "ok", value=1)

    def work(n):  # its own file, as docs/sdk.md asks; forgets close: ends with os._exit
        child = Emitter(JsonlFileSink(os.path.join(folder, f"child-{os.getpid()}.jsonl")))
        child.emit(ctx.with_attempt(1), f"w{n}", "ok", value=n)
        parent.emit(ctx, f"inherited-{n}", "ok", value=n)  # the parent's sink, inherited
        return n

    if __name__ == "__main__":
        with multiprocessing.get_context("fork").Pool(3) as pool:
            print(sorted(pool.map(work, range(6))))
        parent.close()
""")


def test_forked_workers_never_write_their_parent_s_messages_again(tmp_path: Path) -> None:
    """Each forked worker that made a sink flushed the parent's inherited, still buffered
    lines at its end: the parent's messages were in its file once per worker."""
    script = tmp_path / "pool.py"
    script.write_text(FORKED_POOL)
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path, env=same_code_env())
    assert (done.returncode, done.stdout) == (0, "[0, 1, 2, 3, 4, 5]\n"), done.stderr
    parent = [json.loads(line) for line in jsonl_lines(tmp_path / "parent.jsonl")]
    assert sorted(m.get("branch", "open") for m in parent) == \
        ["a", *(f"inherited-{n}" for n in range(6)), "open"]
    children = [json.loads(line) for name in tmp_path.glob("child-*.jsonl")
                for line in jsonl_lines(name)]
    assert sorted(m["branch"] for m in children) == [f"w{n}" for n in range(6)]


def test_a_file_sink_dropped_unclosed_gives_its_descriptor_back(tmp_path: Path) -> None:
    """A worker making a sink per task without closing it ran out of descriptors."""
    import gc

    def descriptors() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = descriptors()
    for n in range(50):
        JsonlFileSink(tmp_path / f"{n}.jsonl").publish(EncodedMessage("{}", "j", "m", "t"))
    gc.collect()
    assert descriptors() == before
    assert (tmp_path / "49.jsonl").read_text() == "{}\n"


WITHOUT_FORK = textwrap.dedent("""
    import os, sys
    import fanin.sdk.messages  # what the sinks do not need, imported as usual
    del os.register_at_fork, os.O_CLOEXEC  # as on Windows
    from fanin.sdk import Emitter, JoinContext, JsonlFileSink
    with Emitter(JsonlFileSink(sys.argv[1])) as emitter:
        emitter.open(JoinContext.new(run_id="w"), required=["a"])
""")


def test_the_file_sink_needs_neither_fork_nor_close_on_exec(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", WITHOUT_FORK, str(tmp_path / "o.jsonl")],
                          capture_output=True, text=True, timeout=120, env=same_code_env())
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["kind"] for line in jsonl_lines(tmp_path / "o.jsonl")] == ["open"]


def test_a_refused_receipt_counts_no_attempt(emitter: Emitter, sink: MemorySink,
                                             ctx: JoinContext) -> None:
    """A receipt refused before the sink (a value JSON cannot hold, an attempt past 2**63-1)
    used up an attempt: the first receipt sent after two refusals was attempt 3, and an
    explicit attempt of 2**63 left the branch refused for good."""
    for unsendable in (float("nan"), b"x"):
        with pytest.raises((TypeError, MessageRefused)):
            emitter.emit(ctx, "b", "ok", value=unsendable)
    assert emitter.emit(ctx, "b", "ok", value="fine")["attempt"] == 1
    with pytest.raises(MessageRefused):
        emitter.emit(ctx, "a", "ok", value=1, attempt=2**63)
    assert emitter.emit(ctx, "a", "ok", value=1)["attempt"] == 1
    assert [parsed(line)["attempt"] for line in sink.lines] == [1, 1]


@pytest.mark.parametrize("tracked", [0, -1, True, 1.5])
def test_an_emitter_that_would_count_no_attempt_is_refused(tracked: Any) -> None:
    """``max_tracked=0`` counted nothing: every run of a branch was attempt 1, so a retry
    was a changed duplicate of the failure, not a newer attempt."""
    with pytest.raises(ValueError, match="max_tracked must be an integer >= 1"):
        Emitter(MemorySink(), max_tracked=tracked)
