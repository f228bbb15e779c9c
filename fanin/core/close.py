"""The close object of docs/spec.md §5, built from a join's reducer (no Beam import).

``close_object(reducer, closed_at, reason)`` reads the reducer's state (definition, current
receipts, skips, opens, counters) and never changes it.

Guarantees: the object has exactly the fields of docs/spec.md §5 in that order; lists of
branch names are sorted; ``values`` and ``branches`` are sorted by key; conflicts are sorted by
``(kind, branch, key)``; times are RFC 3339 UTC with milliseconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fanin.contracts import records as R
from fanin.contracts.catalog import Definition
from fanin.contracts.timefmt import format_ms
from fanin.core.reducer import Changed, Entry, JoinReducer, top_receipts

__all__ = ["close_object"]

# key -> [(branch, value canon, value)] of the current ok receipts that write it
_Writers = dict[str, list[tuple[str, str, Any]]]


def close_object(reducer: JoinReducer, closed_at: int, reason: str) -> dict[str, Any]:
    """The close object for the records folded into ``reducer``, closed at ``closed_at``."""
    defn = reducer.definition
    if defn.required is None:
        raise ValueError("an undefined join has no close")
    opened, deadline = reducer.opened_at(), reducer.deadline()
    if opened is None or deadline is None:
        raise ValueError("an empty join has no close")
    branches, conflicts, writers = _branch_views(reducer, defn)
    values = _values(writers, conflicts)
    conflicts.extend(_join_conflicts(reducer))
    if len(conflicts) > 1:
        conflicts.sort(key=_conflict_order)
    pruned = reducer.pruned
    missing, failed = _missing_and_failed(defn, pruned, branches)
    return {
        "join_id": reducer.join_id(),
        "contract": defn.contract,
        "run_id": reducer.run_id(),
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
        "values": dict(sorted(values.items())) if len(values) > 1 else values,
        "branches": dict(sorted(branches.items())),
        "conflicts": conflicts,
        "counts": {"messages": reducer.messages,
                   "duplicates": reducer.duplicates,
                   "superseded": reducer.superseded},
    }


def _branch_views(reducer: JoinReducer, defn: Definition
                  ) -> tuple[dict[str, Any], list[dict[str, Any]], _Writers]:
    """Views of the current receipts and pruning skips, the branch-level conflicts, and the
    writers of each key."""
    pruned, role, validators = reducer.pruned, defn.role, defn.validators
    views: dict[str, Any] = {}
    conflicts: list[dict[str, Any]] = []
    writers: _Writers = {}
    for name, entry in reducer.branches.items():
        if isinstance(entry, Changed) or name not in role or name in pruned:
            conflicts.append(_branch_conflict(name, entry, role, pruned))
            continue
        key = entry[R.R_KEY]
        views[name] = _receipt_view(entry)
        if entry[R.R_STATUS] != "ok":
            continue
        validator = validators.get(key) if validators else None
        problem = validator and reducer.violation(entry, validator)
        if problem:
            conflicts.append({"kind": "schema_violation", "branch": name, "key": key,
                              "detail": problem})
        writers.setdefault(key, []).append((name, entry[R.R_VALUE_CANON], entry[R.R_VALUE]))
    for path, record in reducer.skips.items():
        if defn.under.get(path):
            views[path] = _receipt_view(record)
        elif path in reducer.branches:  # reported too (undeclared): one entry per branch
            reported = next(c for c in conflicts
                            if c["kind"] == "unknown_branch" and c["branch"] == path)
            reported["key"] = min(reported["key"], reducer.skip_key(path))
        else:
            conflicts.append({"kind": "unknown_branch", "branch": path,
                              "key": reducer.skip_key(path)})
    return views, conflicts, writers


def _values(writers: _Writers, conflicts: list[dict[str, Any]]) -> dict[str, Any]:
    """``values`` of the close; appends the key conflicts to ``conflicts``."""
    values: dict[str, Any] = {}
    conflicted = {c["branch"] for c in conflicts}
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
            continue
        clean = [(name, value) for name, _, value in entries if name not in conflicted]
        if clean:  # JSON-equal values: the least branch's spelling (1 or 1.0)
            values[key] = min(clean, key=lambda item: item[0])[1]
    return values


def _join_conflicts(reducer: JoinReducer) -> list[dict[str, Any]]:
    """``open_conflict`` and ``contract_conflict``, where the join has them."""
    found: list[dict[str, Any]] = []
    if len(reducer.opens) > 1:
        found.append({"kind": "open_conflict", "branch": None, "key": None,
                      "count": len(reducer.opens)})
    if len(reducer.contract_names) > 1:
        found.append({"kind": "contract_conflict", "branch": None, "key": None,
                      "contracts": sorted(reducer.contract_names)})
    return found


def _missing_and_failed(defn: Definition, pruned: set[str],
                        views: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Required, unpruned branches without a current receipt, and those whose current receipt
    is ``error`` or ``timeout``; both sorted."""
    missing, failed = [], []
    live = defn.required_sorted if not pruned else \
        sorted((defn.required or frozenset()) - pruned)
    for name in live:
        view = views.get(name)
        if view is None:
            missing.append(name)
        elif view["status"] in ("error", "timeout"):
            failed.append(name)
    return missing, failed


def _branch_conflict(name: str, entry: Entry, role: Mapping[str, int],
                     pruned: set[str]) -> dict[str, Any]:
    """The conflict entry of a branch with no current receipt to show."""
    top = top_receipts(entry)
    kind = "unknown_branch" if name not in role else \
        "pruned_branch_reported" if name in pruned else "duplicate_changed"
    conflict = {"kind": kind, "branch": name, "key": min(r[R.R_KEY] for r in top.values())}
    if kind == "duplicate_changed":
        conflict["attempt"] = next(iter(top.values()))[R.R_ATTEMPT]
    return conflict


def _conflict_order(conflict: dict[str, Any]) -> tuple[str, str, str]:
    return (conflict["kind"], conflict["branch"] or "", conflict["key"] or "")


def _receipt_view(record: R.Record) -> dict[str, Any]:
    return {"status": record[R.R_STATUS], "key": record[R.R_KEY],
            "attempt": record[R.R_ATTEMPT], "event_time": format_ms(record[R.TIME]),
            "value": record[R.R_VALUE], "error": record[R.R_ERROR]}
