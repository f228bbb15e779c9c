"""The join reducer of SPEC §2-3: a pure, order-independent fold of one join's messages.

No Beam import: this is plain Python, tested and benchmarked alone.

Guarantees:
- ``JoinReducer.add`` applies one ``Record`` in O(1) amortised time at any fan-out width: per
  branch aggregates and the counters that decide completeness are maintained incrementally;
  nothing seen before is rescanned. (A change of the join's definition - its open or contract
  arriving - recomputes the derived counters once, in O(branches).)
- The result (``complete``, ``all_reported``, ``close``) depends only on the set of records
  added, never on their order. Redelivering a record changes only ``counts.messages`` and
  ``counts.duplicates``.
- Rules, as SPEC §3 states them: pruning by path prefix (``b`` prunes ``b`` and ``b/...``);
  ``unknown_branch`` for receipts outside the declared branches and for skips that prune
  nothing; ``pruned_branch_reported``; per branch the highest attempt wins and lower attempts
  are ``superseded``; identical content again is a ``duplicate``, different content at the top
  attempt is ``duplicate_changed`` (and the branch has no current receipt); ``key_conflict`` by
  JSON equality, one entry per branch involved; ``schema_violation`` against the contract's
  JSON Schema for the key; ``open_conflict`` and ``contract_conflict``.

Choices where SPEC is silent (see docs/semantics.md):
- Receipts are grouped per branch by ``(attempt, content)``; a second receipt in a group is a
  duplicate (also below the top attempt, so a redelivered superseded receipt is a duplicate);
  ``superseded`` counts the distinct groups below the top attempt.
- The current receipt of a branch is the earliest (event time, message_id) of its group.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from fanin.contracts import records as R
from fanin.contracts.catalog import Catalog, Definition
from fanin.contracts.records import (
    CONTRACT,
    JOIN_ID,
    KIND,
    MESSAGE_ID,
    O_ALLOW_PARTIAL,
    O_CANON,
    O_DEADLINE_MS,
    O_FAIL_FAST,
    O_OPTIONAL,
    O_REQUIRED,
    OPEN,
    R_ATTEMPT,
    R_BRANCH,
    R_CONTENT,
    R_ERROR,
    R_KEY,
    R_OPENED_AT,
    R_STATUS,
    R_VALUE,
    R_VALUE_CANON,
    RAW,
    RUN_ID,
    TIME,
)
from fanin.contracts.timefmt import MAX_MS, format_ms

__all__ = ["JoinReducer"]

_REQ_MISSING, _REQ_UNREPORTED, _CONFLICTS, _KEYENTRY = range(4)
_NONE = (0, 0, 0, None)
_REQ_EMPTY = (1, 1, 0, None)
# Shared read-only empties: most joins never skip, name a contract or prune; a real container
# replaces the sentinel on first write (fewer allocations = less GC work per join).
_NO_MAP: Any = MappingProxyType({})
_NO_SET: frozenset[str] = frozenset()


def _earlier(a: R.Record, b: R.Record) -> bool:
    """Deterministic "first" among records of identical content."""
    return (a[TIME], a[MESSAGE_ID] or "", a[RUN_ID] or "", a[RAW]) < \
        (b[TIME], b[MESSAGE_ID] or "", b[RUN_ID] or "", b[RAW])


def _keep_first(mapping: dict[str, R.Record], key: str, record: R.Record) -> bool:
    """Store ``record`` under ``key``, keeping the earliest copy; True if the key was new."""
    seen = mapping.get(key)
    if seen is None:
        mapping[key] = record
        return True
    if _earlier(record, seen):
        mapping[key] = record
    return False


class _Branch:
    """All non-skip receipts of one branch path (a branch with one receipt is just the record).

    ``cand``: content -> first record, at ``max_attempt``; ``lower``: the (attempt, content)
    groups seen below ``max_attempt`` (created on first need); ``schema``: cached
    (content, violation or None).
    """

    __slots__ = ("cand", "lower", "max_attempt", "schema")

    def __init__(self, attempt: int, content: str, record: R.Record) -> None:
        self.max_attempt = attempt
        self.cand: dict[str, R.Record] = {content: record}
        self.lower: set[tuple[int, str]] | None = None
        self.schema: tuple[str, str | None] | None = None


class JoinReducer:
    """Order-independent state of one join; see the module docstring for the guarantees."""

    # Class-level defaults: a new join allocates only what it writes (less GC work per join).
    messages = 0
    duplicates = 0
    superseded = 0
    _first: R.Record | None = None  # the defining open
    contract_names: dict[str, int] = _NO_MAP
    min_event: int | None = None
    min_receipt_opened: int | None = None
    skips: dict[str, R.Record] = _NO_MAP  # skipped path -> first skip record
    _defn: Definition | None = None
    _n_missing = 0
    _n_unreported = 0
    _n_conflicts = 0
    _pruned: set[str] = _NO_SET
    _contrib: dict[str, tuple[int, int, int, Any]] = _NO_MAP
    # key -> value canon (one writer) or [writers, {value canon: writers}]
    _keys: dict[str, Any] = _NO_MAP
    # canon -> first open record; while a join has one distinct open it is only ``_first``
    _opens: dict[str, R.Record] = _NO_MAP

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.branches: dict[str, _Branch | R.Record] = {}

    @property
    def opens(self) -> dict[str, R.Record]:
        """canon -> the first copy of each distinct open (read-only view for the close)."""
        if self._opens is _NO_MAP and self._first is not None:
            return {self._first[O_CANON]: self._first}
        return self._opens

    # ------------------------------------------------------------------ definition
    def _reset_derived(self) -> None:
        self._n_missing = 0
        self._n_unreported = 0
        self._n_conflicts = 0
        self._pruned: set[str] = _NO_SET
        # explicit contributions; a one-receipt ok branch on the fast path has an implicit one
        self._contrib: dict[str, tuple[int, int, int, Any]] = _NO_MAP
        self._keys: dict[str, Any] = _NO_MAP

    def defining_open(self) -> R.Record | None:
        return self._first

    def contract(self) -> str | None:
        first = self._first
        if first is not None and first[CONTRACT] is not None:
            return first[CONTRACT]
        return min(self.contract_names) if self.contract_names else None

    def _resolve(self) -> Definition:
        first = self._first
        contract = self.contract()
        if first is None:
            return self.catalog.definition(contract, None, None, None, None, None)
        return self.catalog.definition(contract, first[O_REQUIRED], first[O_OPTIONAL],
                                       first[O_DEADLINE_MS], first[O_ALLOW_PARTIAL],
                                       first[O_FAIL_FAST])

    def _redefine(self) -> None:
        defn = self._resolve()
        previous = self._defn
        if defn is previous:
            return
        self._defn = defn
        if previous is not None and previous.required is not None:
            self._reset_derived()  # derived counters exist only under a defined join
        if defn.required is None:
            return
        self._n_missing = self._n_unreported = len(defn.required)
        # every branch's contribution becomes explicit first; then the skips prune
        for name, entry in self.branches.items():
            self._set_contrib(name, self._contribution(name, entry), self._baseline(name))
        for path in self.skips:
            self._apply_skip(path)

    @property
    def definition(self) -> Definition:
        if self._defn is None:
            self._defn = self._resolve()
        return self._defn

    # ------------------------------------------------------------------ derived counters
    def _baseline(self, name: str) -> tuple[int, int, int, Any]:
        """The contribution of a declared branch with no receipts (required: missing)."""
        defn = self._defn
        assert defn is not None
        if defn.role.get(name) == 1 and name not in self._pruned:
            return _REQ_EMPTY
        return _NONE

    def _old(self, name: str) -> tuple[int, int, int, Any]:
        """``name``'s current contribution: explicit, implicit (fast path) or the baseline."""
        old = self._contrib.get(name)
        if old is not None:
            return old
        entry = self.branches.get(name)
        defn = self._defn
        if type(entry) is tuple and defn is not None and entry[R_STATUS] == "ok" and \
                not defn.validators and defn.role.get(name) is not None and \
                name not in self._pruned:
            return (0, 0, 0, (entry[R_KEY], entry[R_VALUE_CANON]))
        return self._baseline(name)

    def _set_contrib(self, name: str, new: tuple[int, int, int, Any],
                     old: tuple[int, int, int, Any] | None = None) -> None:
        """Replace ``name``'s contribution to the counters."""
        if old is None:
            old = self._old(name)
        if self._contrib is _NO_MAP:
            self._contrib = {}
        if old == new:
            self._contrib[name] = new
            return
        self._n_missing += new[0] - old[0]
        self._n_unreported += new[1] - old[1]
        self._n_conflicts += new[2] - old[2]
        if old[3] != new[3]:
            if old[3] is not None:
                self._key_entry(old[3], -1)
            if new[3] is not None:
                self._key_entry(new[3], 1)
        self._contrib[name] = new

    def _key_entry(self, entry: tuple[str, str], delta: int) -> None:
        """Add/remove one writer of ``key = value``; key conflicts count every writer."""
        key, value = entry
        keys = self._keys
        if keys is _NO_MAP:
            keys = self._keys = {}
        slot = keys.get(key)
        if slot is None:  # first writer of the key (only added writers are ever removed)
            keys[key] = value
            return
        if type(slot) is str:  # one writer so far
            if delta < 0:
                del keys[key]
                return
            if slot == value:
                keys[key] = [2, {value: 2}]
            else:
                keys[key] = [2, {slot: 1, value: 1}]
                self._n_conflicts += 2
            return
        values = slot[1]
        before = slot[0] if len(values) > 1 else 0
        slot[0] += delta
        count = values.get(value, 0) + delta
        if count:
            values[value] = count
        else:
            del values[value]
        after = slot[0] if len(values) > 1 else 0
        self._n_conflicts += after - before
        if not values:
            del self._keys[key]

    def _contribution(self, name: str, branch: _Branch | R.Record | None
                      ) -> tuple[int, int, int, Any]:
        defn = self._defn
        assert defn is not None and defn.required is not None
        required = defn.role.get(name)
        if required is None or name in self._pruned:  # unknown, or pruned
            return (0, 0, 1, None) if branch is not None else _NONE
        if branch is None:
            return (required, required, 0, None)
        cand = _candidates(branch)
        if len(cand) > 1:
            return (required, required, 1, None)
        for content, record in cand.items():
            if record[R_STATUS] != "ok":
                return (required, 0, 0, None)
            validator = defn.validators.get(record[R_KEY]) if defn.validators else None
            bad = 1 if validator is not None and \
                self._violation(branch, content, record, validator) else 0
            return (0, 0, bad, (record[R_KEY], record[R_VALUE_CANON]))
        raise AssertionError("a branch always has a candidate")

    @staticmethod
    def _violation(branch: _Branch | R.Record, content: str, record: R.Record, validator: Any
                   ) -> str | None:
        """The schema error of an ok value, or None; cached on a ``_Branch``."""
        if type(branch) is _Branch and branch.schema is not None and \
                branch.schema[0] == content:
            return branch.schema[1]
        error = next(iter(validator.iter_errors(record[R_VALUE])), None)
        problem = None if error is None else error.message[:500]
        if type(branch) is _Branch:
            branch.schema = (content, problem)
        return problem

    def _update(self, name: str) -> None:
        self._set_contrib(name, self._contribution(name, self.branches.get(name)))

    def _apply_skip(self, path: str) -> None:
        """Prune what a (first) skip of ``path`` covers, under the current definition."""
        defn = self._defn
        assert defn is not None
        covered = defn.under.get(path)
        if not covered:
            self._n_conflicts += 1  # unknown_branch: the skip prunes nothing
            return
        for name in covered:
            if name not in self._pruned:
                self._materialize(name)
                if self._pruned is _NO_SET:
                    self._pruned = set()
                self._pruned.add(name)
                self._update(name)

    def _materialize(self, name: str) -> None:
        """Store ``name``'s implicit contribution before what it depends on changes."""
        if self._defn is not None and self._defn.required is not None and \
                name not in self._contrib:
            if self._contrib is _NO_MAP:
                self._contrib = {}
            self._contrib[name] = self._old(name)

    # ------------------------------------------------------------------ folding
    def add(self, record: R.Record) -> None:
        """Fold one validated record into the join (any order)."""
        self.messages += 1
        t = record[TIME]
        min_event = self.min_event
        if min_event is None or t < min_event:
            self.min_event = t
        contract = record[CONTRACT]
        redefine = contract is not None and self._note_contract(contract)
        if record[KIND] == OPEN:
            self._add_open(record, t, redefine)
            return
        opened = record[R_OPENED_AT]
        if opened is not None and (self.min_receipt_opened is None or
                                   opened < self.min_receipt_opened):
            self.min_receipt_opened = opened
        if redefine:
            self._redefine()
        status = record[R_STATUS]
        if status == "skipped":
            self._add_skip(record)
            return
        name = record[R_BRANCH]
        branches = self.branches
        branch = branches.get(name)
        if branch is not None:
            self._add_receipt(record, name, branch)
            return
        # the first receipt of a branch: the most common message of all
        branches[name] = record
        defn = self._defn
        if defn is None or defn.required is None:
            return
        role = defn.role.get(name)
        if role is None or status != "ok" or defn.validators or name in self._pruned:
            self._set_contrib(name, self._contribution(name, record), self._baseline(name))
            return
        # ok, declared, unpruned, no schemas: the contribution stays implicit (see _old)
        if role:
            self._n_missing -= 1
            self._n_unreported -= 1
        key = record[R_KEY]
        keys = self._keys
        if keys is _NO_MAP:
            keys = self._keys = {}
        if key in keys:
            self._key_entry((key, record[R_VALUE_CANON]), 1)
        else:  # the first writer of the key (what _key_entry does, without the call)
            keys[key] = record[R_VALUE_CANON]

    def _note_contract(self, contract: str) -> bool:
        """Count a contract name; True when it is new (the definition may change)."""
        count = self.contract_names.get(contract, 0)
        if self.contract_names is _NO_MAP:
            self.contract_names = {}
        self.contract_names[contract] = count + 1
        return count == 0

    def _add_open(self, record: R.Record, t: int, redefine: bool) -> None:
        if self._first is None and self._defn is None and not self.branches and \
                self.skips is _NO_MAP:
            # a fresh join's open (the usual first message): define it without the general path
            self._first = record
            defn = self._defn = self._resolve()
            if defn.required is not None:
                self._n_missing = self._n_unreported = len(defn.required)
            return
        canon = record[O_CANON]
        if self._opens is _NO_MAP:
            self._opens = self.opens.copy()  # from now on the map is kept
        seen = self._opens.get(canon)
        if seen is None:
            self._opens[canon] = record
            first = self._first
            if first is None or (t, canon) < (first[TIME], first[O_CANON]):
                self._first = record
            redefine = True
        else:
            self.duplicates += 1
            if _earlier(record, seen):
                self._opens[canon] = record
                if self._first is seen:
                    self._first = record
        if redefine:
            self._redefine()

    def _add_skip(self, record: R.Record) -> None:
        path = record[R_BRANCH]
        if self.skips is _NO_MAP:
            self.skips = {}
        if not _keep_first(self.skips, path, record):
            self.duplicates += 1
            return
        defn = self._defn
        if defn is not None and defn.required is not None:
            self._apply_skip(path)

    def _add_receipt(self, record: R.Record, name: str, branch: _Branch | R.Record) -> None:
        """A further receipt of a branch that has one already."""
        attempt = record[R_ATTEMPT]
        content = record[R_CONTENT]
        branches = self.branches
        defn = self._defn
        defined = defn is not None and defn.required is not None
        if type(branch) is tuple:
            if attempt == branch[R_ATTEMPT] and content == branch[R_CONTENT]:
                self.duplicates += 1  # a redelivery: nothing else changes
                if _earlier(record, branch):
                    branches[name] = record
                return
            # a different second receipt: keep the aggregate from now on
            self._materialize(name)
            branch = branches[name] = _Branch(branch[R_ATTEMPT], branch[R_CONTENT], branch)
        if attempt == branch.max_attempt:
            if not _keep_first(branch.cand, content, record):
                self.duplicates += 1
                return
        elif attempt > branch.max_attempt:
            lower = branch.lower
            if lower is None:
                lower = branch.lower = set()
            for old in branch.cand:
                lower.add((branch.max_attempt, old))
            self.superseded += len(branch.cand)
            branch.max_attempt = attempt
            branch.cand = {content: record}
        else:
            group = (attempt, content)
            if branch.lower is None:
                branch.lower = {group}
            elif group in branch.lower:
                self.duplicates += 1
                return
            else:
                branch.lower.add(group)
            self.superseded += 1
            return
        if defined:
            self._set_contrib(name, self._contribution(name, branch))

    # ------------------------------------------------------------------ questions
    def is_empty(self) -> bool:
        return self.messages == 0

    def defined(self) -> bool:
        return self.definition.required is not None

    def conflict_count(self) -> int:
        return self._n_conflicts + (len(self._opens) > 1) + (len(self.contract_names) > 1)

    def complete(self) -> bool:
        """Every required, unpruned branch has a current ok receipt, and no conflicts."""
        defn = self._defn
        if defn is None:
            defn = self.definition
        return (defn.required is not None and self._n_missing == 0 and self._n_conflicts == 0
                and len(self._opens) < 2 and len(self.contract_names) < 2)

    def all_reported(self) -> bool:
        """Every required, unpruned branch has a current receipt (the fail_fast condition)."""
        return self.defined() and self._n_unreported == 0

    def closable(self) -> bool:
        if not self.defined():
            return False
        return self.complete() or (self.definition.fail_fast and self.all_reported())

    def opened_at(self) -> int | None:
        first = self.defining_open()
        if first is not None:
            return first[TIME]
        if self.min_receipt_opened is not None:
            return self.min_receipt_opened
        return self.min_event

    def deadline(self) -> int | None:
        opened = self.opened_at()
        # D is capped at the last instant of year 9999 (the latest time the outputs can show)
        return None if opened is None else min(opened + self.definition.deadline_ms, MAX_MS)

    def run_id(self) -> str | None:
        first = self.defining_open()
        if first is not None and first[RUN_ID] is not None:
            return first[RUN_ID]
        ids = [r[RUN_ID] for r in self._all_records() if r[RUN_ID] is not None]
        return min(ids) if ids else None

    def _all_records(self) -> list[R.Record]:
        out = list(self.opens.values()) + list(self.skips.values())
        for branch in self.branches.values():
            out.extend(_candidates(branch).values())
        return out

    def reason(self) -> str:
        if self.complete():
            return "complete"
        return "partial" if self.definition.allow_partial else "timeout"

    # ------------------------------------------------------------------ the close
    def close(self, closed_at: int, reason: str) -> dict[str, Any]:
        """The close object of SPEC §5 for the records folded so far."""
        defn = self.definition
        assert defn.required is not None, "an undefined join has no close"
        required, pruned = defn.required, self._pruned
        branches_out: dict[str, Any] = {}
        conflicts: list[dict[str, Any]] = []
        missing, failed = [], []
        writers: dict[str, list[tuple[str, str, Any]]] = {}
        role = defn.role
        for name, branch in self.branches.items():
            if type(branch) is tuple:  # one receipt: the common case
                record, content, several = branch, branch[R_CONTENT], False
            else:
                several = len(branch.cand) > 1
                content, record = next(iter(branch.cand.items()))
            if name not in role or name in pruned or several:
                kind = "unknown_branch" if name not in role else \
                    "pruned_branch_reported" if name in pruned else "duplicate_changed"
                cand = _candidates(branch)
                entry = {"kind": kind, "branch": name,
                         "key": min(r[R_KEY] for r in cand.values())}
                if kind == "duplicate_changed":
                    entry["attempt"] = record[R_ATTEMPT]
                conflicts.append(entry)
                continue
            branches_out[name] = _receipt_view(record)
            if record[R_STATUS] == "ok":
                validator = defn.validators.get(record[R_KEY])
                problem = validator and self._violation(branch, content, record, validator)
                if problem:
                    conflicts.append({"kind": "schema_violation", "branch": name,
                                      "key": record[R_KEY], "detail": problem})
                writers.setdefault(record[R_KEY], []).append(
                    (name, record[R_VALUE_CANON], record[R_VALUE]))
        for path, record in self.skips.items():
            if defn.under.get(path):
                branches_out[path] = _receipt_view(record)
            else:
                conflicts.append({"kind": "unknown_branch", "branch": path,
                                  "key": record[R_KEY]})
        values: dict[str, Any] = {}
        conflicted_branches = {c["branch"] for c in conflicts}
        for key, entries in writers.items():
            if len(entries) == 1:  # one writer: its value, unless its branch is in conflict
                name, _, value = entries[0]
                if name not in conflicted_branches:
                    values[key] = value
                continue
            if len({canon for _, canon, _ in entries}) > 1:
                for name, _, value in entries:
                    conflicts.append({"kind": "key_conflict", "branch": name, "key": key,
                                      "value": value})
            else:
                clean = [(name, value) for name, _, value in entries
                         if name not in conflicted_branches]
                if clean:  # JSON-equal values: the least branch's spelling (1 or 1.0)
                    values[key] = min(clean, key=lambda item: item[0])[1]
        if len(self.opens) > 1:
            conflicts.append({"kind": "open_conflict", "branch": None, "key": None,
                              "count": len(self.opens)})
        if len(self.contract_names) > 1:
            conflicts.append({"kind": "contract_conflict", "branch": None, "key": None,
                              "contracts": sorted(self.contract_names)})
        for name in (defn.required_sorted if not pruned else sorted(required - pruned)):
            view = branches_out.get(name)
            if view is None:
                missing.append(name)
            elif view["status"] in ("error", "timeout"):
                failed.append(name)
        if len(conflicts) > 1:
            conflicts.sort(key=lambda c: (c["kind"], c["branch"] or "", c["key"] or ""))
        opened = self.opened_at()
        assert opened is not None
        deadline = min(opened + defn.deadline_ms, MAX_MS)
        return {
            "join_id": self._join_id(),
            "contract": defn.contract,
            "run_id": self.run_id(),
            "reason": reason,
            "opened_at": format_ms(opened),
            "deadline": format_ms(deadline),
            "closed_at": format_ms(closed_at),
            "latency_ms": closed_at - opened,
            "required": list(defn.required_sorted),
            "optional": list(defn.optional_sorted),
            "pruned": sorted(pruned),
            "missing": missing,
            "failed": failed,
            "values": dict(sorted(values.items())),
            "branches": dict(sorted(branches_out.items())),
            "conflicts": conflicts,
            "counts": {"messages": self.messages,
                       "duplicates": self.duplicates,
                       "superseded": self.superseded},
        }

    def _join_id(self) -> str:
        for records in (self.opens.values(), self.skips.values(), self.branches.values()):
            for record in records:  # every record of a join carries its join_id
                return (record if type(record) is tuple else
                        next(iter(record.cand.values())))[JOIN_ID]
        raise ValueError("empty join")


def _candidates(branch: _Branch | R.Record) -> dict[str, R.Record]:
    """content -> record at the top attempt, for either form of a branch entry."""
    if type(branch) is _Branch:
        return branch.cand
    return {branch[R_CONTENT]: branch}


def _receipt_view(record: R.Record) -> dict[str, Any]:
    return {"status": record[R_STATUS], "key": record[R_KEY],
            "attempt": record[R_ATTEMPT], "event_time": format_ms(record[TIME]),
            "value": record[R_VALUE], "error": record[R_ERROR]}
