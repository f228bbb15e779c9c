"""A Google ADK workflow whose fan-out is reported to Fanin with one call:
``fanin.integrations.adk.attach(app, emitter)``. The nodes are custom ``BaseAgent``s without a
model (deterministic, no network) and know nothing of Fanin. Needs the adk extra:
``pip install -e '.[adk]'`` in the checkout.

``plan`` fans out to ``retrieve``, ``rank`` and ``summarize`` (a tuple of successors) and, by
its route, to one of ``review_legal`` / ``review_tech`` (a routing map); ``summarize`` fails
once and ADK's ``RetryConfig`` runs it again; a ``JoinNode`` gathers the outputs of
``retrieve``, ``rank`` and ``summarize``; the review writes its verdict to session state.
Fanin receives one open (five required branches), a skip for the review not taken, and a
receipt per branch attempt.

Run: ``.venv/bin/python examples/adk_fanout.py traffic.jsonl``, then
``.venv/bin/fanin run --input traffic.jsonl --output out/``.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from google.adk.agents import BaseAgent
from google.adk.agents.invocation_context import InvocationContext
from google.adk.apps import App
from google.adk.events.event import Event
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.adk.workflow import START, JoinNode, RetryConfig, Workflow
from google.genai import types

from fanin.integrations.adk import attach
from fanin.sdk import Emitter, JsonlFileSink

BRANCHES = ("retrieve", "rank", "summarize", "review_legal", "review_tech")


class Step(BaseAgent):
    """A deterministic agent: fails its first ``failures`` runs, then yields one event with
    ``output`` (if any), ``state`` writes (if any) and a ``route`` (if any)."""

    output: Any = None
    state: dict[str, Any] | None = None
    route: str | None = None
    failures: int = 0
    calls: int = 0

    async def _run_async_impl(self, ctx: InvocationContext) -> AsyncGenerator[Event, None]:
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeError(f"{self.name} busy (call {self.calls})")
        yield Event(author=self.name, output=self.output, state=self.state, route=self.route)


def build(question: str, *, rank_state: dict[str, Any] | None = None, failures: int = 1,
          join_behind_route: bool = False) -> App:
    """The app (not yet attached) for ``question``.

    ``failures`` is how often ``summarize`` fails (its ``RetryConfig`` allows 2 attempts);
    ``rank_state`` makes ``rank`` also write session state (e.g. ``{"verdict": ...}`` to
    collide with the review); ``join_behind_route`` puts both reviews in front of the
    ``JoinNode`` too (they then give outputs instead of state), so one of its predecessors is
    behind the route not taken.
    """
    plan = Step(name="plan", output=question,
                route="legal" if "contract" in question else "tech")
    retrieve = Step(name="retrieve", output=[f"doc about {question}"])
    rank = Step(name="rank", output=0.9, state=rank_state)
    summarize = Step(name="summarize", output="two docs, one relevant", failures=failures,
                     retry_config=RetryConfig(max_attempts=2, initial_delay=0, jitter=0))
    review = {"legal": "clause 4 is fine", "tech": "code looks fine"}
    reviews = {route: Step(name=f"review_{route}", **({"output": verdict} if join_behind_route
                                                     else {"state": {"verdict": verdict}}))
               for route, verdict in review.items()}
    join = JoinNode(name="join")
    gathered = (retrieve, rank, summarize, *(reviews.values() if join_behind_route else ()))
    workflow = Workflow(name="triage", edges=[
        (START, plan),
        (plan, (retrieve, rank, summarize)),
        (plan, reviews),
        *((node, join) for node in gathered),
    ])
    return App(name="triage", root_agent=workflow)


@dataclass
class Outcome:
    """What ADK produced: the ``JoinNode``'s output (``None``: it never fired) and the final
    session state."""

    join_output: dict[str, Any] | None
    state: dict[str, Any]


async def run(app: App) -> Outcome:
    """One invocation of ``app`` with an in-memory session."""
    runner = Runner(app=app, session_service=InMemorySessionService(),
                    auto_create_session=True)
    join_output = None
    message = types.Content(role="user", parts=[types.Part(text="go")])
    async for event in runner.run_async(user_id="user", session_id="session",
                                        new_message=message):
        if event.output is not None and (event.node_info.path or "").endswith("/join@1"):
            join_output = event.output
    session = await runner.session_service.get_session(app_name=app.name, user_id="user",
                                                       session_id="session")
    assert session is not None
    await runner.close()
    return Outcome(join_output, dict(session.state))


def main(path: str) -> None:
    """Run the workflow on two questions (one per route), reporting to the JSONL file
    ``path``."""
    with JsonlFileSink(path) as sink:
        emitter = Emitter(sink)
        for question in ("review this contract", "review this patch"):
            app = build(question)
            attach(app, emitter, deadline_s=60)
            outcome = asyncio.run(run(app))
            print(f"{question!r}: join {outcome.join_output}, state {outcome.state}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(f"usage: python {sys.argv[0]} OUT.jsonl", file=sys.stderr)
        raise SystemExit(2)
    main(sys.argv[1])
