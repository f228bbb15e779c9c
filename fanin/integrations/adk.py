"""Google ADK: Fanin receipts from a ``Workflow``'s runs through an ADK plugin, without touching
its nodes.

``attach(app_or_runner, emitter)`` registers a ``FaninPlugin`` (ADK's extension point for
application-wide callbacks) on an ``App`` (before its ``Runner`` is made) or on a ``Runner``;
``App(root_agent=wf, plugins=[FaninPlugin(emitter, wf)])`` is the same. The plugin reads the
graphs of the workflows under the root once, and watches the events, agent callbacks and errors
ADK reports.

Mapping (``docs/integrations.md``):
- **Fan-out -> open.** A node ``X`` of a ``Workflow`` with two or more successors (a tuple
  ``(X, (a, b, c))``, a routing map ``(X, {"r1": a, "r2": b})``, several edges) opens one join
  when ``X`` finishes, with every successor required. ``START``'s fan-out opens when the
  workflow's first node starts.
- **Route not taken -> skip.** The successors ADK's own ``Graph.get_next_pending_nodes`` does
  not trigger for ``X``'s route are skipped at once. A ``JoinNode`` behind such a route never
  fires in ADK; the Fanin join does not wait for it.
- **Branch run -> receipt.** Each run of a successor reports one receipt per attempt:
  ``error`` (``"ErrorCode: message"`` from ADK's error event) per failed attempt
  (``RetryConfig`` retries are attempts 2, 3, ...), ``ok`` when it finishes. The value is the
  node's output (what a ``JoinNode`` aggregates, keyed by predecessor); a node that wrote
  exactly one session-state key reports that key and value instead, so two branches writing the
  same key with different values are a ``key_conflict`` (ADK keeps the last write).
- "Finishes": an agent node (a ``BaseAgent``) at ADK's ``after_agent_callback``; any other
  node (function nodes, ``JoinNode``) at its first event carrying an output.
- **``ParallelAgent``** (deprecated in ADK 2.x, still served): when it starts, one join with
  its sub-agents required; each sub-agent reports ``ok`` at its ``after_agent_callback`` (value
  and key as above, from the events it and the agents below it authored: a member that is a
  ``SequentialAgent`` writes through its own sub-agents) or ``error`` at
  ``on_agent_error_callback``.

Guarantees: one event loop drives an invocation and the callbacks change the plugin's state
without awaiting, under a lock for invocations on other threads; an invocation's state is
dropped when it ends. Errors of the sink propagate (ADK wraps plugin errors in
``RuntimeError``), so receipts are not lost silently, except while a node's own failure is
reported: that failure is what ADK goes on with, and the sink's is logged. Limits: a
non-agent node that finishes without an output is not reported (Fanin then reports it
missing at the deadline); a node reached by several fan-outs in one wave is matched to them
in trigger order; node and sub-agent names must be unique in the app (agent callbacks get
copies of the nodes, so names identify them).
"""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from fanin.integrations.fanout import (
    FanOutReporter,
    describe,
    describe_exception,
    keyed,
    missing_extra,
)
from fanin.sdk import Emitter, JoinContext

try:
    from google.adk.agents import BaseAgent
    from google.adk.plugins.base_plugin import BasePlugin
    from google.adk.workflow import START, Workflow
except ImportError as missing:  # the extra is not installed: say which
    raise missing_extra("adk", missing) from missing

__all__ = ["FaninPlugin", "attach"]

Target = tuple[JoinContext, str]  # a join a run reports to, and its branch name there
NodeKey = tuple[str, str]  # (workflow name, node name)


@dataclass
class _NodeRun:
    """One run of a node (all its attempts): what it wrote and the joins it reports to."""

    targets: list[Target]
    path: str | None = None
    output: Any = None
    route: Any = None
    state: dict[str, Any] = field(default_factory=dict)
    errors: int = 0
    done: bool = False

    def take(self, event: Any) -> None:
        """Keep what an event of this run wrote: state, route, output."""
        actions = event.actions
        if actions is not None and actions.state_delta:
            self.state.update(actions.state_delta)
        if actions is not None and actions.route is not None:
            self.route = actions.route
        if event.output is not None:
            self.output = event.output

    def receipt(self) -> tuple[str | None, Any]:
        """``(key, value)``: the one state key written, else the branch and the output."""
        if len(self.state) == 1:
            return keyed(self.state, lambda _: True)
        return None, self.output


@dataclass(frozen=True)
class _Located:
    """Where an event's node path points: the workflow and the node in its graph."""

    path: str
    workflow: str
    node: str
    graph_node: Any


@dataclass
class _Invocation:
    """What the plugin knows of one invocation."""

    invocation_id: str
    runs: dict[NodeKey, _NodeRun] = field(default_factory=dict)
    waiting: dict[NodeKey, deque[Target]] = field(default_factory=lambda: defaultdict(deque))
    started: set[str] = field(default_factory=set)  # workflows whose START fan-out is open
    members: dict[str, _NodeRun] = field(default_factory=dict)  # running ParallelAgent members
    # every agent under a running member (itself included) -> the names of the members it is
    # under (a ParallelAgent inside a member makes members of its own): a member that is a
    # SequentialAgent or a LoopAgent writes through the events of the agents below it
    member_of: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))


def _being_cancelled() -> bool:
    """Whether the running task is being cancelled (a sibling of a parallel fan-out failed,
    and ADK cancels the others; their ``after_agent_callback`` still runs)."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no event loop running
        return False
    cancelling = getattr(task, "cancelling", None)  # Python 3.11+ (3.10 cannot tell)
    return cancelling is not None and cancelling() > 0


def _under(agent: Any) -> Iterator[Any]:
    """``agent`` and every agent below it (its sub-agents, theirs...)."""
    pending, seen = [agent], set()
    while pending:
        node = pending.pop()
        if id(node) not in seen:
            seen.add(id(node))
            yield node
            pending.extend(getattr(node, "sub_agents", None) or ())


def _is_parallel(agent: Any) -> bool:
    """Whether ``agent`` is a ``ParallelAgent``: deprecated in ADK 2.x in favour of
    ``Workflow``, it may go within the supported range, so it is known by name, not imported."""
    return any(cls.__name__ == "ParallelAgent" for cls in type(agent).__mro__)


def _index(root: Any) -> tuple[dict[str, Workflow], dict[str, str]]:
    """Every ``Workflow`` under ``root`` by name, and the workflow of each node name (agent
    callbacks get a copy of the node, so names, not identities, tell them apart)."""
    workflows: dict[str, Workflow] = {}
    owners: dict[str, str] = {}
    pending, seen = [root], set()
    while pending:
        node = pending.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, Workflow) and node.graph is not None:
            workflows[node.name] = node
            for child in node.graph.nodes:
                owners[child.name] = node.name
                pending.append(child)
        pending.extend(getattr(node, "sub_agents", None) or ())
    return workflows, owners


class FaninPlugin(BasePlugin):
    """Turns the fan-outs and node results of the workflows under ``root`` (the app's root
    agent or node) into Fanin messages."""

    def __init__(self, emitter: Emitter, root: Any, *, name: str = "fanin",
                 contract: str | None = None, deadline_s: float | None = None,
                 allow_partial: bool | None = None, fail_fast: bool | None = None) -> None:
        super().__init__(name)
        self._workflows, self._owners = _index(root)
        self._reporter = FanOutReporter(emitter, contract=contract, deadline_s=deadline_s,
                                        allow_partial=allow_partial, fail_fast=fail_fast)
        self._lock = threading.Lock()
        self._invocations: dict[str, _Invocation] = {}

    # -- ADK callbacks ----------------------------------------------------------------------

    async def before_run_callback(self, *, invocation_context: Any) -> None:
        with self._lock:
            self._invocation(invocation_context)

    async def after_run_callback(self, *, invocation_context: Any) -> None:
        with self._lock:
            self._invocations.pop(invocation_context.invocation_id, None)

    async def on_run_error_callback(self, *, invocation_context: Any,
                                    error: Exception) -> None:
        with self._lock:
            self._invocations.pop(invocation_context.invocation_id, None)

    async def before_agent_callback(self, *, agent: BaseAgent, callback_context: Any) -> None:
        """An agent node starts an attempt: its run (a retry continues the current one); a
        ``ParallelAgent`` starts: the fan-out to its sub-agents."""
        with self._lock:
            inv = self._invocation(callback_context.get_invocation_context())
            if _is_parallel(agent):
                names = [sub.name for sub in agent.sub_agents]
                ctx = self._reporter.open(names, names, inv.invocation_id)
                if ctx is not None:
                    inv.members.update({name: _NodeRun(targets=[(ctx, name)])
                                        for name in names})
                    for sub in agent.sub_agents:
                        for below in _under(sub):
                            inv.member_of[below.name].add(sub.name)
            workflow = self._owners.get(agent.name)
            if workflow is not None:
                self._run(inv, workflow, agent.name, None)

    async def after_agent_callback(self, *, agent: BaseAgent, callback_context: Any) -> None:
        """An agent node or a ``ParallelAgent`` member finished: its receipts (and a node's
        fan-out)."""
        with self._lock:
            inv = self._invocation(callback_context.get_invocation_context())
            member = inv.members.pop(agent.name, None)
            if _being_cancelled():  # ADK calls this as a cancelled agent unwinds: not finished
                return
            if member is not None:
                self._complete(member)
            workflow = self._owners.get(agent.name)
            run = inv.runs.get((workflow, agent.name)) if workflow is not None else None
            if run is not None and workflow is not None:
                self._finish(inv, workflow, agent.name, run)

    async def on_agent_error_callback(self, *, agent: BaseAgent, callback_context: Any,
                                      error: Exception) -> None:
        """A ``ParallelAgent`` member failed (workflow nodes report through error events)."""
        with self._lock:
            inv = self._invocation(callback_context.get_invocation_context())
            member = inv.members.pop(agent.name, None)
            if member is not None:
                for ctx, branch in member.targets:
                    self._reporter.error(ctx, branch, describe_exception(error), attempt=1,
                                         during_failure=True)

    async def on_event_callback(self, *, invocation_context: Any, event: Any) -> None:
        """Outputs, routes, state writes and failed attempts of workflow nodes, and what
        ``ParallelAgent`` members write."""
        info = event.node_info
        path = info.path if info is not None else None
        with self._lock:
            inv = self._invocation(invocation_context)
            for name in inv.member_of.get(event.author) or (event.author,):
                member = inv.members.get(name)
                if member is not None:
                    member.take(event)
            own = self._locate(path)
            if own is not None:
                self._record(inv, own, event)
            if event.output is not None and info is not None:
                # a nested workflow's output is its terminal node's: it is named in output_for
                for claimer in info.output_for or ():
                    found = self._locate(claimer) if claimer != path else None
                    if found is not None:
                        self._output(inv, found, event.output)

    # -- bookkeeping ------------------------------------------------------------------------

    def _locate(self, path: str | None) -> _Located | None:
        """The workflow, node name and graph node of an event's node path."""
        if not path or "/" not in path:
            return None
        parts = path.split("/")
        workflow, node = parts[-2].split("@")[0], parts[-1].split("@")[0]
        found = self._workflows.get(workflow)
        graph = found.graph if found is not None else None
        graph_node = next((n for n in graph.nodes if n.name == node), None) if graph else None
        return None if graph_node is None else _Located(path, workflow, node, graph_node)

    def _record(self, inv: _Invocation, at: _Located, event: Any) -> None:
        run = self._run(inv, at.workflow, at.node, at.path)
        if event.error_code and event.output is None:
            run.errors += 1
            run.output, run.route, run.state = None, None, {}
            text = describe(str(event.error_code), event.error_message or "")
            for ctx, branch in run.targets:
                self._reporter.error(ctx, branch, text, attempt=run.errors, during_failure=True)
            return
        run.take(event)
        if event.output is not None:
            self._output(inv, at, event.output)

    def _output(self, inv: _Invocation, at: _Located, output: Any) -> None:
        run = self._run(inv, at.workflow, at.node, at.path)
        run.output = output
        if not isinstance(at.graph_node, BaseAgent):
            self._finish(inv, at.workflow, at.node, run)

    def _invocation(self, invocation_context: Any) -> _Invocation:
        invocation_id = invocation_context.invocation_id
        inv = self._invocations.get(invocation_id)
        if inv is None:
            inv = self._invocations[invocation_id] = _Invocation(invocation_id)
        return inv

    def _run(self, inv: _Invocation, workflow: str, node: str, path: str | None) -> _NodeRun:
        """The current run of ``node``; a new one (claiming its joins) when it starts anew."""
        key = (workflow, node)
        run = inv.runs.get(key)
        if run is not None and not run.done and (path is None or run.path in (None, path)):
            run.path = run.path or path
            return run
        if workflow not in inv.started:
            inv.started.add(workflow)
            self._fan_out(inv, workflow, START.name, None)
        queue = inv.waiting.get(key)
        run = _NodeRun(targets=[queue.popleft()] if queue else [], path=path)
        inv.runs[key] = run
        return run

    def _complete(self, run: _NodeRun) -> None:
        run.done = True
        key, value = run.receipt()
        for ctx, branch in run.targets:
            self._reporter.ok(ctx, branch, value, key=key, attempt=run.errors + 1)

    def _finish(self, inv: _Invocation, workflow: str, node: str, run: _NodeRun) -> None:
        if not run.done:
            self._complete(run)
            self._fan_out(inv, workflow, node, run.route)

    def _fan_out(self, inv: _Invocation, workflow: str, node: str, route: Any) -> None:
        graph = self._workflows[workflow].graph
        if graph is None:
            raise ValueError(f"workflow {workflow!r} has no graph (only graphs are indexed)")
        possible = {e.to_node.name for e in graph.edges if e.from_node.name == node}
        taken = set(graph.get_next_pending_nodes(node_name=node, routes_to_match=route))
        ctx = self._reporter.open(possible, taken, inv.invocation_id)
        if ctx is not None:
            for successor in sorted(taken):
                inv.waiting[(workflow, successor)].append((ctx, successor))


def attach(target: Any, emitter: Emitter, *, contract: str | None = None,
           deadline_s: float | None = None, allow_partial: bool | None = None,
           fail_fast: bool | None = None) -> FaninPlugin:
    """Register a ``FaninPlugin`` on an ADK ``App`` (before its ``Runner`` is created) or a
    ``Runner``; the join fields go into every open (``None``: the contract's or the
    pipeline's). Returns the plugin."""
    manager = getattr(target, "plugin_manager", None)
    if manager is None and not isinstance(getattr(target, "plugins", None), list):
        raise TypeError(f"attach to an ADK App or Runner, not {type(target).__name__}")
    root = target.agent if manager is not None else target.root_agent
    plugin = FaninPlugin(emitter, root, contract=contract, deadline_s=deadline_s,
                         allow_partial=allow_partial, fail_fast=fail_fast)
    if manager is not None:
        manager.register_plugin(plugin)
    else:
        target.plugins.append(plugin)
    return plugin
