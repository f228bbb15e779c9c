"""Benchmark: memory and time under abusive join shapes.

Usage::

    .venv/bin/python bench/abuse.py [--hot 1000000] [--joins 1000000] [--limit 100000]
                                    [--keep DIR]

Two measurements, each in a fresh child process so that its peak RSS
(``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss`` after it exits) is its own:

- ``hot``: one join receiving ``--hot`` receipts (a looping agent: one branch, same content;
  the second required branch never reports) through the whole bounded pipeline
  (``run_pipeline``, FnApiRunner, default ``max_messages_per_join`` unless ``--limit``).
  Reports wall time (including the file read, excluding writing the input), peak RSS and
  what came out (1 close holding ``limit`` messages, the rest ``join_too_large``). With
  ``--keep DIR`` its input and output files stay in ``DIR`` (emptied first), to compare the
  outputs of two versions (e.g. ``md5sum DIR/out/*/*.jsonl``).
- ``wide``: ``--joins`` distinct joins of open + 1 receipt through the reducer core alone
  (``parse_message`` + ``JoinReducer.add``), all kept alive at once as a stateful runner would
  hold open joins. Reports peak RSS, RSS per open join, and per open join the bytes of its two
  records as the streaming join keeps them in state (``FastPrimitivesCoder``) and pickled
  (a sample of 2,000 joins).

Baseline children (imports only: pipeline with Beam; reducer core) are measured too, so the
table can show RSS above baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

T0 = "2026-01-01T00:00:00.000Z"
CONTRACTS = "contracts:\n  - name: loop\n    required: [a, b]\n    deadline_s: 3600\n"


def _child_baseline(what: str) -> dict[str, Any]:
    if what == "beam":
        import apache_beam  # noqa: F401

        from fanin.pipelines import pipeline  # noqa: F401
    from fanin.contracts import parsing  # noqa: F401
    from fanin.core import reducer  # noqa: F401

    return {}


def _child_hot(receipts: int, limit: int, keep: str = "") -> dict[str, Any]:
    if keep:
        shutil.rmtree(keep, ignore_errors=True)
        os.makedirs(keep)
        return _hot_run(Path(keep), receipts, limit)
    with tempfile.TemporaryDirectory(prefix="fanin-abuse-") as tmp:  # ~430 MB at 1M messages
        return _hot_run(Path(tmp), receipts, limit)


def _hot_run(folder: Path, receipts: int, limit: int) -> dict[str, Any]:
    from fanin.pipelines.pipeline import RunConfig, run_pipeline

    src, contracts = folder / "hot.jsonl", folder / "contracts.yaml"
    contracts.write_text(CONTRACTS)
    with open(src, "w") as fh:
        fh.write(json.dumps({"kind": "open", "join_id": "hot", "opened_at": T0,
                             "contract": "loop"}) + "\n")
        line = json.dumps({"join_id": "hot", "branch": "a", "status": "ok",
                           "event_time": "2026-01-01T00:00:00.001Z", "value": "again"}) + "\n"
        fh.writelines(line for _ in range(receipts))
    start = time.perf_counter()
    run_pipeline(RunConfig(output=str(folder / "out"), inputs=[str(src)],
                           contracts_path=str(contracts), max_messages_per_join=limit), [])
    seconds = time.perf_counter() - start
    counts = {}
    for kind in ("closes", "late", "dead_letter"):
        counts[kind] = sum(len(f.read_bytes().splitlines())
                           for f in (folder / "out" / kind).glob("*.jsonl"))
    close = json.loads(next((folder / "out" / "closes").glob("*.jsonl")).read_text()
                       .splitlines()[0])
    return {"seconds": seconds, "messages": receipts + 1, "close_messages":
            close["counts"]["messages"], **counts}


def _child_wide(joins: int) -> dict[str, Any]:
    import gc

    from fanin.contracts.catalog import Catalog, parse_contracts
    from fanin.contracts.parsing import parse_message
    from fanin.core.reducer import JoinReducer

    catalog = Catalog(parse_contracts(CONTRACTS))
    names = frozenset(catalog.contracts)
    state: dict[str, JoinReducer] = {}
    kept: dict[str, list[Any]] = {}
    sample_every = max(1, joins // 2000)
    start = time.perf_counter()
    for j in range(joins):
        jid = f"join-{j:08d}"
        reducer = JoinReducer(catalog)
        recs = []
        for i, text in enumerate((
                f'{{"kind":"open","join_id":"{jid}","opened_at":"{T0}","contract":"loop"}}',
                f'{{"join_id":"{jid}","branch":"a","status":"ok","event_time":"{T0}",'
                f'"value":{j}}}')):
            record, dead = parse_message(text.encode(), ("x.jsonl", 2 * j + i), names)
            assert dead is None, dead
            reducer.add(record)
            recs.append(record)
        state[jid] = reducer
        if j % sample_every == 0:
            kept[jid] = recs
    seconds = time.perf_counter() - start
    gc.collect()
    sample = list(kept)
    from apache_beam.coders.coders import FastPrimitivesCoder

    coder = FastPrimitivesCoder()  # the streaming join's state coder (bag of records)
    state_bytes = sum(len(coder.encode(r)) for k in sample for r in kept[k]) / len(sample)
    record_bytes = sum(len(pickle.dumps(kept[k], protocol=5)) for k in sample) / len(sample)
    return {"seconds": seconds, "joins": len(state), "state_bytes": state_bytes,
            "pickled_records_bytes": record_bytes}


def _child(kind: str, args: list[str]) -> None:
    result = {"baseline": lambda: _child_baseline(args[0]),
              "hot": lambda: _child_hot(int(args[0]), int(args[1]), *args[2:]),
              "wide": lambda: _child_wide(int(args[0]))}[kind]()
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


def _measure(kind: str, *args: object) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter; returns its JSON line."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, __file__, "--child", kind, *map(str, args)],
                          check=True, capture_output=True, text=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    """Run the measurements and print a table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hot", type=int, default=1_000_000, help="receipts to one join")
    parser.add_argument("--limit", type=int, default=100_000, help="max_messages_per_join")
    parser.add_argument("--joins", type=int, default=1_000_000, help="distinct open joins")
    parser.add_argument("--keep", default="", metavar="DIR",
                        help="keep the hot run's input and outputs in DIR (emptied first)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child[0], args.child[1:])
        return
    beam_base = _measure("baseline", "beam")["peak_rss_mb"]
    b = _measure("baseline", "core")["peak_rss_mb"]
    hot = _measure("hot", args.hot, args.limit, *([os.path.abspath(args.keep)] if args.keep
                                                   else []))
    wide = _measure("wide", args.joins)
    rows = [
        ("baseline: imports of the pipeline (Beam)", "", f"{beam_base:.0f}", ""),
        ("baseline: imports of the reducer core", "", f"{b:.0f}", ""),
        (f"hot: {hot['messages']:,} msgs to 1 join, limit {args.limit:,}",
         f"{hot['seconds']:.1f}", f"{hot['peak_rss_mb']:.0f}",
         f"close holds {hot['close_messages']:,}; join_too_large {hot['dead_letter']:,}; "
         f"{hot['messages'] / hot['seconds']:,.0f} msg/s"),
        (f"wide: {wide['joins']:,} open joins (open + 1 receipt), reducer core",
         f"{wide['seconds']:.1f}", f"{wide['peak_rss_mb']:.0f}",
         f"{(wide['peak_rss_mb'] - b) * 1024 * 1024 / wide['joins']:,.0f} B RSS/join above "
         f"baseline; streaming state (records, coder) {wide['state_bytes']:,.0f} B/join; "
         f"pickled records {wide['pickled_records_bytes']:,.0f} B/join"),
    ]
    print(f"{'measurement':<58} {'time s':>7} {'peak RSS MB':>12}  notes")
    for name, seconds, rss, notes in rows:
        print(f"{name:<58} {seconds:>7} {rss:>12}  {notes}")


if __name__ == "__main__":
    main()
