"""Deterministic fleet traffic: opens and receipts of many concurrent joins, in arrival order.

Guarantees:
- ``simulate(joins, seed, rates)`` yields newline-free JSON lines; file order is arrival order.
  The same arguments give byte-identical output (one ``random.Random(seed)``; no global random
  state, no wall clock), given the same bundled contracts file and Python minor version.
- It streams: memory holds the lines not yet due (the joins in flight and the delayed
  stragglers) plus one id per join opened so far.
- Join ``i`` opens at ``start + i * stagger_ms`` (default ``EPOCH`` and ``STAGGER_MS``;
  seed-independent), so joins overlap in event time. Another ``start`` shifts every time of the
  run by the same amount (same seed, same lines otherwise). Times are RFC 3339 UTC with
  milliseconds; a run that could reach past year 9999 raises ``PastYear9999`` (a
  ``ValueError``) before its first line, never a time clamped to the end of year 9999.
- ``timed_lines`` yields each line with its arrival time (epoch ms: when the fleet delivers it;
  never before its own event time); ``write_paced`` writes them in real time, each when the
  clock reaches its arrival time, from ``start`` = now: a live stream whose event times follow
  the clock (``fanin simulate --rate N/s``).
- Every line is either a valid message of docs/spec.md §1 against the bundled contracts file
  (``CONTRACTS_PATH``), or is intentionally malformed, and then ``parse_message`` dead-letters
  it with the error code ``DEAD_LETTER_ERRORS[category]``.
- ``simulate_lines`` yields the same lines with one category each (``CATEGORIES``, a partition:
  the categories of all lines add up to the number of lines) and measured flags
  (``FLAGS``: a receipt that arrives before its join's open, with an event time after the
  join's deadline, or more than ``FAR_BEHIND_MS`` behind the greatest event time seen so far).
- Valid messages are built with ``fanin.sdk.messages``, so the simulator and the SDK agree.

Behaviours and the rate (``SimRates`` field) that drives each:
- opens name a contract, or (``explicit_open``) carry ``required``/``optional``/``deadline_s``
  of ``part/NN`` branches: width 2..12, or 13..48 with ``wide``;
- conditional routes (``skip``): a ``skipped`` receipt for a branch or path prefix; the pruned
  branches never report;
- retries (``retry``): attempt 1 (and sometimes 2) fails with ``error``/``timeout``, the next
  attempt reports; final ``error`` / ``timeout`` statuses (``error``, ``timeout``); required
  branches that never report (``missing``); optional branches report with ``optional_report``;
- redeliveries (``redelivery``: the exact line again, later), changed duplicates
  (``changed_duplicate``: same attempt, another value), key conflicts (``key_conflict``: a
  second branch writes another branch's key with a different value), schema violations
  (``schema_violation``: a keyed value outside its contract schema), stray branches (``stray``);
- receipts before their open (``open_delayed``: the open is delivered late), event times after
  the deadline (``slow``), heavy-tailed delivery delays (``delayed``: Pareto, 10 s to 1 h);
- malformed lines, one rate each: ``invalid_json`` (truncated line, ``NaN``, repeated field,
  plain text), ``bad_type`` (a field of the wrong JSON type or value), ``missing_field``,
  ``not_object``, ``unknown_contract``.
"""

from __future__ import annotations

import heapq
import json
import random
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple, TextIO

from fanin.contracts.catalog import Contract, JoinDefaults, parse_contracts
from fanin.contracts.timefmt import MAX_MS, duration_ms, format_ms, parse_rfc3339
from fanin.sdk.context import JoinContext
from fanin.sdk.messages import Status, encode_message, open_message, receipt_message

__all__ = [
    "CATEGORIES",
    "CONTRACTS_PATH",
    "DEAD_LETTER_ERRORS",
    "EPOCH",
    "FAR_BEHIND_MS",
    "FLAGS",
    "MALFORMED",
    "SHOWCASE_RATES",
    "STAGGER_MS",
    "PastYear9999",
    "SimLine",
    "SimRates",
    "SimSummary",
    "bundled_contracts",
    "check_probability",
    "simulate",
    "simulate_lines",
    "timed_lines",
    "write_lines",
    "write_paced",
    "write_simulation",
]

EPOCH = "2026-01-01T00:00:00.000Z"
STAGGER_MS = 100
FAR_BEHIND_MS = 60_000
CONTRACTS_PATH = str(resources.files("fanin") / "examples" / "contracts.yaml")

MALFORMED = ("invalid_json", "bad_type", "missing_field", "not_object", "unknown_contract")
CATEGORIES = ("open", "receipt", "retry", "skipped", "redelivery", "changed_duplicate",
              "key_conflict", "schema_violation", "stray", *MALFORMED)
FLAGS = ("before_open", "after_deadline", "far_behind")
DEAD_LETTER_ERRORS: Mapping[str, str] = {
    "invalid_json": "invalid_json",
    "bad_type": "invalid_message",
    "missing_field": "invalid_message",
    "not_object": "not_object",
    "unknown_contract": "unknown_contract",
}

_STRAYS = ("extra", "debug/trace", "legacy/ranker")
_EXPLICIT_DEADLINES_S = (10, 20, 30, 45)  # deadline_s of the opens that name no contract
_UNKNOWN_CONTRACTS = ("triage-v0", "summarise", "Triage")
_NOT_OBJECTS = ('[1,2,3]', '"receipt"', "42", "null", "true", '[{"join_id":"x"}]')
_BAD_RECEIPT_FIELDS: tuple[tuple[str, Any], ...] = (
    ("attempt", "2"), ("attempt", 0), ("attempt", 1.5), ("status", "done"), ("join_id", 12345),
    ("join_id", ""), ("event_time", "yesterday"), ("event_time", "2026-01-01 00:00:00"),
    ("key", 7), ("error", False), ("branch", ["a"]), ("kind", "close"),
)
_BAD_OPEN_FIELDS: tuple[tuple[str, Any], ...] = (
    ("allow_partial", "false"), ("deadline_s", -5), ("deadline_s", "30"),
    ("required", "retrieve"), ("required", [""]), ("opened_at", 1767225600000),
)
_REQUIRED_RECEIPT_FIELDS = ("join_id", "branch", "status", "event_time")
_OPEN, _RECEIPT, _BAD = 0, 1, 2
_NO_FLAGS: tuple[str, ...] = ()


def check_probability(name: str, value: float) -> float:
    """``value`` if it is a real number in [0, 1], else ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"rate {name} must be a probability in [0, 1], not {value!r}")
    return float(value)


def _rate(default: float, help_text: str) -> Any:
    return field(default=default, metadata={"help": help_text})


@dataclass(frozen=True)
class SimRates:
    """Probabilities of each behaviour (per join, per branch or per message as stated)."""

    explicit_open: float = _rate(0.3, "per join: the open lists its branches, no contract")
    wide: float = _rate(0.05, "per explicit open: fan-out width 13..48 instead of 2..12")
    optional_report: float = _rate(0.7, "per optional branch: it reports at all")
    missing: float = _rate(0.01, "per required branch: it never reports")
    skip: float = _rate(0.15, "per join: one route (branch or prefix) is skipped")
    retry: float = _rate(0.06, "per branch: first attempt(s) fail, then a retry reports")
    error: float = _rate(0.02, "per branch: its final status is error")
    timeout: float = _rate(0.02, "per branch: its final status is timeout")
    slow: float = _rate(0.03, "per branch: its event time falls after the deadline")
    delayed: float = _rate(0.02, "per message: heavy-tailed delivery delay (10 s to 1 h)")
    open_delayed: float = _rate(0.08, "per join: the open arrives after some receipts")
    redelivery: float = _rate(0.04, "per message: the exact line is delivered again")
    changed_duplicate: float = _rate(0.01, "per ok receipt: same attempt again, other value")
    key_conflict: float = _rate(0.03, "per join: two branches write one key, values differ")
    schema_violation: float = _rate(0.03, "per keyed ok receipt: value breaks its schema")
    stray: float = _rate(0.02, "per join: a receipt for an undeclared branch")
    invalid_json: float = _rate(0.004, "per join: a line that is not JSON")
    bad_type: float = _rate(0.004, "per join: a message with a field of the wrong type")
    missing_field: float = _rate(0.004, "per join: a message lacking a required field")
    not_object: float = _rate(0.004, "per join: a JSON line that is not an object")
    unknown_contract: float = _rate(0.004, "per join: a message naming an unknown contract")

    def __post_init__(self) -> None:
        for spec in fields(self):
            check_probability(spec.name, getattr(self, spec.name))


SHOWCASE_RATES = SimRates(
    explicit_open=0.3, wide=0.1, skip=0.35, retry=0.15, error=0.04, timeout=0.04, slow=0.08,
    delayed=0.15, open_delayed=0.2, redelivery=0.08, changed_duplicate=0.05, key_conflict=0.2,
    schema_violation=0.2, stray=0.1, invalid_json=0.08, bad_type=0.08, missing_field=0.08,
    not_object=0.08, unknown_contract=0.08,
)
"""Raised rates so that a few dozen joins show every behaviour (``fanin/examples/triage.jsonl``
is ``write_simulation(path, 40, 7, SHOWCASE_RATES)``)."""


class SimLine(NamedTuple):
    """One generated line with its category (one of ``CATEGORIES``) and flags (``FLAGS``)."""

    line: str
    category: str
    flags: tuple[str, ...]


@dataclass(frozen=True)
class SimSummary:
    """Counts of one simulation; ``sum(categories.values()) == lines``."""

    joins: int
    seed: int
    lines: int
    categories: dict[str, int]
    flags: dict[str, int]

    def one_line(self) -> str:
        """A one-line human summary."""
        cats = ", ".join(f"{k}={v}" for k, v in self.categories.items() if v)
        flags = ", ".join(f"{k}={v}" for k, v in self.flags.items())
        return (f"{self.lines} lines for {self.joins} joins (seed {self.seed}): {cats}; "
                f"flags: {flags}")


@lru_cache(maxsize=1)
def bundled_contracts() -> dict[str, Contract]:
    """The contracts of ``CONTRACTS_PATH`` (the simulator's and the examples' contracts)."""
    return parse_contracts(Path(CONTRACTS_PATH).read_text(encoding="utf-8"), CONTRACTS_PATH)


@lru_cache(maxsize=256)
def _routes(required: tuple[str, ...], declared: tuple[str, ...]) -> tuple[str, ...]:
    """Skippable routes: nested branches and their prefixes that leave a required branch."""
    nested = [b for b in declared if "/" in b]
    if not nested:
        return declared
    found = set(nested)
    for name in nested:
        parts = name.split("/")
        found.update("/".join(parts[:n]) for n in range(1, len(parts)))
    return tuple(sorted(r for r in found
                        if not all(b == r or b.startswith(r + "/") for b in required))) or declared


def _schema_value(schema: Any, rng: random.Random, violate: bool) -> Any:
    """A value for the schema shapes of the bundled file (number range, enum), or breaking it."""
    if not isinstance(schema, dict):
        return None
    if "enum" in schema:
        return "undecided" if violate else rng.choice(schema["enum"])
    if schema.get("type") == "number":
        low, high = schema.get("minimum", 0), schema.get("maximum", 1)
        return high + 1 + rng.random() if violate else round(rng.uniform(low, high), 3)
    return None


@dataclass
class _Join:
    ctx: JoinContext
    opened_ms: int
    span_ms: int
    required: list[str]
    optional: list[str]
    keyed: dict[str, tuple[str, Any]]
    open_fields: dict[str, Any]


class _Generator:
    """Plans each join and pushes its lines on an arrival-ordered heap."""

    def __init__(self, seed: int, rates: SimRates, start_ms: int, stagger_ms: float) -> None:
        self.seed = seed
        self.rates = rates
        self.start_ms = start_ms
        self.stagger_ms = stagger_ms
        self.rng = random.Random(seed)
        self.contracts = bundled_contracts()
        self.names = sorted(self.contracts)
        self.heap: list[tuple[int, int, str, str, str, int, int, int]] = []
        self.seq = 0
        self.messages = 0

    # -- primitives -------------------------------------------------------------------------

    def opened_ms(self, index: int) -> int:
        return self.start_ms + int(index * self.stagger_ms)

    def latest_event_ms(self, joins: int) -> int:
        """No event time of ``joins`` joins is later: a receipt reports at most 2.5 spans
        after its open (``_latency``), a retry up to twice 2 s and 1.25 spans later, a changed
        duplicate 0.5 s after that (``_branch``): under 5 spans and 5 s."""
        span = max([duration_ms(s.deadline_s or JoinDefaults().deadline_s)
                    for s in self.contracts.values()]
                   + [duration_ms(max(_EXPLICIT_DEADLINES_S))])
        return self.opened_ms(joins - 1) + 5 * span + 5_000

    def _message_id(self) -> str:
        self.messages += 1
        return f"m{self.seed}-{self.messages:08d}"

    def _delay(self) -> int:
        if self.rng.random() < self.rates.delayed:
            return int(min(10_000 * self.rng.paretovariate(1.2), 3_600_000))
        return int(self.rng.expovariate(1 / 80))

    def _push(self, arrival: int, category: str, line: str, join: _Join, kind: int,
              event_ms: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (arrival, self.seq, category, line, join.ctx.join_id, kind,
                                   event_ms, join.opened_ms + join.span_ms))

    def _send(self, join: _Join, msg: dict[str, Any], category: str, event_ms: int,
              arrival: int | None = None) -> None:
        """Push a valid message (and maybe its redelivery)."""
        line = encode_message(msg)
        kind = _OPEN if msg["kind"] == "open" else _RECEIPT
        first = event_ms + self._delay() if arrival is None else arrival
        self._push(first, category, line, join, kind, event_ms)
        if self.rng.random() < self.rates.redelivery:
            later = first + int(self.rng.expovariate(1 / 3000)) + 1
            self._push(later, "redelivery", line, join, kind, event_ms)

    def _receipt(self, join: _Join, branch: str, status: Status, event_ms: int, *,
                 attempt: int = 1, key: str | None = None, value: Any = None,
                 error: str | None = None) -> dict[str, Any]:
        return receipt_message(join.ctx, branch, status, format_ms(event_ms),
                               self._message_id(), attempt=attempt, key=key, value=value,
                               error=error)

    def _latency(self, join: _Join) -> int:
        rng = self.rng
        if rng.random() < self.rates.slow:
            return int(join.span_ms * rng.uniform(1.05, 2.5))
        return int(join.span_ms * min(0.9, 0.12 * rng.lognormvariate(0, 0.6)))

    # -- one join ---------------------------------------------------------------------------

    def _plan(self, index: int) -> _Join:
        rng, rates = self.rng, self.rates
        opened_ms = self.opened_ms(index)
        open_fields: dict[str, Any] = {}
        keyed: dict[str, tuple[str, Any]] = {}
        if rng.random() >= rates.explicit_open:
            name: str = rng.choice(self.names)
            contract: str | None = name
            spec = self.contracts[name]
            required, optional = list(spec.required or ()), list(spec.optional or ())
            deadline_s = spec.deadline_s or JoinDefaults().deadline_s
            keyed = dict(zip(reversed(required), spec.schemas.items(), strict=False))
        else:
            contract = None
            width = rng.randint(13, 48) if rng.random() < rates.wide else rng.randint(2, 12)
            required = [f"part/{k:02d}" for k in range(width)]
            deadline_s = float(rng.choice(_EXPLICIT_DEADLINES_S))
            open_fields = {"required": required, "deadline_s": deadline_s}
            optional = ["part/extra"] if rng.random() < 0.5 else []
            if optional:
                open_fields["optional"] = optional
            if rng.random() < 0.3:
                open_fields["allow_partial"] = True
        ctx = JoinContext(join_id=f"sim{self.seed}-{index:06d}", opened_at=format_ms(opened_ms),
                          contract=contract, run_id=f"run-{self.seed}-{index // 1000:03d}")
        return _Join(ctx, opened_ms, duration_ms(deadline_s), required, optional, keyed,
                     open_fields)

    def join(self, index: int) -> None:
        rng, rates = self.rng, self.rates
        join = self._plan(index)
        open_arrival = join.opened_ms + int(rng.expovariate(1 / 20))
        if rng.random() < rates.open_delayed:
            open_arrival = join.opened_ms + int(join.span_ms * rng.uniform(0.1, 0.8))
        self._send(join, open_message(join.ctx, self._message_id(), **join.open_fields),
                   "open", join.opened_ms, open_arrival)

        pruned: set[str] = set()
        declared = tuple(join.required + join.optional)
        if rng.random() < rates.skip:
            route = rng.choice(_routes(tuple(join.required), declared))
            pruned = {b for b in declared if b == route or b.startswith(route + "/")}
            event = join.opened_ms + rng.randint(5, 200)
            self._send(join, self._receipt(join, route, "skipped", event), "skipped", event)
        reporting = [b for b in join.required if b not in pruned and rng.random() >= rates.missing]
        reporting += [b for b in join.optional
                      if b not in pruned and rng.random() < rates.optional_report]
        plain = [b for b in reporting if b not in join.keyed]
        steals: dict[str, str] = {}
        if len(plain) >= 2 and rng.random() < rates.key_conflict:
            owner, thief = rng.sample(plain, 2)
            steals[thief] = owner
        for branch in reporting:
            self._branch(join, branch, steals.get(branch))
        if rng.random() < rates.stray:
            event = join.opened_ms + self._latency(join)
            msg = self._receipt(join, rng.choice(_STRAYS), "ok", event, value={"n": 1})
            self._send(join, msg, "stray", event)
        for category in MALFORMED:
            if rng.random() < getattr(rates, category):
                arrival = join.opened_ms + rng.randint(0, join.span_ms)
                self._push(arrival, category, self._malformed(join, category, arrival), join,
                           _BAD, 0)

    def _branch(self, join: _Join, branch: str, stolen_key: str | None) -> None:
        """All receipts of one reporting branch: failed attempts, the final one, a change."""
        rng, rates = self.rng, self.rates
        event = join.opened_ms + self._latency(join)
        attempt = 1
        if rng.random() < rates.retry:
            for _ in range(1 if rng.random() < 0.7 else 2):
                status: Status = "timeout" if rng.random() < 0.3 else "error"
                error: str | None = ("upstream returned 503" if status == "error"
                                     else "no answer in 5s")
                self._send(join, self._receipt(join, branch, status, event, attempt=attempt,
                                               error=error),
                           "receipt" if attempt == 1 else "retry", event)
                attempt += 1
                event += rng.randint(200, 2000) + self._latency(join) // 2
        roll = rng.random()
        status = "error" if roll < rates.error else \
            "timeout" if roll < rates.error + rates.timeout else "ok"
        category = "receipt" if attempt == 1 else "retry"
        key: str | None = stolen_key
        value: Any = {"branch": branch, "n": rng.randrange(1_000_000)}
        if branch in join.keyed and status == "ok":
            key, schema = join.keyed[branch]
            violate = rng.random() < rates.schema_violation
            value = _schema_value(schema, rng, violate)
            if violate:
                category = "schema_violation"
        elif stolen_key is not None and status == "ok":
            category = "key_conflict"
        error = None if status == "ok" else f"{branch} failed: {status}"
        self._send(join, self._receipt(join, branch, status, event, attempt=attempt, key=key,
                                       value=value, error=error), category, event)
        if status == "ok" and rng.random() < rates.changed_duplicate:
            changed = {"branch": branch, "n": rng.randrange(1_000_000), "changed": True}
            later = event + rng.randint(1, 500)
            self._send(join, self._receipt(join, branch, "ok", later, attempt=attempt, key=key,
                                           value=changed), "changed_duplicate", later)

    def _malformed(self, join: _Join, category: str, arrival: int) -> str:
        """A malformed line of ``category``; the event time it names is no later than its
        ``arrival`` (a line written at its arrival under ``--rate`` names no future time)."""
        rng = self.rng
        branch = rng.choice(join.required)
        event = min(join.opened_ms + rng.randint(0, join.span_ms), arrival)
        msg = self._receipt(join, branch, "ok", event, value={"n": 0})
        if category == "invalid_json":
            line = encode_message(msg)
            return rng.choice((
                line[: len(line) // 2],
                line[:-1] + ',"score":NaN}',
                '{"join_id":' + json.dumps(join.ctx.join_id) + "," + line[1:],
                f"join_id={join.ctx.join_id} branch={branch} status=ok",
            ))
        if category == "not_object":
            return rng.choice(_NOT_OBJECTS)
        if rng.random() < 0.3:
            msg = open_message(join.ctx, self._message_id(), **join.open_fields)
        is_open = msg["kind"] == "open"
        if category == "bad_type":
            name, bad = rng.choice(_BAD_OPEN_FIELDS if is_open else _BAD_RECEIPT_FIELDS)
            msg[name] = bad
        elif category == "missing_field":
            del msg[rng.choice(("opened_at", "join_id") if is_open else _REQUIRED_RECEIPT_FIELDS)]
        else:
            msg["contract"] = rng.choice(_UNKNOWN_CONTRACTS)
        return encode_message(msg)


class PastYear9999(ValueError):
    """The simulation could reach an instant after 9999-12-31T23:59:59.999Z (a late
    ``start``); raised before its first line."""


def _start_ms(start: str | int) -> int:
    if isinstance(start, str):
        return parse_rfc3339(start)
    if isinstance(start, bool) or not isinstance(start, int):
        raise ValueError(f"start must be RFC 3339 text or epoch milliseconds, not {start!r}")
    return start


def _generator(joins: int, seed: int, rates: SimRates | None, start_ms: int,
               stagger_ms: float) -> _Generator:
    """The generator of ``timed_lines``, its arguments checked before any line is made."""
    if isinstance(joins, bool) or not isinstance(joins, int) or joins < 0:
        raise ValueError(f"joins must be an integer >= 0, not {joins!r}")
    if not stagger_ms > 0:
        raise ValueError(f"stagger_ms must be > 0, not {stagger_ms!r}")
    gen = _Generator(seed, rates or SimRates(), start_ms, stagger_ms)
    if joins and gen.latest_event_ms(joins) > MAX_MS:
        raise PastYear9999("the simulation could run past 9999-12-31T23:59:59.999Z, the last "
                           "instant RFC 3339 can write: give an earlier start")
    return gen


def timed_lines(joins: int, seed: int = 0, rates: SimRates | None = None, *,
                start: str | int = EPOCH, stagger_ms: float = STAGGER_MS
                ) -> Iterator[tuple[int, SimLine]]:
    """``(arrival_ms, line)`` in arrival order: join ``i`` opens at ``start + i * stagger_ms``
    (``start``: RFC 3339 or epoch milliseconds)."""
    start_ms = _start_ms(start)
    gen = _generator(joins, seed, rates, start_ms, stagger_ms)
    heap = gen.heap
    opened: set[str] = set()
    max_event = start_ms

    def drain(before: int | None) -> Iterator[tuple[int, SimLine]]:
        nonlocal max_event
        while heap and (before is None or heap[0][0] < before):
            arrival, _, category, line, join_id, kind, event_ms, deadline_ms = \
                heapq.heappop(heap)
            flags = _NO_FLAGS
            if kind == _OPEN:
                opened.add(join_id)
            elif kind == _RECEIPT:
                found = []
                if join_id not in opened:
                    found.append("before_open")
                if event_ms > deadline_ms:
                    found.append("after_deadline")
                if event_ms < max_event - FAR_BEHIND_MS:
                    found.append("far_behind")
                flags = tuple(found) if found else _NO_FLAGS
            if kind != _BAD and event_ms > max_event:
                max_event = event_ms
            yield arrival, SimLine(line, category, flags)

    for index in range(joins):
        # every line of join ``index`` and later arrives at or after its opened_at
        yield from drain(gen.opened_ms(index))
        gen.join(index)
    yield from drain(None)


def simulate_lines(joins: int, seed: int = 0, rates: SimRates | None = None, *,
                   start: str | int = EPOCH, stagger_ms: float = STAGGER_MS
                   ) -> Iterator[SimLine]:
    """The lines of ``simulate`` with their category and flags, in arrival order."""
    return (item for _, item in timed_lines(joins, seed, rates, start=start,
                                            stagger_ms=stagger_ms))


def simulate(joins: int, seed: int = 0, rates: SimRates | None = None, *,
             start: str | int = EPOCH, stagger_ms: float = STAGGER_MS) -> Iterator[str]:
    """Newline-free JSON lines of ``joins`` concurrent joins, in arrival order."""
    return (item.line for item in simulate_lines(joins, seed, rates, start=start,
                                                 stagger_ms=stagger_ms))


class _Counter:
    """Counts of the lines written, for ``SimSummary``."""

    def __init__(self) -> None:
        self.lines = 0
        self.categories = dict.fromkeys(CATEGORIES, 0)
        self.flags = dict.fromkeys(FLAGS, 0)

    def add(self, item: SimLine) -> None:
        self.lines += 1
        self.categories[item.category] += 1
        for flag in item.flags:
            self.flags[flag] += 1

    def summary(self, joins: int, seed: int) -> SimSummary:
        return SimSummary(joins=joins, seed=seed, lines=self.lines, categories=self.categories,
                          flags=self.flags)


def write_paced(out: TextIO, joins: int, seed: int = 0, rates: SimRates | None = None, *,
                joins_per_s: float, clock: Callable[[], float] = time.time,
                sleep: Callable[[float], None] = time.sleep) -> SimSummary:
    """Write the simulation to ``out`` in real time: it starts now (per ``clock``), opens
    ``joins_per_s`` joins per second, and writes (and flushes) each line once the clock reaches
    its arrival time, so no line is written before its event time."""
    if not 0 < joins_per_s < float("inf"):
        raise ValueError(f"joins_per_s must be > 0, not {joins_per_s!r}")
    counter = _Counter()
    start_ms = int(clock() * 1000)
    for arrival_ms, item in timed_lines(joins, seed, rates, start=start_ms,
                                        stagger_ms=1000 / joins_per_s):
        while (ahead := arrival_ms / 1000 - clock()) > 0:
            sleep(ahead)
        out.write(item.line + "\n")
        out.flush()
        counter.add(item)
    return counter.summary(joins, seed)


def write_lines(out: TextIO, joins: int, seed: int = 0, rates: SimRates | None = None, *,
                start: str | int = EPOCH) -> SimSummary:
    """Write ``simulate(joins, seed, rates, start=start)`` to ``out`` (one line each), count it."""
    counter = _Counter()
    for item in simulate_lines(joins, seed, rates, start=start):
        out.write(item.line)
        out.write("\n")
        counter.add(item)
    return counter.summary(joins, seed)


def write_simulation(path: str | Path, joins: int, seed: int = 0,
                     rates: SimRates | None = None, *, start: str | int = EPOCH) -> SimSummary:
    """``write_lines`` into the file ``path`` (created or replaced)."""
    with Path(path).open("w", encoding="utf-8", newline="\n") as out:
        return write_lines(out, joins, seed, rates, start=start)
