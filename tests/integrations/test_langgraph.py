"""LangGraph's own fan-in against Fanin's close of the same runs.

Real LangGraph, deterministic nodes (``examples/langgraph_fanout.py``), no model, no network.
Every variant runs the graph with Fanin attached, all emitted lines go through one bounded
``fanin run``, and each close is compared with what LangGraph itself produced: its final state
where its super-step join succeeds, its error where it raises.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

import pytest
from langgraph.errors import InvalidUpdateError
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, Send
from support.fanin_runs import fold_runs, load_example

from fanin.integrations.langgraph import FaninCallbackHandler, attach
from fanin.sdk import Emitter, MemorySink

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
