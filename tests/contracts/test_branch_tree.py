"""``BranchTree``: the declared branches a path covers (docs/spec.md §3), in memory linear in
the names (an index of every prefix took the square of a name's length: 1.75 GB for one
80,000-character path in a 160 KB open)."""

from __future__ import annotations

import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from fanin.contracts.catalog import BranchTree

NAMES = st.frozensets(st.text(alphabet="ab/.0é", min_size=1, max_size=8), max_size=12)


def covered(names: frozenset[str], path: str) -> tuple[str, ...] | None:
    """The rule, written out: ``path`` itself, and every name that continues it with ``/``."""
    found = sorted(n for n in names if n == path or (path and n.startswith(path + "/")))
    return tuple(found) or None


@settings(max_examples=400, deadline=None)
@given(NAMES, st.text(alphabet="ab/.0é", max_size=8))
def test_a_path_covers_itself_and_what_is_below_it(names: frozenset[str], path: str) -> None:
    tree = BranchTree(names)
    assert tree.get(path) == covered(names, path)
    for name in names:  # every declared name and every prefix of one ending before a "/"
        for cut in [len(name), *(i for i, c in enumerate(name) if c == "/")]:
            assert tree.get(name[:cut]) == covered(names, name[:cut])


def test_a_deep_path_takes_memory_linear_in_its_length() -> None:
    name = "/".join(["a"] * 40_000)  # 80,000 characters, 39,999 prefixes
    tracemalloc.start()
    try:
        tree = BranchTree(frozenset({name}))
        assert tree.get("a/a") == (name,) and tree.get(name) == (name,)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000  # the prefix index: ~1.6 GB
