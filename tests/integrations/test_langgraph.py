"""LangGraph's own fan-in against Fanin's close of the same runs.

Real LangGraph, deterministic nodes (``examples/langgraph_fanout.py``), no model, no network.
Every variant runs the graph with Fanin attached, all emitted lines go through one bounded
``fanin run``, and each close is compared with what LangGraph itself produced: its final state
where its super-step join succeeds, its error where it raises.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import operator
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.runnables import RunnableLambda
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.errors import InvalidUpdateError
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, Send, interrupt
from support.fanin_runs import fold_runs, load_example

from fanin.integrations.langgraph import FaninCallbackHandler, attach
from fanin.sdk import Emitter, MemorySink, PublishError

example = load_example("langgraph_fanout")
CONTRACT_QUESTION = {"question": "review this contract"}
WRITTEN = ("docs", "score", "summary", "verdict")  # the keys the five branches write


def sends_graph() -> Any:
    """A map step: ``split`` sends three packets to ``annotate``, which appends to a reducer."""
    graph = StateGraph(example.Triage)
    graph.add_node("split", lambda s: {})
    graph.add_node("annotate", lambda packet: {"log": [f"note {packet['n']}"]})
    graph.add_edge(START, "split")
    graph.add_conditional_edges(
        "split", lambda s: [Send("annotate", {"n": n}) for n in (3, 1, 2)], ["annotate"])
    graph.add_edge("annotate", END)
    return graph.compile()


def start_graph() -> Any:
    """A fan-out straight from ``START`` (static edges)."""
    graph = StateGraph(example.Triage)
    graph.add_node("retrieve", lambda s: {"docs": ["a doc"]})
    graph.add_node("rank", lambda s: {"score": 0.5})
    for node in ("retrieve", "rank"):
        graph.add_edge(START, node)
        graph.add_edge(node, END)
    return graph.compile()


def goto_graph() -> Any:
    """``pick`` routes with ``Command(goto=...)`` among its declared destinations."""
    graph = StateGraph(example.Triage)
    graph.add_node("pick", lambda s: Command(goto="review_tech", update={"log": ["picked"]}),
                   destinations=("review_legal", "review_tech"))
    graph.add_node("review_legal", lambda s: {"verdict": "clause 4 is fine"})
    graph.add_node("review_tech", lambda s: {"verdict": "code looks fine"})
    graph.add_edge(START, "pick")
    return graph.compile()


def start_routes_graph() -> Any:
    """``START`` fans out by a static edge and a conditional edge with a path map."""
    graph = StateGraph(example.Triage)
    graph.add_node("rank", lambda s: {"score": 0.5})
    graph.add_node("retrieve", lambda s: {"docs": ["a doc"]})
    graph.add_node("review_legal", lambda s: {"verdict": "fine"})
    graph.add_edge(START, "rank")
    graph.add_conditional_edges(START, lambda s: "retrieve",
                                {"retrieve": "retrieve", "legal": "review_legal"})
    for node in ("rank", "retrieve", "review_legal"):
        graph.add_edge(node, END)
    return graph.compile()


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


def failing_graph(second: Callable[[Any], Any]) -> Any:
    """``plan`` fans out to ``rank`` (raises) and ``retrieve`` (``second``)."""
    graph = StateGraph(example.Triage)
    graph.add_node("plan", lambda s: {})

    def rank(state: Any) -> Any:
        raise Unprintable if second is None else ValueError("no ranker")

    graph.add_node("rank", rank)
    graph.add_node("retrieve", second or (lambda s: {"docs": ["a doc"]}))
    graph.add_edge(START, "plan")
    for node in ("rank", "retrieve"):
        graph.add_edge("plan", node)
        graph.add_edge(node, END)
    return graph.compile()


class Bare(TypedDict, total=False):
    """A state of plain keys, and a reducer list."""

    a: str
    b: str
    c: str
    x: Any
    y: str
    done: str
    results: Annotated[list[Any], operator.add]


def renamed_router_graph() -> Any:
    """``plan`` fans out to ``a`` and ``b`` and routes to ``c`` (raises) or ``d`` by a path
    function renamed with ``with_config(run_name=...)``: its routes were not seen, so ``c``
    and ``d`` were in no join and the failed run closed ``complete``."""
    graph = StateGraph(Bare)
    graph.add_node("plan", lambda s: {})
    graph.add_node("a", lambda s: {"a": "a"})
    graph.add_node("b", lambda s: {"b": "b"})

    def boom(state: Any) -> Any:
        raise RuntimeError("c failed")

    graph.add_node("c", boom)
    graph.add_node("d", lambda s: {})
    graph.add_edge(START, "plan")
    graph.add_edge("plan", "a")
    graph.add_edge("plan", "b")
    graph.add_conditional_edges(
        "plan", RunnableLambda(lambda s: "c").with_config(run_name="router"), {"c": "c", "d": "d"})
    return graph.compile()


def handoff_graph() -> Any:
    """Branch ``agent1`` is a subgraph whose node hands off to the parent with
    ``Command(graph=Command.PARENT, ...)`` (LangGraph raises ``ParentCommand`` through the
    task): it finished, but no receipt was sent."""
    inner = StateGraph(Bare)
    inner.add_node("inner", lambda s: Command(graph=Command.PARENT, update={"x": "from agent1"},
                                              goto="finish"))
    inner.add_edge(START, "inner")
    graph = StateGraph(Bare)
    graph.add_node("plan", lambda s: {})
    graph.add_node("agent1", inner.compile(), destinations=("finish",))
    graph.add_node("agent2", lambda s: {"y": "from agent2"})
    graph.add_node("finish", lambda s: {"done": "yes"})
    graph.add_edge(START, "plan")
    graph.add_edge("plan", "agent1")
    graph.add_edge("plan", "agent2")
    return graph.compile()


class Ambiguous:
    """A packet that compares as a numpy array does: ``==`` gives something that is no bool
    (also against itself: ``==`` is not identity)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __eq__(self, other: object) -> Any:
        return self

    def __bool__(self) -> bool:
        raise ValueError("the truth value of an array is ambiguous")

    __hash__ = object.__hash__


def ambiguous_sends_graph(packets: int = 6) -> Any:
    """``Send`` arguments holding values whose ``==`` cannot be a bool: the handler compared
    them to match packets to tasks, and its error failed the graph."""
    graph = StateGraph(Bare)
    graph.add_node("plan", lambda s: {})
    graph.add_node("worker", lambda packet: {"results": [packet.n]})
    graph.add_edge(START, "plan")
    graph.add_conditional_edges(
        "plan", lambda s: [Send("worker", Ambiguous(n)) for n in range(packets)], ["worker"])
    graph.add_edge("worker", END)
    return graph.compile()


def path_names_graph() -> Any:
    """Nodes ``search/web`` (an edge) and ``search`` (the route not taken): the skip of
    ``search`` pruned ``search/web`` too, a path under it, and its receipt went late."""
    graph = StateGraph(Bare)
    graph.add_node("plan", lambda s: {})
    graph.add_node("search/web", lambda s: {"a": "w"})
    graph.add_node("search", lambda s: {"b": "s"})
    graph.add_node("other", lambda s: {"c": "o"})
    graph.add_edge(START, "plan")
    graph.add_edge("plan", "search/web")
    graph.add_conditional_edges("plan", lambda s: "other", {"other": "other", "search": "search"})
    return graph.compile()


def edge_and_sends_graph() -> Any:
    """``plan`` reaches ``worker`` by an edge and sends it a packet: two tasks of ``worker``;
    the edge's was left out of the join (its receipt went late)."""
    graph = StateGraph(Bare)
    graph.add_node("plan", lambda s: {})
    graph.add_node("worker", lambda s: {"results": [sorted(s)]})
    graph.add_node("other", lambda s: {"results": ["other"]})
    graph.add_edge(START, "plan")
    graph.add_edge("plan", "worker")
    graph.add_conditional_edges("plan", lambda s: [Send("worker", {"x": 1}), "other"],
                                ["worker", "other"])
    return graph.compile()


def self_referring_value_graph() -> Any:
    """Branch ``b`` returns a value that refers to itself: encoding it raised RecursionError
    in the handler, which failed the graph."""
    graph = StateGraph(Bare)
    graph.add_node("plan", lambda s: {})
    graph.add_node("a", lambda s: {"a": "a"})

    def looped(state: Any) -> Any:
        value: dict[str, Any] = {}
        value["self"] = value
        return {"x": value}

    graph.add_node("b", looped)
    graph.add_edge(START, "plan")
    for node in ("a", "b"):
        graph.add_edge("plan", node)
    return graph.compile()


def lambda_route_graph() -> Any:
    """``plan`` reaches ``a`` by an edge and ``b`` or ``c`` by a conditional edge whose path
    is a ``lambda``: an async run names it ``None`` in its callbacks (its fan-out was lost)."""
    graph = StateGraph(Bare)
    graph.add_node("plan", lambda s: {})
    for node in "abc":
        graph.add_node(node, lambda s, node=node: {node: node})
    graph.add_edge(START, "plan")
    graph.add_edge("plan", "a")
    graph.add_conditional_edges("plan", lambda s: "left", {"left": "b", "right": "c"})
    return graph.compile()


class _ItemsRaise(dict):  # type: ignore[type-arg]
    """A mapping whose reading raises (a lazy proxy): LangGraph stores it as it is."""

    def items(self) -> Any:
        raise RuntimeError("lazy mapping failed")


def unreadable_values_graph() -> Any:
    """Branch ``b`` writes a value whose ``items()`` raises; branch ``c`` writes a state key
    holding a lone surrogate: LangGraph takes both; the handler failed the graph."""
    graph = StateGraph(TypedDict("Odd", {"a": str, "b": Any, "\ud800": int}, total=False))
    graph.add_node("plan", lambda s: {})
    graph.add_node("a", lambda s: {"a": "a"})
    graph.add_node("b", lambda s: {"b": _ItemsRaise(k=1)})
    graph.add_node("c", lambda s: {"\ud800": 1})
    graph.add_edge(START, "plan")
    for node in "abc":
        graph.add_edge("plan", node)
    return graph.compile()


async def _never(state: Any) -> Any:
    await asyncio.Event().wait()  # runs until LangGraph cancels it (a sibling failed)


def _invoke(graph: Any) -> Any:
    return graph.invoke(CONTRACT_QUESTION)


def _ainvoke(graph: Any) -> Any:
    return asyncio.run(graph.ainvoke(CONTRACT_QUESTION))


def _per_run(graph: Any) -> Any:  # the handler passed per run instead of bound by attach
    return graph.invoke(CONTRACT_QUESTION)


VARIANTS: dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]] = {
    "agree": (example.build, _invoke),
    "agree_async": (example.build, _ainvoke),
    "different": (lambda: example.build(legal_writes={"score": 0.2}), _invoke),
    "equal": (lambda: example.build(legal_writes={"score": 0.9}), _invoke),
    "waiting": (lambda: example.build(join="waiting"), _invoke),
    "exhausted": (lambda: example.build(failures=2), _invoke),
    "sends": (sends_graph, lambda graph: graph.invoke({"question": "q"})),
    "start": (start_graph, _invoke),
    "goto": (goto_graph, _invoke),
    "start_routes": (start_routes_graph, _invoke),
    "cancelled": (lambda: failing_graph(_never), _ainvoke),
    "unprintable": (lambda: failing_graph(None), _invoke),
    "renamed_router": (renamed_router_graph, lambda graph: graph.invoke({})),
    "handoff": (handoff_graph, lambda graph: graph.invoke({})),
    "ambiguous_sends": (ambiguous_sends_graph, lambda graph: graph.invoke({})),
    "path_names": (path_names_graph, lambda graph: graph.invoke({})),
    "edge_and_sends": (edge_and_sends_graph, lambda graph: graph.invoke({})),
    "self_referring": (self_referring_value_graph, lambda graph: graph.invoke({})),
    "lambda_route_async": (lambda_route_graph, lambda graph: asyncio.run(graph.ainvoke({}))),
    "unreadable_values": (unreadable_values_graph, lambda graph: graph.invoke({})),
}


Runs = dict[str, tuple[Any, Any]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """Variant -> (LangGraph's result or the exception it raised, Fanin's close); "example" ->
    (None, the closes of the example's joins). One ``fanin run`` folds them all."""
    folder = tmp_path_factory.mktemp("langgraph")
    outcomes: dict[str, Any] = {}
    lines: dict[str, list[str]] = {}
    for name, (build, run) in VARIANTS.items():
        sink = MemorySink()
        try:
            outcomes[name] = run(attach(build(), Emitter(sink)))
        except Exception as exc:  # the framework's own failure is what is compared
            outcomes[name] = exc
        lines[name] = sink.lines
    sink = MemorySink()
    graph = example.build()
    outcomes["per_run"] = graph.invoke(
        CONTRACT_QUESTION, {"callbacks": [FaninCallbackHandler(graph, Emitter(sink))]})
    lines["per_run"] = sink.lines
    return fold_runs(outcomes, lines, example, folder)


@pytest.mark.parametrize("variant", ["agree", "agree_async", "per_run"])
def test_where_langgraph_joins_fanin_values_equal_its_state(
        runs: Runs, variant: str) -> None:
    state, close = runs[variant]
    assert isinstance(state, dict) and state["merged"] is True  # LangGraph's fan-in ran
    assert close["reason"] == "complete"
    assert close["required"] == ["rank", "retrieve", "review_legal", "review_tech", "summarize"]
    assert close["pruned"] == ["review_tech"]
    assert close["values"] == {key: state[key] for key in WRITTEN}
    assert close["conflicts"] == []
    summarize = close["branches"]["summarize"]
    assert (summarize["status"], summarize["attempt"]) == ("ok", 2)
    assert close["counts"]["superseded"] == 1


def test_concurrent_different_writes_raise_in_langgraph_and_are_a_conflict_in_fanin(
        runs: Runs) -> None:
    error, close = runs["different"]
    assert isinstance(error, InvalidUpdateError)
    assert "score" in str(error)
    assert close["reason"] == "timeout"
    assert sorted((c["kind"], c["branch"], c["key"], c["value"]) for c in close["conflicts"]) \
        == [("key_conflict", "rank", "score", 0.9), ("key_conflict", "review_legal", "score", 0.2)]
    assert close["values"] == {"docs": ["doc about review this contract"],
                               "summary": "two docs, one relevant"}


def test_concurrent_equal_writes_raise_in_langgraph_but_complete_in_fanin(
        runs: Runs) -> None:
    error, close = runs["equal"]
    assert isinstance(error, InvalidUpdateError)
    assert close["reason"] == "complete"
    assert close["values"]["score"] == 0.9
    assert close["conflicts"] == []


def test_a_waiting_join_behind_a_route_not_taken_never_runs_but_fanin_closes(
        runs: Runs) -> None:
    state, close = runs["waiting"]
    assert "merged" not in state  # add_edge([...5 branches], "merge") waited for review_tech
    assert close["reason"] == "complete"
    assert close["pruned"] == ["review_tech"]
    assert close["values"] == {key: state[key] for key in WRITTEN}


def test_a_branch_that_fails_every_attempt_fails_the_run_and_the_join(
        runs: Runs) -> None:
    error, close = runs["exhausted"]
    assert type(error).__name__ == "TransientError"
    assert close["reason"] == "timeout"
    assert close["failed"] == ["summarize"]
    summarize = close["branches"]["summarize"]
    assert (summarize["status"], summarize["attempt"]) == ("error", 2)
    assert summarize["error"] == "TransientError: summarizer busy (call 2)"


def test_sends_are_numbered_branches_and_reducer_writes_add_up_as_in_langgraph(
        runs: Runs) -> None:
    state, close = runs["sends"]
    assert close["reason"] == "complete"
    assert close["required"] == ["annotate/0", "annotate/1", "annotate/2"]
    # a reducer key is not a conflict: each packet's update is kept under its branch
    assert close["values"] == {"annotate/0": {"log": ["note 3"]},
                               "annotate/1": {"log": ["note 1"]},
                               "annotate/2": {"log": ["note 2"]}}
    assert sorted(itertools.chain.from_iterable(v["log"] for v in close["values"].values())) \
        == sorted(state["log"])


def test_a_fan_out_from_start_and_a_command_goto_are_joins_too(runs: Runs) -> None:
    state, close = runs["start"]
    assert (close["reason"], close["required"]) == ("complete", ["rank", "retrieve"])
    assert close["values"] == {"docs": state["docs"], "score": state["score"]}
    state, close = runs["goto"]
    assert (close["reason"], close["pruned"]) == ("complete", ["review_legal"])
    assert close["values"] == {"verdict": state["verdict"]} == {"verdict": "code looks fine"}


def test_conditional_routes_from_start_open_the_join_with_the_static_ones(runs: Runs) -> None:
    state, close = runs["start_routes"]  # the conditional routes from START were not reported
    assert (close["reason"], close["required"], close["pruned"]) == (
        "complete", ["rank", "retrieve", "review_legal"], ["review_legal"])
    assert close["values"] == {"docs": state["docs"], "score": state["score"]}


def test_a_branch_cancelled_when_a_sibling_fails_is_missing_not_failed(runs: Runs) -> None:
    error, close = runs["cancelled"]
    assert isinstance(error, ValueError)
    assert (close["reason"], close["failed"], close["missing"]) == (
        "timeout", ["rank"], ["retrieve"])  # retrieve's CancelledError was an error receipt
    assert "retrieve" not in close["branches"]


def test_an_exception_whose_text_fails_still_reaches_the_caller(runs: Runs) -> None:
    error, close = runs["unprintable"]
    assert isinstance(error, Unprintable)  # was the handler's own RuntimeError
    assert close["branches"]["rank"]["error"] == \
        "Unprintable: <str() of the exception failed: RuntimeError>"


def test_attach_refuses_what_is_not_a_compiled_state_graph() -> None:
    with pytest.raises(TypeError, match="compiled StateGraph"):
        attach(object(), Emitter(MemorySink()))


def test_the_example_completes_both_routes(runs: Runs) -> None:
    _, closes = runs["example"]
    assert sorted((c["reason"], tuple(c["pruned"])) for c in closes) \
        == [("complete", ("review_legal",)), ("complete", ("review_tech",))]


def test_a_renamed_router_reports_its_routes(runs: Runs) -> None:
    error, close = runs["renamed_router"]
    assert str(error) == "c failed"
    assert (close["reason"], close["required"], close["pruned"], close["failed"]) == (
        "timeout", ["a", "b", "c", "d"], ["d"], ["c"])


def test_a_handoff_from_a_subgraph_is_the_branch_s_result(runs: Runs) -> None:
    state, close = runs["handoff"]
    assert (state["x"], state["y"], state["done"]) == ("from agent1", "from agent2", "yes")
    assert (close["reason"], close["missing"]) == ("complete", [])
    assert close["values"] == {"x": "from agent1", "y": "from agent2"}


def test_send_arguments_are_never_compared(runs: Runs) -> None:
    state, close = runs["ambiguous_sends"]
    assert sorted(state["results"]) == list(range(6))  # the graph ran as without Fanin
    assert close["reason"] == "complete"
    assert [close["values"][f"worker/{n}"] for n in range(6)] == \
        [{"results": [n]} for n in range(6)]


def test_node_names_that_are_paths_of_one_another_are_separate_routes(runs: Runs) -> None:
    state, close = runs["path_names"]
    assert (state["a"], state["c"], "b" in state) == ("w", "o", False)
    assert (close["reason"], close["required"], close["pruned"]) == (
        "complete", ["other", "search", "search%2Fweb"], ["search"])
    assert close["values"] == {"a": "w", "c": "o"}


def test_a_node_reached_by_an_edge_and_a_send_is_two_branches(runs: Runs) -> None:
    state, close = runs["edge_and_sends"]
    assert len(state["results"]) == 3  # worker ran twice, other once
    assert (close["reason"], close["required"]) == (
        "complete", ["other", "worker", "worker/0"])


def test_a_value_that_refers_to_itself_is_an_error_receipt_not_a_failed_graph(
        runs: Runs) -> None:
    state, close = runs["self_referring"]
    assert state["a"] == "a" and state["x"]["self"] is state["x"]
    assert (close["failed"], close["branches"]["b"]["error"]) == (
        ["b"], "unreported value: nested too deeply, or refers to itself")


def test_an_async_run_reports_the_routes_of_a_lambda_path(runs: Runs) -> None:
    state, close = runs["lambda_route_async"]
    assert (state["a"], state["b"], "c" in state) == ("a", "b", False)
    assert (close["reason"], close["required"], close["pruned"]) == (
        "complete", ["a", "b", "c"], ["c"])


def test_values_and_keys_that_cannot_be_read_are_error_receipts_not_a_failed_graph(
        runs: Runs) -> None:
    state, close = runs["unreadable_values"]
    assert state["a"] == "a" and state["\ud800"] == 1 and isinstance(state["b"], _ItemsRaise)
    assert close["failed"] == ["b", "c"]
    assert close["branches"]["b"]["error"] == "unreported value: RuntimeError: lazy mapping failed"
    assert "surrogates not allowed" in close["branches"]["c"]["error"]


class _RefusesErrors(MemorySink):
    """A sink that fails on error receipts (a test double: the real sinks fail on cue only
    with a broken network)."""

    def publish(self, message: Any) -> None:
        if '"status":"error"' in message.line:
            raise PublishError("the sink is down")
        super().publish(message)


def test_a_sink_failure_never_replaces_the_node_s_exception(
        caplog: pytest.LogCaptureFixture) -> None:
    graph = attach(failing_graph(lambda s: {"docs": ["a doc"]}), Emitter(_RefusesErrors()))
    with caplog.at_level(logging.WARNING), pytest.raises(ValueError, match="no ranker"):
        _invoke(graph)
    assert "the error receipt of branch 'rank'" in caplog.text


def _interrupting_graph() -> Any:
    """START fans out to ``a`` and ``b``; ``a`` to ``c`` and ``d``, which interrupts."""
    def d(state: Any) -> Any:
        return {"y": f"approved={interrupt('approve?')}"}

    builder = StateGraph(Bare)
    builder.add_node("a", lambda s: {"a": "a"})
    builder.add_node("b", lambda s: {"b": "b"})
    builder.add_node("c", lambda s: {"c": "c"})
    builder.add_node("d", d)
    builder.add_edge(START, "a")
    builder.add_edge(START, "b")
    builder.add_edge("a", "c")
    builder.add_edge("a", "d")
    return builder.compile(checkpointer=InMemorySaver())


def _opens(lines: list[str]) -> list[list[str]]:
    return [json.loads(line)["required"] for line in lines if '"kind":"open"' in line]


@pytest.mark.parametrize("wrapped", [False, True])
def test_a_resumed_run_opens_no_join_for_the_start_it_resumes(wrapped: bool) -> None:
    """The resumed run (``Command(resume=...)``) runs ``d`` alone: it opened a phantom join
    over ``a`` and ``b`` (both long done), which then closed ``timeout`` with both missing;
    also when the graph is called inside a chain."""
    sink = MemorySink()
    attached = attach(_interrupting_graph(), Emitter(sink))
    graph = RunnableLambda(lambda x, config: attached.invoke(x, config)) if wrapped else attached
    config = {"configurable": {"thread_id": "t"}}
    graph.invoke({}, config)
    assert _opens(sink.lines) == [["a", "b"], ["c", "d"]]
    assert graph.invoke(Command(resume="yes"), config)["y"] == "approved=yes"
    assert _opens(sink.lines) == [["a", "b"], ["c", "d"]]


def test_a_command_that_starts_a_thread_is_a_run_from_start() -> None:
    """``Command(update=...)`` as the input of a fresh thread runs START's edges: its fan-out
    is a join (not a resume)."""
    sink = MemorySink()
    graph = attach(_interrupting_graph(), Emitter(sink))
    graph.invoke(Command(update={"x": "given"}), {"configurable": {"thread_id": "fresh"}})
    assert _opens(sink.lines) == [["a", "b"], ["c", "d"]]


def test_a_top_graph_node_handing_off_above_it_is_not_a_result() -> None:
    """A node of the attached (top) graph returning ``Command(graph=Command.PARENT)``: LangGraph
    fails the run (there is no parent), and the branch has no receipt (not ``ok``)."""
    builder = StateGraph(Bare)
    builder.add_node("plan", lambda s: {})
    builder.add_node("a", lambda s: {"a": "a"})
    builder.add_node("b", lambda s: Command(graph=Command.PARENT, update={"b": "b"}))
    builder.add_edge(START, "plan")
    for node in ("a", "b"):
        builder.add_edge("plan", node)
    sink = MemorySink()
    with pytest.raises(Exception):  # noqa: B017 (LangGraph's own error, whatever its type)
        attach(builder.compile(), Emitter(sink)).invoke({})
    assert sorted(json.loads(line)["branch"] for line in sink.lines
                  if '"kind":"open"' not in line) == ["a"]


def test_a_fan_out_too_wide_to_open_is_not_reported_and_the_graph_runs(
        caplog: pytest.LogCaptureFixture) -> None:
    sink = MemorySink()
    graph = attach(ambiguous_sends_graph(60), Emitter(sink, max_bytes=700))
    with caplog.at_level(logging.WARNING):
        assert sorted(graph.invoke({})["results"]) == list(range(60))
    assert sink.lines == [] and "a fan-out of 60 branches is not reported" in caplog.text
