"""LangGraph: Fanin receipts from a compiled graph's own callbacks, without touching its nodes.

``attach(graph, emitter)`` returns the graph with a ``FaninCallbackHandler`` bound (LangChain's
callback system, which LangGraph drives for every task and conditional edge); run it as usual
(``invoke``, ``stream``, ``ainvoke``, ``astream``). The handler can also be passed per run:
``graph.invoke(x, {"callbacks": [FaninCallbackHandler(graph, emitter)]})``.

Mapping (``docs/integrations.md``):
- **Fan-out -> open.** When the task of a node ``X`` ends, its possible successors are its
  static edges (``add_edge(X, T)``), the ``path_map`` targets of its conditional edges, the
  nodes it ``Send``s to and its ``Command(goto=...)`` targets (plus ``destinations=`` declared
  with ``add_node``). Two or more (``END`` not counted) make a fan-out: one join is opened with
  all of them required; ``Send`` packets are branches ``node/0``, ``node/1``, ... in the order
  ``X`` sent them. A branch is named by its node with ``%`` and ``/`` escaped (``_branch``).
  A fan-out from ``START`` opens when ``START``'s task ends, as for any node (a run whose
  callbacks show no ``START`` task: its static edges when the first task starts; none for a
  run that resumes a thread, whose input is ``None`` or a ``Command(resume=...)``).
- **Route not taken -> skip.** Each mapped target that ``X``'s conditional edges (and goto) did
  not choose is skipped at once.
- **Branch run -> receipt.** Each task of the next super-step that ``X`` triggered reports one
  receipt per attempt: ``error`` (``"Type: message"``) per failed attempt (``RetryPolicy``
  retries are attempts 2, 3, ...), ``ok`` with its state update. The receipt's ``key`` is the
  state key when the update writes exactly one key whose channel keeps the last value (no
  reducer: the keys LangGraph refuses to see written twice in one step, ``InvalidUpdateError``);
  otherwise the key is the branch and the value the whole update (reducer channels such as
  ``Annotated[list, operator.add]`` are meant to take concurrent writes).
- A handoff to this graph from a subgraph that is a branch (``Command(graph=Command.PARENT)``
  inside it, which LangGraph raises as ``ParentCommand`` through the task) is how the branch
  finished: ``ok`` with the command's update. Other interrupts (``GraphBubbleUp``, also a
  node of this graph handing off above it) are not results: no receipt.

Guarantees: the handler is thread-safe (sync graphs run tasks in threads) and runs inline in
async graphs, so messages are emitted in the order LangGraph reports the events. It raises its
errors (``raise_error``): a sink failure fails the graph run rather than losing receipts, but
never in place of a node's own exception (``FanOutReporter.error``). It compares no user
value (a ``Send`` argument is matched to its task by identity first; an ``==`` that raises is
not equal).
State for a run is dropped when the run ends. Limits: only the attached graph's own nodes are
seen (a subgraph is one branch of its parent); the routes not taken of conditional edges
without a ``path_map`` (or a ``Literal`` return type) are unknown, so those routes are not
reported; ``defer=True`` nodes are not branches; a node served from LangGraph's cache
(``CachePolicy``) runs no callbacks, so its branch is missing.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from fanin.integrations.fanout import (
    FanOutReporter,
    describe_exception,
    keyed,
    missing_extra,
)
from fanin.sdk import Emitter, JoinContext

try:
    from langchain_core.callbacks import BaseCallbackHandler
    from langgraph.channels.last_value import LastValue
    from langgraph.constants import END, START
    from langgraph.errors import GraphBubbleUp, ParentCommand
    from langgraph.types import Command, Send
except ImportError as missing:  # the extra is not installed: say which
    raise missing_extra("langgraph", missing) from missing

__all__ = ["FaninCallbackHandler", "attach"]

_PUSH = "__pregel_push"  # langgraph_path[0] of a task started by a Send
Target = tuple[JoinContext, str]  # a join the run reports to, and its branch name there


@dataclass
class _Task:
    """One attempt of a task: node, super-step, and the routes its conditional edges chose."""

    node: str
    step: int
    namespace: str
    graph_run: UUID
    routes: list[tuple[Any, Any]] = field(default_factory=list)  # (BranchSpec, result)


@dataclass
class _SendSlot:
    """A ``Send`` awaiting its task in the next super-step."""

    target: Target
    arg: Any


@dataclass
class _GraphRun:
    """What the handler knows of one run of the graph."""

    expected: dict[tuple[int, str], list[Target]] = field(
        default_factory=lambda: defaultdict(list))
    sends: dict[tuple[int, str], list[_SendSlot]] = field(
        default_factory=lambda: defaultdict(list))
    attempts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    targets: dict[str, list[Target]] = field(default_factory=dict)  # task namespace -> joins
    tasks: set[UUID] = field(default_factory=set)


def _as_list(result: Any) -> list[Any]:
    return list(result) if isinstance(result, (list, tuple)) else [result]


class FaninCallbackHandler(BaseCallbackHandler):
    """Turns the fan-outs and task results of runs of ``graph`` into Fanin messages."""

    raise_error = True
    run_inline = True

    def __init__(self, graph: Any, emitter: Emitter, *, contract: str | None = None,
                 deadline_s: float | None = None, allow_partial: bool | None = None,
                 fail_fast: bool | None = None) -> None:
        builder = getattr(graph, "builder", None)
        if builder is None or not hasattr(builder, "branches"):
            raise TypeError("attach a compiled StateGraph (builder.compile()), not "
                            f"{type(graph).__name__}")
        self._reporter = FanOutReporter(emitter, contract=contract, deadline_s=deadline_s,
                                        allow_partial=allow_partial, fail_fast=fail_fast)
        self._nodes = set(builder.nodes)
        self._static: dict[str, set[str]] = defaultdict(set)
        for source, target in builder.edges:
            if target != END:
                self._static[source].add(target)
        # node -> run name of a conditional edge's path function -> its BranchSpecs, in the
        # order LangGraph runs them (an anonymous path, a lambda: "RunnableCallable" in a sync
        # run, None in an async one)
        self._branches: dict[str, dict[str | None, list[Any]]] = defaultdict(dict)
        for node, specs in builder.branches.items():
            for spec in specs.values():
                for name in _run_names(spec.path):
                    self._branches[node].setdefault(name, []).append(spec)
        # add_node(destinations=...): a tuple of node names, or a dict node name -> label
        self._declared = {name: set(spec.ends or ()) for name, spec in builder.nodes.items()}
        self._plain = {name for name, channel in graph.channels.items()
                       if isinstance(channel, LastValue)}
        self._lock = threading.Lock()
        self._runs: dict[UUID, _GraphRun] = {}
        self._tasks: dict[UUID, _Task] = {}
        self._routers: dict[UUID, tuple[_Task, Any]] = {}
        # runs of the graph that resume a thread (input None, or a Command with ``resume``):
        # their first task is not a fan-out from START
        self._continued: set[UUID] = set()
        self._name = graph.get_name()

    # -- LangChain callbacks ----------------------------------------------------------------

    def on_chain_start(self, serialized: dict[str, Any] | None, inputs: Any, *, run_id: UUID,
                       parent_run_id: UUID | None = None, tags: list[str] | None = None,
                       metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """A task attempt starts (or a conditional edge's path function, inside a task)."""
        meta = metadata or {}
        name = kwargs.get("name")
        with self._lock:
            if name == self._name and "langgraph_node" not in meta and (
                    inputs is None or (isinstance(inputs, Command)
                                       and inputs.resume is not None)):
                self._continued.add(run_id)  # the graph's run (also inside a chain) resumes
                return
            parent = self._tasks.get(parent_run_id) if parent_run_id else None
            if parent is not None:
                routes = self._branches.get(parent.node, {})
                specs = routes.get(name, ())
                seen = sum(1 for spec, _ in parent.routes if spec in specs)
                if seen < len(specs):
                    self._routers[run_id] = (parent, specs[seen])
                return
            node = meta.get("langgraph_node")
            namespace = meta.get("langgraph_checkpoint_ns", "")
            if (parent_run_id is None or node is None or node != name
                    or (node not in self._nodes and node != START)
                    or "|" in namespace or f"graph:step:{meta.get('langgraph_step')}"
                    not in (tags or ())):
                return
            step = int(meta["langgraph_step"])
            run = self._runs.get(parent_run_id)
            if run is None:
                run = self._runs[parent_run_id] = _GraphRun()
                if node != START and parent_run_id not in self._continued:
                    # no START task seen (LangGraph 1.x shows none): its static edges alone
                    self._fan_out(run, parent_run_id, step, START, set(self._static[START]),
                                  [])
            task = _Task(node, step, namespace, parent_run_id)
            self._tasks[run_id] = task
            run.tasks.add(run_id)
            run.attempts[namespace] += 1
            if namespace not in run.targets:
                run.targets[namespace] = self._claim(run, task, meta, inputs)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """A task attempt succeeded: receipts, then the fan-out it makes."""
        with self._lock:
            router = self._routers.pop(run_id, None)
            if router is not None:
                task, spec = router
                task.routes.append((spec, outputs))
                return
            found = self._finish_task(run_id)
            if found is not None:
                self._succeeded(*found, outputs)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """A task attempt failed: an ``error`` receipt (interrupts excepted)."""
        with self._lock:
            self._routers.pop(run_id, None)
            found = self._finish_task(run_id)
            if found is None:
                return
            task, run = found
            command = error.args[0] if isinstance(error, ParentCommand) and error.args \
                else None
            if isinstance(command, Command) and command.graph == task.namespace:
                # a handoff to this graph (Command(graph=Command.PARENT) in the task's
                # subgraph): the task finished with the command's update and goto
                self._succeeded(task, run, command)
                return
            if isinstance(error, GraphBubbleUp):  # an interrupt: not a result
                return
            if not isinstance(error, Exception):  # cancelled: the attempt did not finish
                return
            text = describe_exception(error)
            for ctx, branch in run.targets.get(task.namespace, ()):
                self._reporter.error(ctx, branch, text, attempt=run.attempts[task.namespace],
                                     during_failure=True)

    def _succeeded(self, task: _Task, run: _GraphRun, outputs: Any) -> None:
        """A task attempt finished with ``outputs`` (an update, or a ``Command``): receipts,
        then the fan-out it makes. A ``Command`` of the node's own routes here; one its
        subgraph addresses to this graph (its ``graph`` is the task's namespace) too."""
        update, goto = outputs, []
        if isinstance(outputs, Command):
            update = outputs.update
            if outputs.graph is None or outputs.graph == task.namespace:
                goto = _as_list(outputs.goto)
        key, value = keyed(update, self._plain.__contains__)
        attempt = run.attempts[task.namespace]
        for ctx, branch in run.targets.get(task.namespace, ()):
            self._reporter.ok(ctx, branch, value, key=key, attempt=attempt)
        self._after(run, task, goto)

    def _finish_task(self, run_id: UUID) -> tuple[Any, Any] | None:
        """A task attempt ended: its task and graph run, no longer tracked as in flight; None
        (and the graph run forgotten) when ``run_id`` is not a task."""
        task = self._tasks.pop(run_id, None)
        if task is None:
            self._forget(run_id)
            return None
        run = self._runs[task.graph_run]
        run.tasks.discard(run_id)
        return task, run

    def _forget(self, run_id: UUID) -> None:
        """Drop what is kept for a graph run once it ends (any other run: nothing to do)."""
        self._continued.discard(run_id)
        run = self._runs.pop(run_id, None)
        if run is not None:
            for task in run.tasks:
                self._tasks.pop(task, None)

    # -- fan-outs ---------------------------------------------------------------------------

    def _claim(self, run: _GraphRun, task: _Task, meta: dict[str, Any],
               inputs: Any) -> list[Target]:
        """The joins a task reports to: those whose fan-out triggered it."""
        path = meta.get("langgraph_path") or ()
        if path and path[0] == _PUSH:
            slots = run.sends.get((task.step, task.node), [])
            # the packet itself (LangGraph passes the Send's arg; packets run in order, so
            # it is nearly always the first), else an equal one; an argument whose == raises
            # or answers no bool (a numpy array) is not equal
            for by_identity in (True, False):
                for i, slot in enumerate(slots):
                    if slot.arg is inputs if by_identity else _equal(slot.arg, inputs):
                        del slots[i]
                        return [slot.target]
            return []
        return run.expected.pop((task.step, task.node), [])

    def _after(self, run: _GraphRun, task: _Task, goto: Iterable[Any]) -> None:
        """Open the fan-out of a finished task ``X`` of step ``N`` (branches run in N + 1)."""
        possible = set(self._static[task.node]) | self._declared.get(task.node, set())
        chosen: list[Any] = list(goto)
        for spec, result in task.routes:
            ends: dict[Hashable, str] | None = spec.ends
            if ends:
                possible.update(ends.values())
            chosen.extend(r if isinstance(r, Send) or not ends else ends[r]
                          for r in _as_list(result))
        self._fan_out(run, task.graph_run, task.step + 1, task.node, possible, chosen)

    def _fan_out(self, run: _GraphRun, graph_run: UUID, step: int, source: str,
                 possible: set[str], chosen: list[Any]) -> None:
        taken = set(self._static[source])
        sends: list[tuple[str, Send]] = []
        per_node: dict[str, int] = defaultdict(int)
        for dest in chosen:
            if isinstance(dest, Send):
                sends.append((f"{_branch(dest.node)}/{per_node[dest.node]}", dest))
                per_node[dest.node] += 1
            else:
                taken.add(dest)
        taken -= {END}
        # a node the route only sends packets to is not a branch itself (its packets are);
        # one also reached by an edge is
        named = ((possible - set(per_node)) | taken) - {END}
        packets = {name for name, _ in sends}
        ctx = self._reporter.open({_branch(node) for node in named} | packets,
                                  {_branch(node) for node in taken} | packets, str(graph_run))
        if ctx is None:
            return
        for node in taken:
            run.expected[(step, node)].append((ctx, _branch(node)))
        for name, send in sends:
            run.sends[(step, send.node)].append(_SendSlot((ctx, name), send.arg))


def _branch(node: str) -> str:
    """The branch name of a node: its name with ``%`` and ``/`` escaped (``%25``, ``%2F``),
    since a branch name is a path (docs/spec.md §3): nodes ``search`` and ``search/web`` are
    two routes, and a skip of ``search`` must not prune ``search/web``. ``Send`` packets to a
    node are its sub-paths, ``node/0``, ``node/1``..."""
    return node.replace("%", "%25").replace("/", "%2F")


def _run_names(path: Any) -> set[str | None]:
    """The names LangChain's callbacks may give a conditional edge's path function: its own
    (a sync run names an anonymous one, a ``lambda``, by its class; an async run by its
    ``name``, ``None``), and a ``run_name`` bound to it (``with_config(run_name=...)``)."""
    names: set[str | None] = {path.get_name(), getattr(path, "name", None)}
    config = getattr(path, "config", None)
    if isinstance(config, Mapping) and isinstance(config.get("run_name"), str):
        names.add(config["run_name"])
    return names


def _equal(a: Any, b: Any) -> bool:
    """``a == b`` as a bool; False when that raises (a numpy array's ambiguous truth)."""
    try:
        return bool(a == b)
    except Exception:  # any __eq__ or __bool__ may fail
        return False


def attach(graph: Any, emitter: Emitter, *, contract: str | None = None,
           deadline_s: float | None = None, allow_partial: bool | None = None,
           fail_fast: bool | None = None) -> Any:
    """``graph`` (a compiled ``StateGraph``) with Fanin's callback handler bound to every run.

    The join fields given here (``contract``, ``deadline_s``, ``allow_partial``,
    ``fail_fast``) go into every open; ``None`` leaves them to the contract or the pipeline.
    """
    handler = FaninCallbackHandler(graph, emitter, contract=contract, deadline_s=deadline_s,
                                   allow_partial=allow_partial, fail_fast=fail_fast)
    return graph.with_config(callbacks=[handler])
