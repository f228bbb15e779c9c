"""The join reducer of docs/spec.md §2-3: a pure, order-independent fold of one join's messages.

No Beam import: this is plain Python, tested and benchmarked alone.

Guarantees:
- ``JoinReducer.add`` applies one ``Record`` in O(1) amortised time at any fan-out width: per
  branch aggregates and the counters that decide completeness are maintained incrementally;
  nothing seen before is rescanned. (A change of the join's definition - its open or contract
  arriving - recomputes the derived counters once, in O(branches); the key map is built once,
  in O(branches), when a branch first writes a key other than its own name.)
- The result (``complete``, ``all_reported``, ``close``) depends only on the set of records
  added, never on their order. Redelivering a record changes only ``counts.messages`` and
  ``counts.duplicates``.
- Rules, as docs/spec.md §3 states them: pruning by path prefix (``b`` prunes ``b`` and ``b/...``);
  ``unknown_branch`` for receipts outside the declared branches and for skips that prune
  nothing (one per path, skipped or reported or both); ``pruned_branch_reported``; per branch
  the highest attempt wins and lower attempts are ``superseded``; identical content again is a
  ``duplicate``, different content at the top attempt is ``duplicate_changed`` (and the branch
  has no current receipt); ``key_conflict`` by JSON equality, one entry per branch involved;
  ``schema_violation`` against the contract's JSON Schema for the key; ``open_conflict`` and
  ``contract_conflict``.

Choices stated in docs/spec.md §3:
- Receipts are grouped per branch by ``(attempt, content)``; a second receipt in a group is a
  duplicate (also below the top attempt, so a redelivered superseded receipt is a duplicate);
  ``superseded`` counts the distinct groups below the top attempt.
- The current receipt of a branch is the earliest (event time, message_id) of its group.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple, cast

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
    R_KEY,
    R_OPENED_AT,
    R_STATUS,
    R_VALUE,
    R_VALUE_CANON,
    RAW,
    RUN_ID,
    TIME,
)
from fanin.contracts.schemas import first_error
from fanin.contracts.timefmt import MAX_MS

__all__ = ["Changed", "Entry", "JoinReducer", "top_receipts"]

# Shared read-only empties: most joins never skip, retry, name a contract or prune; a real
# container replaces the sentinel on first write (fewer allocations = less GC work per join).
_NO_MAP: Any = MappingProxyType({})
_NO_SET: Any = frozenset()


def _earlier(a: R.Record, b: R.Record) -> bool:
    """Deterministic "first" among records of identical content: (event time, message_id,
    run_id, text)."""
    ta, tb = a[TIME], b[TIME]
    if ta != tb:  # the usual answers first, without building the full comparison
        return bool(ta < tb)
    if a[RAW] == b[RAW]:  # the same text (a redelivery): the same message, not earlier
        return False
    return (a[MESSAGE_ID] or "", a[RUN_ID] or "", a[RAW]) < \
        (b[MESSAGE_ID] or "", b[RUN_ID] or "", b[RAW])


def top_receipts(entry: Entry) -> dict[str, R.Record]:
    """content -> record at the top attempt, for either form of a branch entry."""
    if isinstance(entry, Changed):
        return entry.cand
    return {entry[R_CONTENT]: entry}


def _keep_first(mapping: dict[str, R.Record], key: str, record: R.Record) -> bool:
    """Store ``record`` under ``key``, keeping the earliest copy; True if the key was new."""
    seen = mapping.get(key)
    if seen is None:
        mapping[key] = record
        return True
    if _earlier(record, seen):
        mapping[key] = record
    return False


class Changed:
    """A branch whose top attempt has several distinct contents (``duplicate_changed``).

    ``cand``: content -> the first record of that content, all at the same attempt. A branch
    with one content at its top attempt is stored as that bare record instead.
    """

    __slots__ = ("cand",)

    def __init__(self, cand: dict[str, R.Record]) -> None:
        self.cand = cand

    @property
    def attempt(self) -> int:
        attempt: int = next(iter(self.cand.values()))[R_ATTEMPT]
        return attempt


Entry = R.Record | Changed
"""A branch's top-attempt state: the bare first record of its one content, or ``Changed``."""


class Written(NamedTuple):
    """An ok receipt's write, for key conflicts: the key and the value's canonical JSON."""

    key: str
    canon: str


class Contribution(NamedTuple):
    """What one branch adds to the join's counters (a pure function of the definition, the
    pruned set and the branch's entry)."""

    missing: int  # 1 if a required, unpruned branch has no current ok receipt
    not_ok: int  # 1 if such a branch's current receipt is error or timeout
    conflicts: int  # conflict entries of the branch (unknown, pruned, changed, schema)
    written: Written | None  # the key and value it writes, if a current ok receipt


_NONE = Contribution(0, 0, 0, None)


class _Writers:
    """A key written by several branches: how many, and how many per value canon."""

    __slots__ = ("by_value", "count")

    def __init__(self, count: int, by_value: dict[str, int]) -> None:
        self.count = count
        self.by_value = by_value


class JoinReducer:
    """Order-independent state of one join; see the module docstring for the guarantees.

    What is kept: ``branches`` (branch -> its top-attempt entry: the bare first record of its
    one content, or ``Changed``), ``skips`` (path -> first skip), the distinct opens, the
    ``(branch, attempt, content)`` groups below each branch's top attempt, and counters.
    Each branch's *contribution* ``(missing, not ok, conflicts, (key, value canon) or
    None)`` is a pure function of the definition, the pruned set and its entry; when one of
    those changes, the old contribution is taken out of the counters and the new one put in.
    """

    # Fixed slots (no per-instance dict); containers most joins never need start as shared
    # read-only sentinels and are created on first write (fewer allocations, less GC work).
    __slots__ = ("_deadline", "_deferred", "_defn", "_fast", "_first", "_keys", "_lower",
                 "_n_conflicts", "_n_missing", "_n_notok", "_open_runs", "_opens", "_pinned",
                 "_pruned", "_receipt_run", "_skip_keys", "_violations", "branches", "catalog",
                 "contract_names", "duplicates", "messages", "min_event", "min_receipt_opened",
                 "skips", "superseded")

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.branches: dict[str, Entry] = {}
        self.skips: dict[str, R.Record] = _NO_MAP  # skipped path -> first skip record
        self.messages = self.duplicates = self.superseded = 0
        self._first: R.Record | None = None  # the defining open
        # canon -> first open record; while a join has one distinct open it is only _first
        self._opens: dict[str, R.Record] = _NO_MAP
        self.contract_names: set[str] = _NO_SET
        # earliest event time / receipt opened_at; only kept while no open has arrived (an
        # open, once there, gives opened_at for good)
        self.min_event: int | None = None
        self.min_receipt_opened: int | None = None
        self._lower: set[tuple[str, int, str]] = _NO_SET  # (branch, attempt, content) groups
        self._defn: Definition | None = None
        self._deadline: int | None = None  # cache of deadline(); None: not computed
        # The counters that decide completeness: required, unpruned branches without a current
        # ok receipt (_n_missing), those of them whose current receipt is error or timeout
        # (_n_notok: missing - notok is how many have not reported), and every conflict entry
        # of the close, open_conflict and contract_conflict included (_n_conflicts). While the
        # join is undefined (no required set) _n_missing is 1: the unknown set counts as missing.
        self._n_missing = 1
        self._n_notok = self._n_conflicts = 0
        self._pruned: set[str] = _NO_SET
        # key -> value canon (one writer) or _Writers (several), for key
        # conflicts. Left empty (the shared sentinel) while every key written is its writer's own
        # branch name: such keys cannot collide. Built by _build_keys at the first other key.
        self._keys: dict[str, Any] = _NO_MAP
        # declared, unpruned branch -> role (1 required, 0 optional) while the join is
        # defined, for the inline first-receipt path of ``add``; empty otherwise
        self._fast: Mapping[str, int] = _NO_MAP
        self._violations: dict[str, str | None] = _NO_MAP  # content -> schema error (cache)
        # (opened_at, join_id) of a definition fixed by ``pin``; None: derived from the records
        # run ids: the least among the receipts, and the least of the copies of each open that
        # has several
        self._receipt_run: str | None = None
        self._open_runs: dict[str, str] = _NO_MAP
        # skipped path -> the least key among its skips, where a later skip had a lesser key
        self._skip_keys: dict[str, str] = _NO_MAP
        self._pinned: tuple[int, str] | None = None
        self._deferred = False  # add_all: opens do not redefine the join one by one

    def pin(self, definition: Definition, opened_at: int, join_id: str) -> None:
        """Fix the join's definition and ``opened_at`` before any record is added.

        Used when a later message defined the join so that its deadline lies before that
        message (docs/spec.md §2): the close is decided under that definition over the
        earlier records only, so the records no longer define it.
        """
        if self.messages:
            raise ValueError("pin() must come before the first record")
        self._pinned = (opened_at, join_id)
        self._defn = None
        self._redefine_to(definition)

    @property
    def opens(self) -> dict[str, R.Record]:
        """canon -> the first copy of each distinct open (read-only view for the close)."""
        if self._opens is _NO_MAP and self._first is not None:
            return {self._first[O_CANON]: self._first}
        return self._opens

    # ------------------------------------------------------------------ definition
    def defining_open(self) -> R.Record | None:
        return self._first

    def contract(self) -> str | None:
        first = self._first
        if first is not None and first[CONTRACT] is not None:
            contract: str = first[CONTRACT]
            return contract
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
        """Adopt the current definition; recount everything derived from it, in O(branches)."""
        if self._pinned is None:
            self._redefine_to(self._resolve())

    def _redefine_to(self, defn: Definition) -> None:
        """Adopt ``defn``; recount everything derived from it, in O(branches)."""
        if defn is self._defn:
            return
        self._defn = defn
        self._deadline = None
        self._pruned = _NO_SET
        self._fast = _NO_MAP
        self._violations = _NO_MAP
        self._n_conflicts = (len(self._opens) > 1) + (len(self.contract_names) > 1)
        self._keys = _NO_MAP
        self._n_notok = 0
        if defn.required is None:
            self._n_missing = 1
            return
        self._n_missing = len(defn.required)
        self._fast = defn.role
        shifts = [(name, self._contribution(name, None), self._contribution(name, entry))
                  for name, entry in self.branches.items()]
        if any(new.written is not None and new.written.key != name for name, _, new in shifts):
            self._keys = {}  # built up by the shifts below
        for name, old, new in shifts:
            self._shift(name, old, new)
        for path in self.skips:
            self._apply_skip(path)

    @property
    def definition(self) -> Definition:
        """The join's definition now (docs/spec.md §2)."""
        if self._defn is None:
            self._redefine()
        if self._defn is None:
            raise ValueError("a join's definition resolves to a Definition")
        return self._defn

    def _defined(self) -> Definition:
        """The current definition, which has a ``required`` set (callers check first)."""
        defn = self._defn
        if defn is None or defn.required is None:
            raise ValueError("the join is not defined")
        return defn

    # ------------------------------------------------------------------ derived counters
    def _contribution(self, name: str, entry: Entry | None) -> Contribution:
        """What branch ``name`` with ``entry`` (None: no receipt) adds to the counters."""
        defn = self._defined()
        required = defn.role.get(name)
        if required is None or name in self._pruned:  # unknown, or pruned
            return Contribution(0, 0, 1, None) if entry is not None else _NONE
        if entry is None:
            return Contribution(required, 0, 0, None)
        if isinstance(entry, Changed):
            return Contribution(required, 0, 1, None)
        if entry[R_STATUS] != "ok":
            return Contribution(required, required, 0, None)
        validator = defn.validators.get(entry[R_KEY]) if defn.validators else None
        bad = 1 if validator is not None and self.violation(entry, validator) else 0
        return Contribution(0, 0, bad, Written(entry[R_KEY], entry[R_VALUE_CANON]))

    def violation(self, record: R.Record, validator: Any) -> str | None:
        """The schema error of an ok value (at most 500 characters), or None; cached per
        content."""
        content = record[R_CONTENT]
        cache = self._violations
        if content in cache:
            return cache[content]
        problem = first_error(validator, record[R_VALUE])
        if cache is _NO_MAP:
            cache = self._violations = {}
        cache[content] = problem
        return problem

    def _shift(self, name: str, old: Contribution, new: Contribution) -> None:
        """Replace branch ``name``'s contribution ``old`` by ``new`` in the counters."""
        if old == new:
            return
        missing, not_ok, conflicts, now = new
        self._n_missing += missing - old.missing
        self._n_notok += not_ok - old.not_ok
        self._n_conflicts += conflicts - old.conflicts
        was = old.written
        if was != now:
            if self._keys is _NO_MAP:
                if (was is None or was.key == name) and (now is None or now.key == name):
                    return  # own keys only: nothing to track
                self._build_keys(name, was)
            if was is not None:
                self._key_entry(was, -1)
            if now is not None:
                self._key_entry(now, 1)

    def _build_keys(self, name: str, entry: Written | None) -> dict[str, Any]:
        """Build the key map from the contributions in the counters (all own keys, so all
        distinct); ``entry`` is ``name``'s, whose branch entry may already be its next one."""
        keys: dict[str, Any] = {}
        for other, branch in self.branches.items():
            written = entry if other == name else self._contribution(other, branch).written
            if written is not None:
                keys[written[0]] = written[1]
        self._keys = keys
        return keys

    def _key_entry(self, entry: Written, delta: int) -> None:
        """Add/remove one writer of ``key = value``; key conflicts count every writer."""
        key, value = entry
        keys = self._keys
        slot = keys.get(key)
        if slot is None:  # first writer of the key (only added writers are ever removed)
            keys[key] = value
            return
        if type(slot) is str:  # one writer so far
            if delta < 0:
                del keys[key]
                return
            if slot == value:
                keys[key] = _Writers(2, {value: 2})
            else:
                keys[key] = _Writers(2, {slot: 1, value: 1})
                self._n_conflicts += 2
            return
        values = slot.by_value
        before = slot.count if len(values) > 1 else 0
        slot.count += delta
        count = values.get(value, 0) + delta
        if count:
            values[value] = count
        else:
            del values[value]
        after = slot.count if len(values) > 1 else 0
        self._n_conflicts += after - before
        if not values:
            del keys[key]

    def _apply_skip(self, path: str) -> None:
        """Prune what a (first) skip of ``path`` covers, under the current definition."""
        covered = self._defined().under.get(path)
        if not covered:
            if path not in self.branches:  # else one unknown_branch with its receipts'
                self._n_conflicts += 1  # unknown_branch: the skip prunes nothing
            return
        for name in covered:
            if name not in self._pruned:
                entry = self.branches.get(name)
                old = self._contribution(name, entry)
                if self._pruned is _NO_SET:
                    self._pruned = set()
                    self._fast = dict(self._fast)  # the definition's map is shared
                self._pruned.add(name)
                cast(dict[str, int], self._fast).pop(name, None)  # a copy, made above
                self._shift(name, old, self._contribution(name, entry))

    # ------------------------------------------------------------------ folding
    def add_all(self, records: list[R.Record]) -> None:
        """Fold ``records`` (any order): the state ``add`` of each gives. Their opens are
        folded first and the definition is recounted once for them all (``O(branches)``),
        where each open that changed the defining open recounted it (opens of one millisecond
        with ever smaller texts: quadratic)."""
        opens = [record for record in records if record[KIND] == OPEN]
        if len(opens) > 1:
            self._deferred = True
            try:
                for record in opens:
                    self.add(record)
            finally:
                self._deferred = False
            self._redefine()
        elif opens:
            self.add(opens[0])
        for record in records:
            if record[KIND] != OPEN:
                self.add(record)

    def add(self, record: R.Record) -> None:
        """Fold one validated record into the join (any order)."""
        self.messages += 1
        if record[KIND] == OPEN:
            self._add_open(record)
            return
        run = record[RUN_ID]
        if run is not None and (self._receipt_run is None or run < self._receipt_run):
            self._receipt_run = run
        if self._first is None or record[CONTRACT] is not None:
            self._note_receipt(record)
        status = record[R_STATUS]
        if status == "skipped":
            self._add_skip(record)
            return
        name = record[R_BRANCH]
        branches = self.branches
        entry = branches.get(name)
        if entry is not None:
            self._add_receipt(record, name, entry)
            return
        # the first receipt of a branch: the most common message of all. A declared, unpruned
        # branch's contribution is applied inline (what _shift would do), unless its key has a
        # schema to check.
        branches[name] = record
        role = self._fast.get(name)
        if role is not None:
            if status != "ok":  # error or timeout: reported, not ok
                self._n_notok += role
                return
            key = record[R_KEY]
            # _fast is non-empty only while the join is defined, so _defn is set here
            if key not in self._defn.validators:  # type: ignore[union-attr]
                self._n_missing -= role
                if key != name or self._keys is not _NO_MAP:
                    self._write_key(name, Written(key, record[R_VALUE_CANON]))
                # else its own key: it cannot collide while all keys are own keys
                return
        defn = self._defn
        if defn is not None and defn.required is not None:
            self._shift(name, self._contribution(name, None), self._contribution(name, record))
            if name in self.skips and not defn.under.get(name):
                self._n_conflicts -= 1  # its skip's unknown_branch: now one entry with this

    def _write_key(self, name: str, written: Written) -> None:
        """Branch ``name``'s first receipt writes ``written`` (its contribution otherwise
        applied inline by ``add``)."""
        keys = self._keys
        if keys is _NO_MAP:
            keys = self._build_keys(name, None)
        if written.key in keys:
            self._key_entry(written, 1)
        else:
            keys[written.key] = written.canon

    def _note_receipt(self, record: R.Record) -> None:
        """What a receipt says of the join besides its branch: while no open has arrived, the
        earliest event time and opened_at; a contract name not seen before redefines it."""
        if self._first is None:
            t = record[TIME]
            if self.min_event is None or t < self.min_event:
                self.min_event = t
                self._deadline = None
            opened = record[R_OPENED_AT]
            if opened is not None and (self.min_receipt_opened is None or
                                       opened < self.min_receipt_opened):
                self.min_receipt_opened = opened
                self._deadline = None
        if self._note_contract(record[CONTRACT]):
            self._redefine()

    def _note_contract(self, contract: str | None) -> bool:
        """Note the contract a record names; True when it is new (the caller redefines)."""
        if contract is None or contract in self.contract_names:
            return False
        if self.contract_names is _NO_SET:
            self.contract_names = set()
        self.contract_names.add(contract)
        if len(self.contract_names) == 2:
            self._n_conflicts += 1  # contract_conflict
        return True

    def _add_open(self, record: R.Record) -> None:
        redefine = self._note_contract(record[CONTRACT])
        if self.messages == 1 and self._pinned is None:
            # a fresh join's open (the usual first message): define it without the general path
            self._first = record
            defn = self._defn = self.catalog.definition(
                record[CONTRACT], record[O_REQUIRED], record[O_OPTIONAL], record[O_DEADLINE_MS],
                record[O_ALLOW_PARTIAL], record[O_FAIL_FAST])
            if defn.required is not None:
                self._n_missing = len(defn.required)
                self._fast = defn.role
            return
        canon = record[O_CANON]
        if self._opens is _NO_MAP:
            self._opens = self.opens.copy()  # from now on the map is kept
        seen = self._opens.get(canon)
        if seen is None:
            self._opens[canon] = record
            if len(self._opens) == 2:
                self._n_conflicts += 1  # open_conflict
            first = self._first
            if first is None or (record[TIME], canon) < (first[TIME], first[O_CANON]):
                self._first = record
                self._deadline = None
            redefine = True
        else:
            self.duplicates += 1
            self._note_open_run(canon, seen, record[RUN_ID])
            if _earlier(record, seen):
                self._opens[canon] = record
                if self._first is seen:
                    self._first = record
        if redefine and not self._deferred:
            self._redefine()

    def _note_open_run(self, canon: str, seen: R.Record, run: str | None) -> None:
        """A copy of an open seen before: keep the least run_id among its copies."""
        least = self._open_runs.get(canon, seen[RUN_ID])
        if run is not None and (least is None or run < least):
            least = run
        if least is not None:
            if self._open_runs is _NO_MAP:
                self._open_runs = {}
            self._open_runs[canon] = least

    def _add_skip(self, record: R.Record) -> None:
        path = record[R_BRANCH]
        if self.skips is _NO_MAP:
            self.skips = {}
        seen = self.skips.get(path)
        if not _keep_first(self.skips, path, record):
            self.duplicates += 1
            least = self._skip_keys.get(path, seen[R_KEY]) if seen is not None else None
            if least is not None and record[R_KEY] != least:
                if self._skip_keys is _NO_MAP:
                    self._skip_keys = {}
                self._skip_keys[path] = min(least, record[R_KEY])
            return
        defn = self._defn
        if defn is not None and defn.required is not None:
            self._apply_skip(path)

    def _add_receipt(self, record: R.Record, name: str, entry: Entry) -> None:
        """A further receipt of a branch that has one already."""
        attempt = record[R_ATTEMPT]
        content = record[R_CONTENT]
        if not isinstance(entry, Changed):
            top = entry[R_ATTEMPT]
            if attempt == top:
                if content == entry[R_CONTENT]:
                    self.duplicates += 1  # a redelivery: the contribution does not change
                    if _earlier(record, entry):
                        self.branches[name] = record
                    return
                new: Entry = Changed({entry[R_CONTENT]: entry, content: record})
            elif attempt > top:
                self._supersede(name, top, entry[R_CONTENT])
                new = record
            else:
                self._add_lower(name, attempt, content)
                return
        else:
            top = entry.attempt
            if attempt == top:  # one more content, or a copy of one: still duplicate_changed
                if not _keep_first(entry.cand, content, record):
                    self.duplicates += 1
                return
            if attempt < top:
                self._add_lower(name, attempt, content)
                return
            for old_content in entry.cand:
                self._supersede(name, top, old_content)
            new = record
        self.branches[name] = new
        defn = self._defn
        if defn is not None and defn.required is not None:
            self._shift(name, self._contribution(name, entry), self._contribution(name, new))

    def _supersede(self, name: str, attempt: int, content: str) -> None:
        """A group (``attempt``, ``content``) of the branch is below its top attempt."""
        if self._lower is _NO_SET:
            self._lower = set()
        self._lower.add((name, attempt, content))
        self.superseded += 1

    def _add_lower(self, name: str, attempt: int, content: str) -> None:
        """A receipt below the top attempt: a new superseded group, or a duplicate of one."""
        if (name, attempt, content) in self._lower:
            self.duplicates += 1
        else:
            self._supersede(name, attempt, content)

    # ------------------------------------------------------------------ questions
    def defined(self) -> bool:
        return self.definition.required is not None

    def conflict_count(self) -> int:
        """How many conflict entries the close would list (kept as records arrive)."""
        return self._n_conflicts

    def complete(self) -> bool:
        """Every required, unpruned branch has a current ok receipt, and no conflicts."""
        return self._n_missing == 0 and self._n_conflicts == 0

    def all_reported(self) -> bool:
        """Every required, unpruned branch has a current receipt (the fail_fast condition)."""
        return self._n_missing == self._n_notok

    def closable(self) -> bool:
        """Complete, or with ``fail_fast`` all reported: the join may close now."""
        return self.complete() or (self.definition.fail_fast and self.all_reported())

    def opened_at(self) -> int | None:
        if self._pinned is not None:
            return self._pinned[0]
        first = self.defining_open()
        if first is not None:
            opened: int = first[TIME]
            return opened
        if self.min_receipt_opened is not None:
            return self.min_receipt_opened
        return self.min_event

    def deadline(self) -> int | None:
        """``D = opened_at + deadline_s``; None while the join has no records."""
        deadline = self._deadline
        if deadline is None:
            opened = self.opened_at()
            if opened is None:
                return None
            # capped at the last instant of year 9999 (the latest time the outputs can show)
            deadline = self._deadline = min(opened + self.definition.deadline_ms, MAX_MS)
        return deadline

    def run_id(self) -> str | None:
        """The least run_id among the copies of the defining open, else the least among the
        receipts."""
        first = self._first
        if first is not None:
            run = self._open_runs.get(first[O_CANON], first[RUN_ID])
            if run is not None:
                return run
        return self._receipt_run

    @property
    def pruned(self) -> set[str]:
        """Declared branches pruned by skips, under the current definition."""
        return self._pruned

    def skip_key(self, path: str) -> str:
        """The least key among the skips of ``path`` (a skipped path)."""
        least = self._skip_keys.get(path)
        return least if least is not None else str(self.skips[path][R_KEY])

    def reason(self) -> str:
        if self.complete():
            return "complete"
        return "partial" if self.definition.allow_partial else "timeout"

    def join_id(self) -> str:
        """The join's id (every record of a join carries it)."""
        if self._pinned is not None:
            return self._pinned[1]
        if self._first is not None:
            return str(self._first[JOIN_ID])
        for entry in self.branches.values():
            return str(next(iter(top_receipts(entry).values()))[JOIN_ID])
        for record in self.skips.values():
            return str(record[JOIN_ID])
        raise ValueError("an empty join has no id")
