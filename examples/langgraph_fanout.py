"""A LangGraph triage graph whose fan-out is reported to Fanin with one call:
``fanin.integrations.langgraph.attach(graph, emitter)``. The nodes are plain functions and know
nothing of Fanin. Needs the langgraph extra: ``pip install -e '.[langgraph]'`` in the checkout.

``plan`` fans out to ``retrieve``, ``rank`` and ``summarize`` (static edges) and to one of
``review_legal`` / ``review_tech`` (a conditional edge); ``summarize`` fails once and LangGraph's
``RetryPolicy`` runs it again; ``merge`` is the fan-in. Fanin receives one open (five required
branches), a skip for the review not taken, and a receipt per branch attempt.

Run: ``.venv/bin/python examples/langgraph_fanout.py traffic.jsonl``, then
``.venv/bin/fanin run --input traffic.jsonl --output out/``.
"""

from __future__ import annotations

import operator
import sys
from typing import Annotated, Any, Literal, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import RetryPolicy

from fanin.integrations.langgraph import attach
from fanin.sdk import Emitter, JsonlFileSink

BRANCHES = ("retrieve", "rank", "summarize", "review_legal", "review_tech")


class Triage(TypedDict, total=False):
    """The graph's state: one key per branch, plus a reducer key any node may append to."""

    question: str
    docs: list[str]
    score: float
    summary: str
    verdict: str
    merged: bool
    log: Annotated[list[str], operator.add]  # a reducer: concurrent writes are meant to add up


class TransientError(RuntimeError):
    """A failure worth retrying (a timeout of a tool, say)."""


class Flaky:
    """A node that fails its first ``failures`` calls, then writes ``update``."""

    def __init__(self, update: dict[str, Any], failures: int) -> None:
        self.update = update
        self.failures = failures
        self.calls = 0

    def __call__(self, state: Triage) -> dict[str, Any]:
        self.calls += 1
        if self.calls <= self.failures:
            raise TransientError(f"summarizer busy (call {self.calls})")
        return self.update


def route(state: Triage) -> Literal["legal", "tech"]:
    """The conditional edge: contracts go to legal review, the rest to tech review."""
    return "legal" if "contract" in state["question"] else "tech"


def build(*, legal_writes: dict[str, Any] | None = None, failures: int = 1,
          join: Literal["edges", "waiting"] = "edges") -> Any:
    """The compiled graph (not yet attached).

    ``legal_writes`` replaces what ``review_legal`` writes (e.g. ``{"score": 0.2}`` to collide
    with ``rank``); ``failures`` is how often ``summarize`` fails (its policy allows 2
    attempts); ``join="waiting"`` makes ``merge`` wait for all five branches
    (``add_edge([...], "merge")``) instead of running after whichever ran.
    """
    graph = StateGraph(Triage)
    graph.add_node("plan", lambda s: {"log": [f"plan: {s['question']}"]})
    graph.add_node("retrieve", lambda s: {"docs": [f"doc about {s['question']}"]})
    graph.add_node("rank", lambda s: {"score": 0.9})
    graph.add_node("summarize", Flaky({"summary": "two docs, one relevant"}, failures),
                   retry_policy=RetryPolicy(max_attempts=2, initial_interval=0.001,
                                            jitter=False, retry_on=TransientError))
    graph.add_node("review_legal", lambda s: legal_writes or {"verdict": "clause 4 is fine"})
    graph.add_node("review_tech", lambda s: {"verdict": "code looks fine"})
    graph.add_node("merge", lambda s: {"merged": True})
    graph.add_edge(START, "plan")
    for branch in ("retrieve", "rank", "summarize"):
        graph.add_edge("plan", branch)
    graph.add_conditional_edges("plan", route, {"legal": "review_legal",
                                                "tech": "review_tech"})
    if join == "waiting":
        graph.add_edge(list(BRANCHES), "merge")
    else:
        for branch in BRANCHES:
            graph.add_edge(branch, "merge")
    graph.add_edge("merge", END)
    return graph.compile()


def main(path: str) -> None:
    """Run the graph on two questions (one per route), reporting to the JSONL file ``path``."""
    with JsonlFileSink(path) as sink:
        graph = attach(build(), Emitter(sink), deadline_s=60)
        for question in ("review this contract", "review this patch"):
            state = graph.invoke({"question": question})
            print(f"{question!r}: verdict {state['verdict']!r}, merged {state['merged']}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(f"usage: python {sys.argv[0]} OUT.jsonl", file=sys.stderr)
        raise SystemExit(2)
    main(sys.argv[1])
