"""The streaming floor, as a whole program: what ``fanin run --replay`` is measured against on
each runner (``bench/pipeline.py``, part ``headline``).

Fanin's replay of a file (``replay_of``, no disorder; it parses the lines as it reads them),
then the least stateful join there is: per join_id a bag of its records and one event-time
timer 30 s after its latest message, which counts the bag and clears it. No closing decision,
no late or dead-letter handling, no output files: the difference to ``fanin run --replay`` is
the join's own work and its writes. Its job runs under the garbage-collector thresholds
``fanin run`` runs its job under (``collector_for_run``, around the run only, as there).

Usage: ``python bench/floor_join.py --input FILE [--contracts FILE] [Beam options]``
(default runner: BundleBasedDirectRunner, the local streaming runner of ``fanin run``;
``--runner=FlinkRunner`` gets the job server jar of ``fanin setup flink``, as ``fanin run``
does).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
from apache_beam.coders import coders
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import userstate
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.utils.timestamp import Duration

from fanin.contracts import records as R
from fanin.contracts.catalog import Catalog, load_contracts
from fanin.pipelines.collector import collector_for_run
from fanin.pipelines.pipeline import replay_of
from fanin.runners.toolchain import with_local_job_server
from fanin.transforms.read import numbered_lines

__all__ = ["FloorStateFn", "floor_replay"]

_MSGS = userstate.BagStateSpec("msgs", coders.FastPrimitivesCoder())
_WAKE = userstate.TimerSpec("wake", TimeDomain.WATERMARK)
_MSGS_PARAM = beam.DoFn.StateParam(_MSGS)
_WAKE_PARAM = beam.DoFn.TimerParam(_WAKE)


class FloorStateFn(beam.DoFn):
    """Appends each record to its join's bag and (re)sets one event-time timer 30 s later;
    the timer yields the bag's size and clears it."""

    def process(self, element: tuple[str, R.Record],
                stamp: Any = beam.DoFn.TimestampParam,
                msgs: Any = _MSGS_PARAM,
                wake: Any = _WAKE_PARAM) -> Iterator[int]:
        msgs.add(element[1])
        wake.set(stamp + Duration(seconds=30))
        return iter(())

    @userstate.on_timer(_WAKE)
    def on_wake(self, msgs: Any = _MSGS_PARAM) -> Iterator[int]:
        count = sum(1 for _ in msgs.read())
        msgs.clear()
        yield count


def floor_replay(p: beam.Pipeline, path: str, catalog: Catalog) -> beam.PCollection:
    """Adds the floor to ``p``: the replay of ``path``, its parse, the bag-and-timer join."""
    records = (p | "Read" >> replay_of(numbered_lines(path), catalog, 0.0)).records
    return records | "State" >> beam.ParDo(FloorStateFn()).with_input_types(tuple[str, tuple])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="streaming floor: replay, parse, bag + timer")
    parser.add_argument("--input", required=True)
    parser.add_argument("--contracts", help="YAML contracts (their names are checked)")
    args, beam_args = parser.parse_known_args(argv)
    if not any(arg.startswith("--runner") for arg in beam_args):
        beam_args.append("--runner=BundleBasedDirectRunner")
    options = PipelineOptions([*with_local_job_server(beam_args), "--streaming"])
    catalog = Catalog(load_contracts(args.contracts) if args.contracts else {})
    p = beam.Pipeline(options=options)
    floor_replay(p, args.input, catalog)
    with collector_for_run():
        p.run().wait_until_finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
