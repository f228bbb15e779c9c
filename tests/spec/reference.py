"""An executable reference of docs/spec.md §2-§4 (and the close object of §5).

Written to be read, not to be fast: every decision recomputes the join's definition and the
reducer from scratch over a plain list of messages. It shares no code with ``fanin``: it reads
messages by its own reading of §1's table (``read_message``: the standard ``json`` module and
``datetime``), the contracts file with ``yaml.safe_load`` (``read_contracts``: the plain files
the tests use) and its defaults from §2; it checks JSON Schemas with the ``jsonschema``
package directly.

The model, for one join, in event-time order (an open at its ``opened_at``; ties: opens first,
then the message text, which is also the order of a replay file sorted by event time):

- ``definition(msgs)``: §2 over the given messages (the open, else the contract, else the
  defaults; ``opened_at``; ``D``).
- ``reduce(defn, msgs)``: §3 over the given messages under ``defn``.
- ``decide(msgs)``: the watermark walk of §2 "Definition over time" and §4. The candidate
  times are the messages' event times and the ``opened_at`` values receipts carry (``S(t)``
  only changes there). At each candidate ``t``: if ``t`` is past ``D`` of the definition in
  force, the join was decided at that ``D``; else the definition is recomputed over the
  messages with event time ``<= t``; if its ``D`` is now before ``t`` the join closes at once
  (see ``_closing_lookback``); else it closes at ``t`` when ``t >= opened_at`` and ``S(t)`` is
  closable. The close holds exactly the messages with effective event time
  (``max(event_time, opened_at)``) ``<= closed_at``.
- ``join_outputs(msgs)``: undefined joins (dead letters, the rest a fresh join), the per-join
  limit, late lines and tombstones, as docs/spec.md reads them.

Rules cite docs/spec.md; readings taken where it leaves room are marked ``READING:``.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from fractions import Fraction
from typing import Any

import jsonschema
import yaml

__all__ = ["Contract", "Defaults", "Env", "Msg", "definition", "epoch_ms", "join_outputs",
           "parse_lines", "read_contracts", "read_message", "reduce", "reference_outputs",
           "rfc3339"]

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
# the latest instant an output can show: 9999-12-31T23:59:59.999Z
LAST_MS = (datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=timezone.utc) - EPOCH) // \
    timedelta(milliseconds=1)
FIRST_MS = (datetime(1, 1, 1, tzinfo=timezone.utc) - EPOCH) // timedelta(milliseconds=1)


def rfc3339(ms: int) -> str:
    """Epoch milliseconds as RFC 3339 UTC with milliseconds."""
    t = EPOCH + timedelta(milliseconds=ms)
    return (f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:"
            f"{t.second:02d}.{t.microsecond // 1000:03d}Z")


def milliseconds(seconds: float) -> int:
    """§2: a duration in whole milliseconds, truncated, of the number as written (1.001 s is
    1,001 ms)."""
    return int(Fraction(repr(seconds)) * 1000)


def json_key(value: Any) -> Any:
    """A hashable key equal for JSON-equal values (``1 == 1.0``, ``true != 1``, objects as
    sets of fields)."""
    if value is None or isinstance(value, (bool, str)):
        return (type(value).__name__, value)
    if isinstance(value, (int, float)):
        return ("number", value)  # Python compares and hashes 1 and 1.0 alike
    if isinstance(value, list):
        return ("array", tuple(json_key(item) for item in value))
    return ("object", frozenset((name, json_key(item)) for name, item in value.items()))


def canonical(value: Any) -> str:
    """Canonical JSON text: sorted fields, integral numbers without a fraction."""
    def norm(v: Any) -> Any:
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if isinstance(v, list):
            return [norm(item) for item in v]
        if isinstance(v, dict):
            return {name: norm(item) for name, item in v.items()}
        return v
    return json.dumps(norm(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True, eq=False)
class Msg:
    """One valid input message (compared by identity: each input line is one message)."""

    line: int
    raw: str
    obj: dict[str, Any] = field(compare=False)
    kind: str
    join_id: str
    time: int  # event time: an open's opened_at, a receipt's event_time
    contract: str | None
    run_id: str | None
    message_id: str | None
    # opens
    required: frozenset[str] | None = None
    optional: frozenset[str] | None = None
    deadline_ms: int | None = None
    allow_partial: bool | None = None
    fail_fast: bool | None = None
    identity: Any = None  # equal exactly for duplicate opens
    canon: str = ""  # the open's canonical JSON (the conflict tie-break)
    # receipts
    branch: str = ""
    status: str = ""
    key: str = ""
    value: Any = None
    error: str | None = None
    attempt: int = 1
    opened_at: int | None = None  # a receipt's opened_at field

    @property
    def content(self) -> Any:
        return (self.status, self.key, json_key(self.value), self.error)


# ---------------------------------------------------------------------------- §1 messages
MAX_BYTES = 256 * 1024  # §1: the default size limit
MAX_DEPTH = 64  # §1: objects and arrays nested, the message itself included
_TIME = re.compile(r"(\d{4})-(\d\d)-(\d\d)[Tt](\d\d):(\d\d):(\d\d)(\.\d+)?"
                   r"(?:[Zz]|([+-])(\d\d):(\d\d))", re.ASCII)
STATUSES = ("ok", "error", "timeout", "skipped")


class Refused(ValueError):
    """A message §1 refuses; ``args[0]`` is its dead-letter code."""


def epoch_ms(text: str) -> int:
    """§1 Times: an RFC 3339 date-time as epoch milliseconds (UTC, truncated; ``:60`` is
    ``:59.999``; years 0001-9999 as UTC instants). Raises ``ValueError``."""
    match = _TIME.fullmatch(text)
    if match is None:
        raise ValueError(f"not an RFC 3339 date-time: {text!r}")
    year, month, day, hour, minute, second = (int(g) for g in match.group(1, 2, 3, 4, 5, 6))
    millis = int((match.group(7) or ".")[1:4].ljust(3, "0"))
    if second == 60:
        second, millis = 59, 999
    local = datetime(year, month, day, hour, minute, second)  # ValueError on a bad date/time
    offset = timedelta(0)
    if match.group(8):
        hours, minutes = int(match.group(9)), int(match.group(10))
        if hours > 23 or minutes > 59:
            raise ValueError("zone offset out of range")
        offset = timedelta(hours=hours, minutes=minutes) * (1 if match.group(8) == "+" else -1)
    ms = (local - datetime(1970, 1, 1) - offset) // timedelta(milliseconds=1) + millis
    if not FIRST_MS <= ms <= LAST_MS:
        raise ValueError("outside years 0001-9999 in UTC")
    return ms


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names):
        raise Refused("invalid_json")
    return dict(pairs)


def _refuse_constant(name: str) -> Any:
    raise Refused("invalid_json")  # NaN, Infinity, -Infinity


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise Refused("invalid_json")  # 1e400 overflows a double
    return value


def _depth_and_text_ok(value: Any, depth: int = 1) -> bool:
    """At most ``MAX_DEPTH`` objects/arrays nested, and every text UTF-8 (no lone
    surrogate)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, (dict, list)):
        if depth > MAX_DEPTH:
            return False
        items = [*value, *value.values()] if isinstance(value, dict) else value
        return all(_depth_and_text_ok(item, depth + 1) for item in items)
    return True


def _decode(line: str | bytes, max_bytes: int) -> tuple[str, Any]:
    """§1 Dead letters, up to the object: the text and its JSON value."""
    data = line.encode("utf-8", "surrogatepass") if isinstance(line, str) else line
    if len(data) > max_bytes:
        raise Refused("too_large")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise Refused("not_utf8") from None
    try:
        value = json.loads(text, object_pairs_hook=_no_repeats, parse_constant=_refuse_constant,
                           parse_float=_finite)
    except (ValueError, RecursionError) as exc:  # also an integer beyond 4,300 digits
        raise Refused(exc.args[0] if isinstance(exc, Refused) else "invalid_json") from None
    if not _depth_and_text_ok(value):
        raise Refused("invalid_json")
    return text, value


def _field(obj: dict[str, Any], name: str, required: bool, ok: Any) -> Any:
    """A field of §1's table: null is absent; a required one must be there; ``ok(value)``."""
    value = obj.get(name)
    if value is None:
        if required:
            raise Refused("invalid_message")
        return None
    if not ok(value):
        raise Refused("invalid_message")
    return value


def _text(value: Any) -> bool:
    return isinstance(value, str)


def _name(value: Any) -> bool:
    return isinstance(value, str) and value != ""


def _names(value: Any) -> bool:
    return isinstance(value, list) and all(_name(item) for item in value)


def _time(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        epoch_ms(value)
    except ValueError:
        return False
    return True


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_message(line: int, data: str | bytes, contracts: dict[str, Contract],
                 max_bytes: int = MAX_BYTES) -> Msg:
    """One input line as §1 reads it; raises ``Refused`` with its dead-letter code."""
    raw, obj = _decode(data, max_bytes)
    if not isinstance(obj, dict):
        raise Refused("not_object")
    kind = obj.get("kind")
    if kind not in (None, "open", "receipt"):
        raise Refused("invalid_message")
    join_id = _field(obj, "join_id", True, lambda v: _name(v) and len(v) <= 256)
    contract = _field(obj, "contract", False, _name)
    ids = {name: _field(obj, name, False, _text) for name in ("run_id", "message_id")}
    common = dict(line=line, raw=raw, obj=obj, join_id=join_id, contract=contract, **ids)
    if kind == "open":
        opened = epoch_ms(_field(obj, "opened_at", True, _time))
        required, optional = (_field(obj, name, False, _names) for name in
                              ("required", "optional"))
        deadline_s = _field(obj, "deadline_s", False, lambda v: _number(v) and v > 0)
        flags = {name: _field(obj, name, False, lambda v: isinstance(v, bool))
                 for name in ("allow_partial", "fail_fast")}
        if required and optional and set(required) & set(optional):
            raise Refused("invalid_message")
        if contract is not None and contract not in contracts:
            raise Refused("unknown_contract")
        fields = {"kind": "open", "join_id": join_id, "opened_at": rfc3339(opened),
                  "contract": contract,
                  "required": None if required is None else sorted(set(required)),
                  "optional": None if optional is None else sorted(set(optional)),
                  "deadline_s": deadline_s, **flags}
        fields = {name: v for name, v in fields.items() if v is not None}
        return Msg(kind="open", time=opened,
                   required=None if required is None else frozenset(required),
                   optional=None if optional is None else frozenset(optional),
                   deadline_ms=None if deadline_s is None else milliseconds(deadline_s),
                   identity=tuple(sorted((n, json_key(v)) for n, v in fields.items())),
                   canon=canonical(fields), **flags, **common)
    branch = _field(obj, "branch", True, _name)
    status = _field(obj, "status", True, lambda v: v in STATUSES)
    event_time = epoch_ms(_field(obj, "event_time", True, _time))
    key = _field(obj, "key", False, _text)
    error = _field(obj, "error", False, _text)
    attempt = _field(obj, "attempt", False, lambda v: type(v) is int and 1 <= v < 2**63)
    opened_at = _field(obj, "opened_at", False, _time)
    if contract is not None and contract not in contracts:
        raise Refused("unknown_contract")
    return Msg(kind="receipt", time=event_time, branch=branch, status=status,
               key=branch if key is None else key, value=obj.get("value"), error=error,
               attempt=attempt or 1, opened_at=None if opened_at is None else epoch_ms(opened_at),
               **common)


# ---------------------------------------------------------------------------- §6 contracts
@dataclass(frozen=True)
class Contract:
    """The fields of one contract the join reads (§6)."""

    required: list[str] | None = None
    optional: list[str] | None = None
    deadline_s: float | None = None
    allow_partial: bool | None = None
    fail_fast: bool | None = None
    retention_s: float | None = None
    close_trigger: str | None = None
    schemas: dict[str, Any] = field(default_factory=dict)


def read_contracts(text: str) -> dict[str, Contract]:
    """The contracts of a plain contracts file by name (``yaml.safe_load``: the tests' files
    use no scalar that YAML 1.1 and the core schema read differently)."""
    return {entry["name"]: Contract(**{k: v for k, v in entry.items() if k != "name"})
            for entry in yaml.safe_load(text)["contracts"]}


@dataclass(frozen=True)
class Defaults:
    """§2's pipeline defaults."""

    deadline_s: float = 30.0
    allow_partial: bool = False
    fail_fast: bool = False
    close_trigger: str = "eager"
    retention_s: float = 604800.0


@dataclass(frozen=True)
class Env:
    """The contracts file, the pipeline defaults and the per-join limit."""

    contracts_yaml: str
    defaults: Defaults = field(default_factory=Defaults)
    max_messages_per_join: int = 100_000
    reopen_after_retention: bool = True  # docs/spec.md "Tombstones and stragglers"
    max_bytes: int = MAX_BYTES  # §1: a longer message is too_large
    max_bytes_per_join: int = 16 * 1024 * 1024  # §4

    @functools.cached_property
    def contracts(self) -> dict[str, Contract]:
        return read_contracts(self.contracts_yaml)


# ---------------------------------------------------------------------------- §2 definition
@dataclass(frozen=True)
class Definition:
    contract: str | None
    required: frozenset[str] | None  # None: undefined
    optional: frozenset[str]
    deadline_ms: int
    allow_partial: bool
    fail_fast: bool
    retention_ms: int
    schemas: dict[str, Any]
    opened_at: int
    defining_open: Msg | None

    @property
    def deadline(self) -> int:
        return min(self.opened_at + self.deadline_ms, LAST_MS)


def definition(msgs: list[Msg], env: Env) -> Definition:
    """§2 over exactly ``msgs`` (at least one message)."""
    opens = [m for m in msgs if m.kind == "open"]
    receipts = [m for m in msgs if m.kind == "receipt"]
    first = min(opens, key=lambda m: (m.time, m.canon)) if opens else None
    names = {m.contract for m in msgs if m.contract is not None}
    contract: str | None = None
    if first is not None and first.contract is not None:
        contract = first.contract
    elif names:
        contract = min(names)
    spec = env.contracts.get(contract) if contract is not None else None
    dflt = env.defaults

    def pick(name: str, default: Any) -> Any:
        """The open's value, else the contract's, else the default."""
        for source in (first, spec):
            value = getattr(source, name, None) if source is not None else None
            if value is not None:
                return value
        return default

    required = pick("required", None)
    required = None if required is None else frozenset(required)
    # READING: a branch required by one source and optional by another is required only
    optional = frozenset(pick("optional", ())) - (required or frozenset())
    if first is not None and first.deadline_ms is not None:
        deadline_ms = first.deadline_ms
    else:
        deadline_ms = milliseconds(pick("deadline_s", dflt.deadline_s))
    if first is not None:
        opened_at = first.time
    elif any(m.opened_at is not None for m in receipts):
        opened_at = min(m.opened_at for m in receipts if m.opened_at is not None)
    else:
        opened_at = min(m.time for m in receipts)
    retention_s = spec.retention_s if spec is not None and spec.retention_s is not None \
        else dflt.retention_s
    return Definition(contract=contract, required=required, optional=optional,
                      deadline_ms=deadline_ms,
                      allow_partial=pick("allow_partial", dflt.allow_partial),
                      fail_fast=pick("fail_fast", dflt.fail_fast),
                      retention_ms=milliseconds(retention_s),
                      schemas=dict(spec.schemas) if spec is not None else {},
                      opened_at=opened_at, defining_open=first)


# ---------------------------------------------------------------------------- §3 reducer
@dataclass
class State:
    """The reducer's answer over a set of messages under one definition."""

    complete: bool
    all_reported: bool
    pruned: list[str]
    missing: list[str]
    failed: list[str]
    values: dict[str, Any]
    branches: dict[str, Any]
    conflicts: list[dict[str, Any]]
    duplicates: int
    superseded: int


def _earliest(copies: list[Msg]) -> Msg:
    """The current copy among identical receipts: the earliest (event time, message_id)."""
    return min(copies, key=lambda m: (m.time, m.message_id or "", m.run_id or "", m.raw))


def _view(m: Msg) -> dict[str, Any]:
    return {"status": m.status, "key": m.key, "attempt": m.attempt,
            "event_time": rfc3339(m.time), "value": m.value, "error": m.error}


def reduce(defn: Definition, msgs: list[Msg]) -> State:
    """§3 over exactly ``msgs`` under ``defn`` (which has a ``required`` set)."""
    assert defn.required is not None
    required, declared = defn.required, defn.required | defn.optional
    receipts = [m for m in msgs if m.kind == "receipt"]
    conflicts: list[dict[str, Any]] = []
    branches: dict[str, Any] = {}
    duplicates = superseded = 0

    # Opens: identical ones are duplicates, different ones a conflict.
    opens: dict[Any, int] = defaultdict(int)
    for m in msgs:
        if m.kind == "open":
            opens[m.identity] += 1
    duplicates += sum(n - 1 for n in opens.values())
    if len(opens) > 1:
        conflicts.append({"kind": "open_conflict", "branch": None, "key": None,
                          "count": len(opens)})
    names = sorted({m.contract for m in msgs if m.contract is not None})
    if len(names) > 1:
        conflicts.append({"kind": "contract_conflict", "branch": None, "key": None,
                          "contracts": names})

    # Skips prune by path prefix; a skip that covers no declared branch is unknown.
    skips: dict[str, list[Msg]] = defaultdict(list)
    for m in receipts:
        if m.status == "skipped":
            skips[m.branch].append(m)
    pruned: set[str] = set()
    for path, copies in skips.items():
        duplicates += len(copies) - 1
        covered = {b for b in declared if b == path or b.startswith(path + "/")}
        pruned |= covered
        if covered:
            branches[path] = _view(_earliest(copies))
        else:
            # docs/spec.md §5: the key of a skip's conflict is the least key of its skips
            conflicts.append({"kind": "unknown_branch", "branch": path,
                              "key": min(m.key for m in copies)})

    # Other receipts: per branch the top attempt wins; one content there is the current one.
    current: dict[str, Msg] = {}
    by_branch: dict[str, list[Msg]] = defaultdict(list)
    for m in receipts:
        if m.status != "skipped":
            by_branch[m.branch].append(m)
    for name, rs in by_branch.items():
        groups: dict[Any, list[Msg]] = defaultdict(list)
        for m in rs:
            groups[m.attempt, m.content].append(m)
        duplicates += sum(len(g) - 1 for g in groups.values())
        top = max(m.attempt for m in rs)
        superseded += sum(1 for attempt, _ in groups if attempt < top)
        candidates = [g for (attempt, _), g in groups.items() if attempt == top]
        # READING: a branch conflict's key is the least key of the branch's top-attempt receipts
        key = min(m.key for g in candidates for m in g)
        if name not in declared:
            skipped = next((c for c in conflicts if c["kind"] == "unknown_branch"
                            and c["branch"] == name), None)
            if skipped is not None:  # skipped and reported: one entry per branch (§3, §5)
                skipped["key"] = min(skipped["key"], key)
            else:
                conflicts.append({"kind": "unknown_branch", "branch": name, "key": key})
        elif name in pruned:
            conflicts.append({"kind": "pruned_branch_reported", "branch": name, "key": key})
        elif len(candidates) > 1:
            conflicts.append({"kind": "duplicate_changed", "branch": name, "key": key,
                              "attempt": top})
        else:
            current[name] = _earliest(candidates[0])
            branches[name] = _view(current[name])

    # Values: schemas per key, then key conflicts among current ok receipts.
    writers: dict[str, list[Msg]] = defaultdict(list)
    for name, m in sorted(current.items()):
        if m.status != "ok":
            continue
        writers[m.key].append(m)
        schema = defn.schemas.get(m.key)
        if schema is not None:
            error = next(iter(jsonschema.Draft202012Validator(schema).iter_errors(m.value)),
                         None)
            if error is not None:
                conflicts.append({"kind": "schema_violation", "branch": name, "key": m.key,
                                  "detail": error.message[:500]})
    key_conflicted = set()
    for key, ws in writers.items():
        if len({json_key(m.value) for m in ws}) > 1:
            key_conflicted.add(key)
            for m in ws:
                conflicts.append({"kind": "key_conflict", "branch": m.branch, "key": key,
                                  "value": m.value})
    in_conflict = {c["branch"] for c in conflicts}
    values = {}
    for key, ws in sorted(writers.items()):
        clean = [m for m in ws if m.branch not in in_conflict]
        if key not in key_conflicted and clean:
            values[key] = clean[0].value

    live = sorted(required - pruned)
    conflicts.sort(key=lambda c: (c["kind"], c["branch"] or "", c["key"] or ""))
    return State(
        complete=not conflicts and all(b in current and current[b].status == "ok"
                                       for b in live),
        all_reported=all(b in current for b in live),
        pruned=sorted(pruned),
        missing=[b for b in live if b not in current],
        failed=[b for b in live if b in current and current[b].status in ("error", "timeout")],
        values=values,
        branches=dict(sorted(branches.items())),
        conflicts=conflicts,
        duplicates=duplicates,
        superseded=superseded,
    )


def closable(defn: Definition, msgs: list[Msg]) -> bool:
    """§4: complete, or with ``fail_fast`` every required, unpruned branch reported."""
    state = reduce(defn, msgs)
    return state.complete or (defn.fail_fast and state.all_reported)


# ---------------------------------------------------------------------------- §4 closing
@dataclass(frozen=True)
class Closed:
    defn: Definition
    closed_at: int
    included: list[Msg]
    decided_at: int  # the event time by which the stream knows it: messages up to it were seen


@dataclass(frozen=True)
class Undefined:
    deadline: int
    rejected: list[Msg]
    decided_at: int


def _upto(msgs: list[Msg], t: int) -> list[Msg]:
    return [m for m in msgs if m.time <= t]


def _at_deadline(defn: Definition, msgs: list[Msg]) -> Closed | Undefined:
    """The watermark passed ``D`` of ``defn`` with no message in between."""
    so_far = _upto(msgs, defn.deadline)
    if defn.required is None:
        return Undefined(defn.deadline, so_far, defn.deadline)
    return Closed(defn, defn.deadline, so_far, defn.deadline)


def _closing_lookback(defn: Definition, msgs: list[Msg], times: list[int], now: int
                      ) -> Closed | None:
    """A message moved ``D`` behind itself: the join closes at once, at or before the new
    ``D``, under the new definition.

    docs/spec.md §2 (2.): at the least candidate ``t`` in ``[opened_at, D]`` at which the reducer
    under the new definition over the messages with effective time ``<= t`` is closable, else
    at ``D``.
    """
    if defn.required is None:
        return None
    for t in sorted({*times, defn.opened_at}):
        if defn.opened_at <= t <= defn.deadline and closable(defn, _upto(msgs, t)):
            return Closed(defn, t, _upto(msgs, t), now)
    return Closed(defn, defn.deadline, _upto(msgs, defn.deadline), now)


def decide(msgs: list[Msg], env: Env) -> Closed | Undefined:
    """The decision of one join over all of its messages (bounded input); see the module
    docstring."""
    times = sorted({m.time for m in msgs} |
                   {m.opened_at for m in msgs if m.opened_at is not None})
    in_force: Definition | None = None
    for t in times:
        if in_force is not None and t > in_force.deadline:
            return _at_deadline(in_force, msgs)
        so_far = _upto(msgs, t)
        if not so_far:
            continue
        defn = definition(so_far, env)
        if defn.deadline < t:
            # docs/spec.md §2 (2.): undefined, its messages up to t are dead letters
            return _closing_lookback(defn, msgs, times, t) or \
                Undefined(defn.deadline, so_far, t)
        if defn.required is not None and t >= defn.opened_at and closable(defn, so_far):
            return Closed(defn, t, so_far, t)
        in_force = defn
    assert in_force is not None
    return _at_deadline(in_force, msgs)


# ---------------------------------------------------------------------------- §5 outputs
def close_object(closed: Closed) -> dict[str, Any]:
    defn, included = closed.defn, closed.included
    state = reduce(defn, included)
    reason = "complete" if state.complete else "partial" if defn.allow_partial else "timeout"
    # docs/spec.md §5: the least run_id among the copies of the defining open, else the least
    # among the receipts the close holds
    first = defn.defining_open
    ids = [m.run_id for m in included if m.run_id is not None and (
        m.identity == first.identity if first is not None and m.kind == "open" else False)]
    if not ids:
        ids = [m.run_id for m in included if m.kind == "receipt" and m.run_id is not None]
    run_id = min(ids) if ids else None
    return {
        "join_id": None,  # filled in by join_outputs (a close may hold no message)
        "contract": defn.contract,
        "run_id": run_id,
        "reason": reason,
        "opened_at": rfc3339(defn.opened_at),
        "deadline": rfc3339(defn.deadline),
        "closed_at": rfc3339(closed.closed_at),
        "latency_ms": closed.closed_at - defn.opened_at,
        "required": sorted(defn.required or ()),
        "optional": sorted(defn.optional),
        "pruned": state.pruned,
        "missing": state.missing,
        "failed": state.failed,
        "values": state.values,
        "branches": state.branches,
        "conflicts": state.conflicts,
        "counts": {"messages": len(included), "duplicates": state.duplicates,
                   "superseded": state.superseded},
    }


def _arrival(m: Msg) -> tuple[int, bool, str]:
    """Event time, opens first, then the text: the order a sorted replay delivers."""
    return (m.time, m.kind != "open", m.raw)


def _dead(error: str, m: Msg) -> dict[str, Any]:
    return {"error": error, "raw": m.raw}


def _fitting(queue: list[Msg], env: Env) -> int:
    """§4: how many of ``queue`` (in arrival order) the join holds: at most
    ``max_messages_per_join``, and no more bytes than ``max_bytes_per_join`` (the first message
    that does not fit ends it; the first message always fits)."""
    total = 0
    for n, m in enumerate(queue[:env.max_messages_per_join]):
        total += len(m.raw.encode("utf-8"))
        if n and total > env.max_bytes_per_join:
            return n
    return min(len(queue), env.max_messages_per_join)


def join_outputs(msgs: list[Msg], env: Env) -> dict[str, list[dict[str, Any]]]:
    """Closes, late lines and dead letters of one join's messages.

    - An undefined join's messages so far are ``undefined_join``; the rest form a fresh join.
    - The per-join limit (docs/spec.md §4): the join holds its first ``max_messages_per_join``
      messages in event-time order; a further message is late if the join closed before its
      event time (starts the next join if an undefined join was decided before it), else
      ``join_too_large``. Likewise for ``max_bytes_per_join``: it holds the longest prefix
      whose messages' UTF-8 bytes (as received) fit, the first message always.
    - A message after ``D + retention_s`` of a closed join starts a fresh join (tombstone
      gone), when ``env.reopen_after_retention`` — unless the join had seen it already (its
      event time is not after the decision: it moved ``D`` behind itself).
    """
    out: dict[str, list[dict[str, Any]]] = {"closes": [], "late": [], "dead_letter": []}
    queue = sorted(msgs, key=_arrival)
    while queue:
        fits = _fitting(queue, env)
        held, overflow = queue[:fits], queue[fits:]
        decision = decide(held, env)
        fresh: list[Msg] = []
        if isinstance(decision, Undefined):
            out["dead_letter"] += [_dead("undefined_join", m) for m in decision.rejected]
            fresh = [m for m in held if m not in decision.rejected]
            for m in overflow:
                if m.time <= decision.decided_at:
                    out["dead_letter"].append(_dead("join_too_large", m))
                else:
                    fresh.append(m)
        else:
            close = close_object(decision)
            close["join_id"] = queue[0].join_id
            out["closes"].append(close)
            deadline = decision.defn.deadline
            expiry = deadline + decision.defn.retention_ms
            for m in held + overflow:
                if m in decision.included:
                    continue
                if m in overflow and m.time <= decision.closed_at:
                    out["dead_letter"].append(_dead("join_too_large", m))
                elif env.reopen_after_retention and m.time > max(expiry, decision.decided_at):
                    fresh.append(m)
                else:
                    out["late"].append({
                        "join_id": m.join_id,
                        "reason": "after_deadline" if m.time > deadline else "after_close",
                        "close_reason": close["reason"], "message": m.obj})
        queue = sorted(fresh, key=_arrival)
    return out


def parse_lines(lines: Sequence[str | bytes], env: Env
                ) -> tuple[dict[str, list[Msg]], list[dict[str, Any]]]:
    """Valid messages by join id, and the dead letters of the invalid lines."""
    by_join: dict[str, list[Msg]] = defaultdict(list)
    dead: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line:  # a blank line separates messages (a line of spaces does not)
            continue
        try:
            m = read_message(number, line, env.contracts, env.max_bytes)
        except Refused as exc:
            raw = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
            dead.append({"error": exc.args[0], "raw": raw})
            continue
        by_join[m.join_id].append(m)
    return by_join, dead


def reference_outputs(lines: Sequence[str | bytes], env: Env) -> dict[str, list[dict[str, Any]]]:
    """The three outputs of a bounded run over ``lines`` (dead letters as ``{error, raw}``)."""
    by_join, dead = parse_lines(lines, env)
    out: dict[str, list[dict[str, Any]]] = {"closes": [], "late": [], "dead_letter": dead}
    for msgs in by_join.values():
        for kind, objs in join_outputs(msgs, env).items():
            out[kind] += objs
    return out
