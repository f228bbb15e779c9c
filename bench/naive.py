"""The obvious reducer, for comparison: a join state as a tutorial would write it, fed our records.

Each receipt scans the receipts accepted so far for its key (O(width) per receipt), and
completeness is recomputed from sets on every question; opens just set ``required``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fanin.contracts import records as R

__all__ = ["NaiveJoin"]


@dataclass
class NaiveJoin:
    required: set[str] = field(default_factory=set)
    accepted: dict[str, R.Record] = field(default_factory=dict)
    conflicts: list[str] = field(default_factory=list)

    def add(self, record: R.Record) -> None:
        if record[R.KIND] == R.OPEN:
            self.required = set(record[R.O_REQUIRED] or ())
            return
        branch = record[R.R_BRANCH]
        if branch not in self.required:
            self.conflicts.append(f"unknown branch: {branch}")
            return
        previous = self.accepted.get(branch)
        if previous is not None:
            if previous[R.R_CONTENT] == record[R.R_CONTENT]:
                return
            self.conflicts.append(f"duplicate branch changed: {branch}")
            return
        key = record[R.R_KEY]
        same_key = [r for r in self.accepted.values() if r[R.R_KEY] == key]
        if same_key and any(r[R.R_VALUE] != record[R.R_VALUE] for r in same_key):
            self.conflicts.append(f"conflicting value for key: {key}")
            return
        self.accepted[branch] = record

    def complete(self) -> bool:
        return self.required <= set(self.accepted) and not self.conflicts
