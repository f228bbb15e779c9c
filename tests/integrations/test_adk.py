"""Google ADK's own fan-in (a ``JoinNode``, session state) against Fanin's close of the same
runs.

Real ADK workflows of custom ``BaseAgent``s without a model (``examples/adk_fanout.py``), no
network. Every variant runs the workflow with Fanin attached (each bounded by a timeout, as a
join that waits must not hang the test), all emitted lines go through one bounded
``fanin run``, and each close is compared with what ADK itself produced.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Callable
from typing import Any

import pytest
from google.adk.agents import BaseAgent, ParallelAgent, SequentialAgent
from google.adk.apps import App
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.adk.workflow import START, JoinNode, Workflow
from support.fanin_runs import fold_runs, load_example

from fanin.integrations.adk import FaninPlugin, attach
from fanin.sdk import Emitter, MemorySink

example = load_example("adk_fanout")
QUESTION = "review this contract"
BOUND_S = 30.0  # a run that has not finished by then is waiting forever



def nested_app() -> App:
    """A fan-out whose second branch is a whole workflow (its output: its terminal node's)."""
    step = example.Step
    research = Workflow(name="research", edges=[
        (START, step(name="search", output=["hit"]), step(name="read", output="page"))])
    plan, quote, join = step(name="plan", output="q"), step(name="quote", output=3), \
        JoinNode(name="join")
    return App(name="nested", root_agent=Workflow(name="top", edges=[
        (START, plan), (plan, (quote, research)), (quote, join), (research, join)]))


def start_app() -> App:
    """A fan-out straight from ``START``."""
    step = example.Step
    join = JoinNode(name="join")
    quote, research = step(name="quote", output=3), step(name="research", output="page")
    return App(name="start", root_agent=Workflow(name="top", edges=[
        (START, (quote, research)), (quote, join), (research, join)]))


def parallel_app(verdicts: tuple[str, str] | None = None, failing: bool = False) -> App:
    """``plan``, then a ``ParallelAgent`` of three members writing session state; with
    ``verdicts`` the first two write ``verdict`` instead, with these different values; with
    ``failing`` the third fails (a ``ParallelAgent`` does not retry)."""
    step = example.Step
    writes = [{"docs": ["a doc"]}, {"score": 0.9}, {"summary": "short"}]
    if verdicts is not None:
        writes[0], writes[1] = {"verdict": verdicts[0]}, {"verdict": verdicts[1]}
    members = [step(name=name, state=state, failures=int(failing and name == "summarize"))
               for name, state in zip(("retrieve", "rank", "summarize"), writes, strict=True)]
    return App(name="parallel", root_agent=SequentialAgent(name="root", sub_agents=[
        step(name="plan", output="q"), ParallelAgent(name="fan", sub_agents=members)]))


def sequential_members_app() -> App:
    """A ``ParallelAgent`` whose members are ``SequentialAgent``s: each writes its state key
    through its second sub-agent, whose events the plugin did not attribute to the member
    (its value was null)."""
    step = example.Step
    members = [SequentialAgent(name=name, sub_agents=[
        step(name=f"{name}_a"), step(name=f"{name}_b", state={key: f"{name} wrote"})])
        for name, key in (("p1", "r1"), ("p2", "r2"))]
    return App(name="sequential", root_agent=SequentialAgent(name="root", sub_agents=[
        step(name="plan", output="q"), ParallelAgent(name="fan", sub_agents=members)]))


class Waiting(BaseAgent):
    """A branch that runs until ADK cancels it (a sibling of its fan-out failed)."""

    async def _run_async_impl(self, ctx: Any) -> AsyncGenerator[Any, None]:
        await asyncio.Event().wait()
        for event in ():  # an async generator, as ADK expects; never reached
            yield event


def cancelled_app(parallel: bool) -> App:
    """``plan``, then a fan-out to ``rank`` (fails) and ``wait`` (cancelled by the failure):
    a ``ParallelAgent``, or a workflow node's edges."""
    step = example.Step
    rank, wait, plan = step(name="rank", failures=1), Waiting(name="wait"), \
        step(name="plan", output="q")
    if parallel:
        return App(name="cancelled", root_agent=SequentialAgent(name="root", sub_agents=[
            plan, ParallelAgent(name="fan", sub_agents=[rank, wait])]))
    join = JoinNode(name="join")
    return App(name="cancelled", root_agent=Workflow(name="top", edges=[
        (START, plan), (plan, (rank, wait)), (rank, join), (wait, join)]))


VARIANTS: dict[str, Callable[[], Any]] = {
    "agree": lambda: example.build(QUESTION),
    "conflict": lambda: example.build(QUESTION, rank_state={"verdict": "rank disagrees"}),
    "behind_route": lambda: example.build(QUESTION, join_behind_route=True),
    "exhausted": lambda: example.build(QUESTION, failures=2),
    "nested": nested_app,
    "start": start_app,
    "parallel": parallel_app,
    "parallel_conflict": lambda: parallel_app(("relevant", "irrelevant")),
    "parallel_failure": lambda: parallel_app(failing=True),
    "parallel_sequences": sequential_members_app,
    "parallel_cancelled": lambda: cancelled_app(parallel=True),
    "workflow_cancelled": lambda: cancelled_app(parallel=False),
}
Runs = dict[str, tuple[Any, Any]]


async def _bounded(app: Any) -> Any:
    try:
        return await asyncio.wait_for(example.run(app), BOUND_S)
    except Exception as exc:  # the framework's own failure is what is compared
        return exc


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """Variant -> (ADK's ``Outcome`` or the exception it raised, Fanin's close); "example" ->
    (None, the closes of the example's joins). One ``fanin run`` folds them all."""
    folder = tmp_path_factory.mktemp("adk")
    outcomes: dict[str, Any] = {}
    lines: dict[str, list[str]] = {}
    for name, build in VARIANTS.items():
        sink = MemorySink()
        app = build()
        attach(app, Emitter(sink))
        outcomes[name] = asyncio.run(_bounded(app))
        lines[name] = sink.lines
    return fold_runs(outcomes, lines, example, folder)


def test_where_the_join_node_fires_fanin_values_equal_its_output_and_the_state(
        runs: Runs) -> None:
    outcome, close = runs["agree"]
    assert outcome.join_output == {"retrieve": [f"doc about {QUESTION}"], "rank": 0.9,
                                   "summarize": "two docs, one relevant"}
    assert outcome.state == {"verdict": "clause 4 is fine"}
    assert close["reason"] == "complete"
    assert close["required"] == ["rank", "retrieve", "review_legal", "review_tech", "summarize"]
    assert close["pruned"] == ["review_tech"]
    assert close["values"] == {**outcome.join_output, **outcome.state}
    summarize = close["branches"]["summarize"]
    assert (summarize["status"], summarize["attempt"]) == ("ok", 2)
    assert close["counts"]["superseded"] == 1


def test_two_branches_writing_one_state_key_last_write_wins_in_adk_conflict_in_fanin(
        runs: Runs) -> None:
    outcome, close = runs["conflict"]
    # ADK: no error, the JoinNode fires, the state silently keeps one of the two writes
    assert outcome.join_output is not None
    assert outcome.state["verdict"] in ("rank disagrees", "clause 4 is fine")
    assert close["reason"] == "timeout"
    assert sorted((c["kind"], c["branch"], c["key"], c["value"]) for c in close["conflicts"]) \
        == [("key_conflict", "rank", "verdict", "rank disagrees"),
            ("key_conflict", "review_legal", "verdict", "clause 4 is fine")]
    assert close["values"] == {"retrieve": [f"doc about {QUESTION}"],
                               "summarize": "two docs, one relevant"}


def test_a_join_node_behind_a_route_not_taken_never_fires_but_fanin_closes(
        runs: Runs) -> None:
    outcome, close = runs["behind_route"]
    # ADK 2.x ends the invocation without ever running the JoinNode (within the bound)
    assert not isinstance(outcome, BaseException)
    assert outcome.join_output is None
    assert close["reason"] == "complete"
    assert close["pruned"] == ["review_tech"]
    assert close["values"] == {"retrieve": [f"doc about {QUESTION}"], "rank": 0.9,
                               "summarize": "two docs, one relevant",
                               "review_legal": "clause 4 is fine"}


def test_a_branch_that_fails_every_attempt_fails_the_run_and_the_join(runs: Runs) -> None:
    outcome, close = runs["exhausted"]
    assert isinstance(outcome, RuntimeError)
    assert "summarize busy (call 2)" in str(outcome)
    assert close["reason"] == "timeout"
    assert close["failed"] == ["summarize"]
    summarize = close["branches"]["summarize"]
    assert (summarize["status"], summarize["attempt"], summarize["error"]) \
        == ("error", 2, "RuntimeError: summarize busy (call 2)")


@pytest.mark.parametrize("variant", ["nested", "start"])
def test_a_nested_workflow_branch_and_a_fan_out_from_start_agree(runs: Runs,
                                                                  variant: str) -> None:
    outcome, close = runs[variant]  # nested: "research" is a workflow ending in "read"
    assert outcome.join_output == {"quote": 3, "research": "page"}
    assert close["reason"] == "complete"
    assert close["values"] == outcome.join_output


def test_a_parallel_agent_is_a_join_of_its_members_equal_to_the_session_state(
        runs: Runs) -> None:
    outcome, close = runs["parallel"]
    assert close["reason"] == "complete"
    assert close["required"] == ["rank", "retrieve", "summarize"]
    assert close["values"] == outcome.state == {"docs": ["a doc"], "score": 0.9,
                                                "summary": "short"}


def test_parallel_members_that_are_sequences_report_what_their_sub_agents_wrote(
        runs: Runs) -> None:
    outcome, close = runs["parallel_sequences"]
    assert close["reason"] == "complete"
    assert close["values"] == outcome.state == {"r1": "p1 wrote", "r2": "p2 wrote"}


def test_a_parallel_agent_inside_a_member_writes_for_the_member_too() -> None:
    """Member ``p3`` runs a ``ParallelAgent`` of its own (a second join): the one key its
    member ``q1`` writes is ``p3``'s receipt too (the inner join took q1's events alone)."""
    step = example.Step
    p3 = SequentialAgent(name="p3", sub_agents=[
        ParallelAgent(name="inner", sub_agents=[step(name="q1", state={"k1": "q1 wrote"}),
                                                step(name="q2")]),
        step(name="p3_z")])
    app = App(name="nested_parallel", root_agent=SequentialAgent(name="root", sub_agents=[
        step(name="plan", output="q"),
        ParallelAgent(name="fan", sub_agents=[step(name="p1", state={"r1": "p1 wrote"}), p3])]))
    sink = MemorySink()
    attach(app, Emitter(sink))
    asyncio.run(_bounded(app))
    receipts = {(m["branch"], m.get("key"), m.get("value")) for m in map(json.loads, sink.lines)
                if m.get("kind") != "open"}
    assert ("p3", "k1", "q1 wrote") in receipts and ("q1", "k1", "q1 wrote") in receipts


def test_parallel_members_writing_one_key_last_write_wins_in_adk_conflict_in_fanin(
        runs: Runs) -> None:
    outcome, close = runs["parallel_conflict"]
    assert outcome.state["verdict"] in ("relevant", "irrelevant")  # ParallelAgent's docstring
    assert close["reason"] == "timeout"
    assert sorted((c["branch"], c["key"], c["value"]) for c in close["conflicts"]) \
        == [("rank", "verdict", "irrelevant"), ("retrieve", "verdict", "relevant")]
    assert close["values"] == {"summary": "short"}


def test_a_failing_parallel_member_fails_the_run_and_the_join(runs: Runs) -> None:
    outcome, close = runs["parallel_failure"]
    assert isinstance(outcome, RuntimeError)
    assert (close["reason"], close["failed"]) == ("timeout", ["summarize"])
    assert close["branches"]["summarize"]["error"] == "RuntimeError: summarize busy (call 1)"


@pytest.mark.parametrize("variant", ["parallel_cancelled", "workflow_cancelled"])
def test_a_branch_cancelled_when_a_sibling_fails_is_missing_not_ok(runs: Runs,
                                                                   variant: str) -> None:
    outcome, close = runs[variant]
    assert isinstance(outcome, RuntimeError)
    assert (close["reason"], close["failed"], close["missing"]) == (
        "timeout", ["rank"], ["wait"])  # wait was an ok receipt of value null
    assert "wait" not in close["branches"] and close["values"] == {}


def test_the_example_completes_both_routes(runs: Runs) -> None:
    _, closes = runs["example"]
    assert sorted((c["reason"], tuple(c["pruned"])) for c in closes) \
        == [("complete", ("review_legal",)), ("complete", ("review_tech",))]


def test_attach_registers_on_a_runner_and_refuses_anything_else() -> None:
    app = example.build(QUESTION)
    runner = Runner(app=app, session_service=InMemorySessionService(),
                    auto_create_session=True)
    plugin = attach(runner, Emitter(MemorySink()))
    assert isinstance(plugin, FaninPlugin) and runner.plugin_manager.plugins == [plugin]
    with pytest.raises(TypeError, match="App or Runner"):
        attach(object(), Emitter(MemorySink()))


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


class _FailsUnprintably(BaseAgent):
    """A member that fails with an exception whose text cannot be read."""

    async def _run_async_impl(self, ctx: Any) -> AsyncGenerator[Any, None]:
        raise _Unprintable
        for event in ():  # an async generator, as ADK expects; never reached
            yield event


def test_a_member_s_unprintable_exception_is_its_receipt_not_the_plugin_s_error() -> None:
    """The member's exception goes on (its text described as unreadable); reading it raised
    inside the plugin, whose error ADK put in its place."""
    step = example.Step
    app = App(name="unprintable", root_agent=SequentialAgent(name="root", sub_agents=[
        step(name="plan", output="q"),
        ParallelAgent(name="fan", sub_agents=[step(name="ok_member"),
                                              _FailsUnprintably(name="bad_member")])]))
    sink = MemorySink()
    attach(app, Emitter(sink))
    outcome = asyncio.run(_bounded(app))
    assert isinstance(outcome, _Unprintable), repr(outcome)
    errors = [m["error"] for m in map(json.loads, sink.lines) if m.get("status") == "error"]
    assert errors == ["_Unprintable: <str() of the exception failed: RuntimeError>"]
