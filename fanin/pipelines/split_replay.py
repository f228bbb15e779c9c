"""A replay split across processes (``fanin run --replay`` on the local streaming runner).

The local streaming runner (``BundleBasedDirectRunner``) runs a job on one thread, and its
cost grows with every join it holds (a state copy per bundle that touches a join, a scan of
every join's timers between bundles: docs/performance.md). A replay's joins are
independent of each other: what a join does depends on its own lines and on where the
watermark stands when each arrives. So a replay can run as several jobs, each replaying the
joins of one partition (``fanin.transforms.replay.partition_of``: by join id; the lines the
join does not take, in partition 0) with the very same watermark moves, planned once from
every line.

Lifecycle: ``SplitReplay(replay, token, run_part, processes)`` holds a plan of ``processes``
partitions. ``start()`` forks ``processes - 1`` helpers (``fanin.transforms.forked_helpers``)
from this process, each of which runs ``run_part(i)`` for one partition ``i >= 1`` (a job of
its own, built after the fork); this process runs partition 0 meanwhile (its own job);
``finish()`` waits for the helpers, runs here the partitions whose helper failed (logged, a
warning), and finalizes the outputs: each output's temporary files, spilled by every job
(``WriteOutput(finalize=False)``) and merged by it into one per shard, merged into its files
as one job's finalize step makes them (an ``OSError`` there is named as that step's).
``close()`` ends the helpers (a run that stops: a helper at work is killed).

Guarantees:
- The outputs are the files a replay in one process writes, byte for byte: each join's
  lines reach it in the same events with the same watermark moves, its timers fire at the
  same watermarks, and the files' lines are sorted (``fanin.transforms.write``).
- Each partition is replayed exactly once to its end: by its helper, or here when the helper
  failed (its temporary files are not used, and are deleted with the rest).
- A partition's helper shares this process's plan by the fork (nothing is sent to it but its
  number); it ignores Ctrl-C (this process decides) and dies with this process.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence

from fanin.transforms.forked_helpers import Helpers
from fanin.transforms.replay import Replay
from fanin.transforms.write import finalize_spills, merged_spills, spilled_in_this_process

__all__ = ["Output", "SplitReplay"]

_LOG = logging.getLogger("fanin")

# ``(folder, kind, formats)`` of one output of the job
Output = tuple[str, str, Sequence[str]]
# A partition's job can run for as long as the replay: a helper is never given up on for
# taking long (a week), only for failing
_PATIENCE_S = 7 * 24 * 3600.0


class SplitReplay:
    """A replay of ``replay.partitions`` partitions, each a job run by ``run_part`` (see the
    module's docstring); ``outputs``: the job's outputs, written with ``token``."""

    def __init__(self, replay: Replay, token: str, outputs: Sequence[Output],
                 run_part: Callable[[int], None]) -> None:
        if replay.partitions < 2:
            raise ValueError("a split replay has 2 partitions or more")
        self.replay, self.token = replay, token
        self._outputs = list(outputs)
        self._run_part = run_part
        self._helpers: Helpers[int, list[tuple[str, int, str]]] | None = None

    def _part_in_helper(self, partition: int) -> list[tuple[str, int, str]]:
        """A helper's work: partition ``partition`` replayed; its temporary files."""
        self._run_part(partition)
        return self._spilled()

    def _spilled(self) -> list[tuple[str, int, str]]:
        """The temporary files ``(folder, shard, path)`` this process's jobs spilled, a file
        per output and shard (``merged_spills``)."""
        spilled: list[tuple[str, int, str]] = []
        for folder, kind, _ in self._outputs:
            with _as_finalize_step(kind):
                spilled += [(folder, shard, path) for shard, path in merged_spills(
                    folder, kind, self.token, spilled_in_this_process(self.token, folder))]
        return spilled

    def start(self) -> None:
        """Fork the helpers, one per partition but 0, each replaying its partition."""
        helpers = self._helpers = Helpers(self._part_in_helper, self.replay.partitions - 1,
                                          patience_s=_PATIENCE_S)
        for partition in range(1, self.replay.partitions):
            helpers.submit(partition, partition)

    def finish(self) -> list[str]:
        """After partition 0's job here: wait for the helpers, replay here what they failed
        to, then write the output files; their paths."""
        if self._helpers is None:
            raise RuntimeError("finish() before start()")
        spilled = self._spilled()
        done = self._helpers.finished(wait=True)
        self._helpers.close()
        for reason in self._helpers.failures:
            _LOG.warning("fanin: a process of the split replay failed (%s); this process "
                         "replays its joins itself", reason)
        for partition, _, result in sorted(done):
            if result is None:
                self._run_part(partition)
                spilled += self._spilled()
            else:
                spilled += result
        written: list[str] = []
        for folder, kind, formats in self._outputs:
            with _as_finalize_step(kind):
                written += finalize_spills(folder, kind, formats, self.token,
                                           [(shard, path) for where, shard, path in spilled
                                            if where == folder])
        return written

    def close(self) -> None:
        """End the helpers (killed if still at work)."""
        if self._helpers is not None:
            self._helpers.close()


@contextlib.contextmanager
def _as_finalize_step(kind: str) -> Iterator[None]:
    """An ``OSError`` of the files' merge, named as one job's finalize step fails (``[while
    running 'Write/<kind>/Finalize']``, as Beam's local runner names a failed step): one
    line from ``fanin run``, as in one process."""
    try:
        yield
    except OSError as exc:
        raise OSError(f"{exc} [while running 'Write/{kind}/Finalize']") from exc
