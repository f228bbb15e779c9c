"""The same fan-out in a LangGraph-style graph shape: nodes, edges, a conditional edge, and a
join node whose fan-in is a Fanin contract. No LangGraph dependency: a tiny runner below.

Run: ``.venv/bin/python examples/fanout_graph.py out.jsonl``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from fanin.sdk import Emitter, JoinContext, JsonlFileSink

State = dict[str, Any]


class Graph:
    """Nodes, plain edges and conditional edges, run breadth-first (a Pregel-like superstep)."""

    def __init__(self) -> None:
        self.nodes: dict[str, Callable[[State], Any]] = {}
        self.edges: dict[str, list[str]] = {}
        self.routes: dict[str, tuple[Callable[[State], str], list[str]]] = {}

    def add_node(self, name: str, fn: Callable[[State], Any]) -> None:
        self.nodes[name] = fn

    def add_edge(self, src: str, dst: str) -> None:
        self.edges.setdefault(src, []).append(dst)

    def add_conditional_edges(self, src: str, decide: Callable[[State], str],
                              targets: list[str]) -> None:
        self.routes[src] = (decide, targets)

    def run(self, start: str, state: State, emitter: Emitter, ctx: JoinContext) -> None:
        frontier = [start]
        while frontier:
            nxt: list[str] = []
            for name in frontier:
                with emitter.receipt(ctx, name) as receipt:
                    receipt.value = self.nodes[name](state)
                state[name] = receipt.value
                nxt.extend(self.edges.get(name, []))
                if name in self.routes:
                    decide, targets = self.routes[name]
                    chosen = decide(state)
                    for target in targets:  # prune the routes not taken
                        if target != chosen:
                            emitter.skip(ctx, target)
                    nxt.append(chosen)
            frontier = nxt


def build() -> Graph:
    graph = Graph()
    graph.add_node("classify", lambda s: "legal" if "contract" in s["question"] else "tech")
    graph.add_node("retrieve", lambda s: [f"doc about {s['question']}"])
    graph.add_node("review/legal", lambda s: "clause 4 is fine")
    graph.add_node("review/tech", lambda s: "code looks fine")
    graph.add_edge("classify", "retrieve")
    graph.add_conditional_edges("classify", lambda s: f"review/{s['classify']}",
                                ["review/legal", "review/tech"])
    return graph


def main(path: str) -> None:
    with JsonlFileSink(path) as sink:
        emitter = Emitter(sink)
        graph = build()
        for question in ("review this contract", "review this patch"):
            ctx = JoinContext.new(run_id="graph-demo")
            emitter.open(ctx, required=["classify", "retrieve", "review/legal", "review/tech"])
            graph.run("classify", {"question": question}, emitter, ctx)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(f"usage: python {sys.argv[0]} OUT.jsonl", file=sys.stderr)
        raise SystemExit(2)
    main(sys.argv[1])
