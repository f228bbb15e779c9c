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
  nothing; ``pruned_branch_reported``; per branch the highest attempt wins and lower attempts
  are ``superseded``; identical content again is a ``duplicate``, different content at the top
  attempt is ``duplicate_changed`` (and the branch has no current receipt); ``key_conflict`` by
  JSON equality, one entry per branch involved; ``schema_violation`` against the contract's
  JSON Schema for the key; ``open_conflict`` and ``contract_conflict``.

Choices stated in docs/spec.md §3:
- Receipts are grouped per branch by ``(attempt, content)``; a second receipt in a group is a
  duplicate (also below the top attempt, so a redelivered superseded receipt is a duplicate);
  ``superseded`` counts the distinct groups below the top attempt.
- The current receipt of a branch is the earliest (event time, message_id) of its group.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
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

_NONE = (0, 0, 0, None)


class _EmptyMap(dict):  # type: ignore[type-arg]
    """The shared empty map of joins that never skip, retry or the like: read-only, and pickled
    as a reference to the one instance, so identity tests (``is _NO_MAP``) survive a pickle."""

    def _read_only(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("the shared empty map is read-only; replace it before writing")

    __setitem__ = __delitem__ = setdefault = update = pop = popitem = clear = _read_only

    def __reduce__(self) -> str:
        return "_NO_MAP"


class _EmptySet(frozenset):  # type: ignore[type-arg]
    """The shared empty set (see ``_EmptyMap``); pickled as a reference to the one instance."""

    def __reduce__(self) -> str:
        return "_NO_SET"


# Shared read-only empties: most joins never skip, retry, name a contract or prune; a real
# container replaces the sentinel on first write (fewer allocations = less GC work per join).
_NO_MAP: Any = _EmptyMap()
_NO_SET: frozenset[Any] = _EmptySet()


def _earlier(a: R.Record, b: R.Record) -> bool:
    """Deterministic "first" among records of identical content: (event time, message_id,
    run_id, text)."""
    ta, tb = a[TIME], b[TIME]
    if ta != tb:  # the usual answers first, without building the full comparison
        return ta < tb
    if a[RAW] == b[RAW]:  # the same text (a redelivery): the same message, not earlier
        return False
    return (a[MESSAGE_ID] or "", a[RUN_ID] or "", a[RAW]) < \
        (b[MESSAGE_ID] or "", b[RUN_ID] or "", b[RAW])


def _keep_first(mapping: dict[str, R.Record], key: str, record: R.Record) -> bool:
    """Store ``record`` under ``key``, keeping the earliest copy; True if the key was new."""
    seen = mapping.get(key)
    if seen is None:
        mapping[key] = record
        return True
    if _earlier(record, seen):
        mapping[key] = record
    return False


class _Changed:
    """A branch whose top attempt has several distinct contents (``duplicate_changed``).

    ``cand``: content -> the first record of that content, all at the same attempt. A branch
    with one content at its top attempt is stored as that bare record instead.
    """

    __slots__ = ("cand",)

    def __init__(self, cand: dict[str, R.Record]) -> None:
        self.cand = cand

    @property
    def attempt(self) -> int:
        return next(iter(self.cand.values()))[R_ATTEMPT]


Entry = R.Record | _Changed
Contribution = tuple[int, int, int, Any]


class JoinReducer:
    """Order-independent state of one join; see the module docstring for the guarantees.

    What is kept: ``branches`` (branch -> its top-attempt entry: the bare first record of its
    one content, or ``_Changed``), ``skips`` (path -> first skip), the distinct opens, the
    ``(branch, attempt, content)`` groups below each branch's top attempt, and counters.
    Each branch's *contribution* ``(missing, not ok, conflicts, (key, value canon) or
    None)`` is a pure function of the definition, the pruned set and its entry; when one of
    those changes, the old contribution is taken out of the counters and the new one put in.
    """

    # Fixed slots (no per-instance dict); containers most joins never need start as shared
    # read-only sentinels and are created on first write (fewer allocations, less GC work).
    __slots__ = ("_deadline", "_defn", "_fast", "_first", "_keys", "_lower", "_n_conflicts",
                 "_n_missing", "_n_notok", "_open_runs", "_opens", "_pinned", "_pruned",
                 "_receipt_run", "_skip_keys", "_violations", "branches", "catalog",
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
        # key -> value canon (one writer) or [writers, {value canon: writers}], for key
        # conflicts. Left empty (the shared sentinel) while every key written is its writer's own
        # branch name: such keys cannot collide. Built by _build_keys at the first other key.
        self._keys: dict[str, Any] = _NO_MAP
        # declared, unpruned branch -> role (1 required, 0 optional) while the join is
        # defined, for the inline first-receipt path of ``add``; empty otherwise
        self._fast: Mapping[str, int] = _NO_MAP
        self._violations: dict[str, str | None] = _NO_MAP  # content -> schema error (cache)
        # (opened_at, join_id) of a definition fixed by ``pin``; None: derived from the records
        # run ids: the least among the receipts, and per distinct open the least of its copies
        self._receipt_run: str | None = None
        self._open_runs: dict[str, str] = _NO_MAP
        # skipped path -> the least key among its skips, where a later skip had a lesser key
        self._skip_keys: dict[str, str] = _NO_MAP
        self._pinned: tuple[int, str] | None = None

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

    # What a pickle keeps: the records and counts. The definition (its schema validators do not
    # pickle) and everything derived from it are resolved again from the catalog on unpickling.
    _PICKLED = ("catalog", "branches", "skips", "messages", "duplicates", "superseded",
                "_first", "_opens", "contract_names", "min_event", "min_receipt_opened", "_lower")

    def __getstate__(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._PICKLED}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["catalog"])  # type: ignore[misc]
        for name, value in state.items():
            setattr(self, name, value)
        if self.messages:
            self._redefine()

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
        if any(new[3] is not None and new[3][0] != name for name, _, new in shifts):
            self._keys = {}  # built up by the shifts below
        for name, old, new in shifts:
            self._shift(name, old, new)
        for path in self.skips:
            self._apply_skip(path)

    @property
    def definition(self) -> Definition:
        if self._defn is None:
            self._redefine()
            assert self._defn is not None
        return self._defn

    # ------------------------------------------------------------------ derived counters
    def _contribution(self, name: str, entry: Entry | None) -> Contribution:
        """What branch ``name`` with ``entry`` (None: no receipt) adds to the counters."""
        defn = self._defn
        assert defn is not None and defn.required is not None
        required = defn.role.get(name)
        if required is None or name in self._pruned:  # unknown, or pruned
            return (0, 0, 1, None) if entry is not None else _NONE
        if entry is None:
            return (required, 0, 0, None)
        if type(entry) is _Changed:
            return (required, 0, 1, None)
        if entry[R_STATUS] != "ok":
            return (required, required, 0, None)
        validator = defn.validators.get(entry[R_KEY]) if defn.validators else None
        bad = 1 if validator is not None and self._violation(entry, validator) else 0
        return (0, 0, bad, (entry[R_KEY], entry[R_VALUE_CANON]))

    def _violation(self, record: R.Record, validator: Any) -> str | None:
        """The schema error of an ok value, or None; cached per content."""
        content = record[R_CONTENT]
        cache = self._violations
        if content in cache:
            return cache[content]
        error = next(iter(validator.iter_errors(record[R_VALUE])), None)
        problem = None if error is None else error.message[:500]
        if cache is _NO_MAP:
            cache = self._violations = {}
        cache[content] = problem
        return problem

    def _shift(self, name: str, old: Contribution, new: Contribution) -> None:
        """Replace branch ``name``'s contribution ``old`` by ``new`` in the counters."""
        if old == new:
            return
        self._n_missing += new[0] - old[0]
        self._n_notok += new[1] - old[1]
        self._n_conflicts += new[2] - old[2]
        was, now = old[3], new[3]
        if was != now:
            if self._keys is _NO_MAP:
                if (was is None or was[0] == name) and (now is None or now[0] == name):
                    return  # own keys only: nothing to track
                self._build_keys(name, was)
            if was is not None:
                self._key_entry(was, -1)
            if now is not None:
                self._key_entry(now, 1)

    def _build_keys(self, name: str, entry: tuple[str, str] | None) -> dict[str, Any]:
        """Build the key map from the contributions in the counters (all own keys, so all
        distinct); ``entry`` is ``name``'s, whose branch entry may already be its next one."""
        keys: dict[str, Any] = {}
        for other, branch in self.branches.items():
            written = entry if other == name else self._contribution(other, branch)[3]
            if written is not None:
                keys[written[0]] = written[1]
        self._keys = keys
        return keys

    def _key_entry(self, entry: tuple[str, str], delta: int) -> None:
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
            del keys[key]

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
                entry = self.branches.get(name)
                old = self._contribution(name, entry)
                if self._pruned is _NO_SET:
                    self._pruned = set()
                    self._fast = dict(self._fast)  # the definition's map is shared
                self._pruned.add(name)
                self._fast.pop(name, None)
                self._shift(name, old, self._contribution(name, entry))

    # ------------------------------------------------------------------ folding
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
            if key not in self._defn.validators:  # type: ignore[union-attr]
                self._n_missing -= role
                keys = self._keys
                if keys is _NO_MAP:
                    if key == name:
                        return  # its own key: cannot collide while all keys are own keys
                    keys = self._build_keys(name, None)
                if key in keys:
                    self._key_entry((key, record[R_VALUE_CANON]), 1)
                else:
                    keys[key] = record[R_VALUE_CANON]
                return
        defn = self._defn
        if defn is not None and defn.required is not None:
            self._shift(name, self._contribution(name, None), self._contribution(name, record))

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
        run = record[RUN_ID]
        if run is not None:
            canon = record[O_CANON]
            if self._open_runs is _NO_MAP:
                self._open_runs = {}
            if canon not in self._open_runs or run < self._open_runs[canon]:
                self._open_runs[canon] = run
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
        if type(entry) is tuple:
            top = entry[R_ATTEMPT]
            if attempt == top:
                if content == entry[R_CONTENT]:
                    self.duplicates += 1  # a redelivery: the contribution does not change
                    if _earlier(record, entry):
                        self.branches[name] = record
                    return
                new: Entry = _Changed({entry[R_CONTENT]: entry, content: record})
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
    def is_empty(self) -> bool:
        return self.messages == 0

    def defined(self) -> bool:
        return self.definition.required is not None

    def conflict_count(self) -> int:
        """How many conflict entries the close would list."""
        return self._n_conflicts

    def complete(self) -> bool:
        """Every required, unpruned branch has a current ok receipt, and no conflicts."""
        return self._n_missing == 0 and self._n_conflicts == 0

    def all_reported(self) -> bool:
        """Every required, unpruned branch has a current receipt (the fail_fast condition)."""
        return self._n_missing == self._n_notok

    def closable(self) -> bool:
        """Complete, or with ``fail_fast`` all reported: the join may close now."""
        if self._n_missing == 0 and self._n_conflicts == 0:
            return True
        return self._n_missing == self._n_notok and self.definition.fail_fast

    def opened_at(self) -> int | None:
        if self._pinned is not None:
            return self._pinned[0]
        first = self.defining_open()
        if first is not None:
            return first[TIME]
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
            run = self._open_runs.get(first[O_CANON])
            if run is not None:
                return run
        return self._receipt_run

    def _kept_records(self) -> Iterator[R.Record]:
        """The distinct opens, first skips and top-attempt candidates (what a close shows)."""
        yield from self.opens.values()
        yield from self.skips.values()
        for entry in self.branches.values():
            yield from _candidates(entry).values()

    def reason(self) -> str:
        if self.complete():
            return "complete"
        return "partial" if self.definition.allow_partial else "timeout"

    # ------------------------------------------------------------------ the close
    def close(self, closed_at: int, reason: str) -> dict[str, Any]:
        """The close object of docs/spec.md §5 for the records folded so far."""
        defn = self.definition
        required = defn.required
        assert required is not None, "an undefined join has no close"
        pruned, role, validators = self._pruned, defn.role, defn.validators
        branches_out: dict[str, Any] = {}
        conflicts: list[dict[str, Any]] = []
        # key -> [(branch, value canon, value)] of current ok receipts
        writers: dict[str, list[tuple[str, str, Any]]] = {}
        for name, record in self.branches.items():
            if type(record) is _Changed or name not in role or name in pruned:
                conflicts.append(_branch_conflict(name, record, role, pruned))
                continue
            key = record[R_KEY]
            branches_out[name] = _receipt_view(record)
            if record[R_STATUS] == "ok":
                validator = validators.get(key) if validators else None
                problem = validator and self._violation(record, validator)
                if problem:
                    conflicts.append({"kind": "schema_violation", "branch": name, "key": key,
                                      "detail": problem})
                entry = (name, record[R_VALUE_CANON], record[R_VALUE])
                same_key = writers.get(key)
                if same_key is None:
                    writers[key] = [entry]
                else:
                    same_key.append(entry)
        for path, record in self.skips.items():
            if defn.under.get(path):
                branches_out[path] = _receipt_view(record)
            else:
                conflicts.append({"kind": "unknown_branch", "branch": path,
                                  "key": self._skip_keys.get(path, record[R_KEY])})
        values = self._values(writers, conflicts)
        if len(self._opens) > 1:
            conflicts.append({"kind": "open_conflict", "branch": None, "key": None,
                              "count": len(self._opens)})
        if len(self.contract_names) > 1:
            conflicts.append({"kind": "contract_conflict", "branch": None, "key": None,
                              "contracts": sorted(self.contract_names)})
        missing, failed = [], []
        for name in (defn.required_sorted if not pruned else sorted(required - pruned)):
            view = branches_out.get(name)
            if view is None:
                missing.append(name)
            elif view["status"] in ("error", "timeout"):
                failed.append(name)
        if len(conflicts) > 1:
            conflicts.sort(key=_conflict_order)
        opened = self.opened_at()
        assert opened is not None
        return {
            "join_id": self._join_id(),
            "contract": defn.contract,
            "run_id": self.run_id(),
            "reason": reason,
            "opened_at": format_ms(opened),
            "deadline": format_ms(self.deadline()),  # type: ignore[arg-type]
            "closed_at": format_ms(closed_at),
            "latency_ms": closed_at - opened,
            "required": list(defn.required_sorted),
            "optional": list(defn.optional_sorted),
            "pruned": sorted(pruned),
            "missing": missing,
            "failed": failed,
            "values": dict(sorted(values.items())) if len(values) > 1 else values,
            "branches": dict(sorted(branches_out.items())),
            "conflicts": conflicts,
            "counts": {"messages": self.messages,
                       "duplicates": self.duplicates,
                       "superseded": self.superseded},
        }

    @staticmethod
    def _values(writers: dict[str, list[tuple[str, str, Any]]],
                conflicts: list[dict[str, Any]]) -> dict[str, Any]:
        """``values`` of the close; appends the key conflicts to ``conflicts``."""
        values: dict[str, Any] = {}
        conflicted = {c["branch"] for c in conflicts} if conflicts else _NO_SET
        for key, entries in writers.items():
            if len(entries) == 1:  # one writer: its value, unless its branch is in conflict
                name, _, value = entries[0]
                if name not in conflicted:
                    values[key] = value
                continue
            if len({canon for _, canon, _ in entries}) > 1:
                for name, _, value in entries:
                    conflicts.append({"kind": "key_conflict", "branch": name, "key": key,
                                      "value": value})
            else:
                clean = [(name, value) for name, _, value in entries if name not in conflicted]
                if clean:  # JSON-equal values: the least branch's spelling (1 or 1.0)
                    values[key] = min(clean, key=lambda item: item[0])[1]
        return values

    def _join_id(self) -> str:
        if self._pinned is not None:
            return self._pinned[1]
        if self._first is not None:
            return self._first[JOIN_ID]
        for record in self._kept_records():  # every record of a join carries its join_id
            return record[JOIN_ID]
        raise ValueError("empty join")


def _branch_conflict(name: str, entry: Entry, role: Mapping[str, int],
                     pruned: set[str]) -> dict[str, Any]:
    """The conflict entry of a branch with no current receipt to show."""
    cand = _candidates(entry)
    kind = "unknown_branch" if name not in role else \
        "pruned_branch_reported" if name in pruned else "duplicate_changed"
    conflict = {"kind": kind, "branch": name, "key": min(r[R_KEY] for r in cand.values())}
    if kind == "duplicate_changed":
        conflict["attempt"] = next(iter(cand.values()))[R_ATTEMPT]
    return conflict


def _conflict_order(conflict: dict[str, Any]) -> tuple[str, str, str]:
    return (conflict["kind"], conflict["branch"] or "", conflict["key"] or "")


def _candidates(entry: Entry) -> dict[str, R.Record]:
    """content -> record at the top attempt, for either form of a branch entry."""
    if type(entry) is _Changed:
        return entry.cand
    return {entry[R_CONTENT]: entry}


def _receipt_view(record: R.Record) -> dict[str, Any]:
    return {"status": record[R_STATUS], "key": record[R_KEY],
            "attempt": record[R_ATTEMPT], "event_time": format_ms(record[TIME]),
            "value": record[R_VALUE], "error": record[R_ERROR]}
