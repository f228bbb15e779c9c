"""Helper processes forked to apply one function to batches (fanin.transforms.forked_helpers):
every batch comes back exactly once, with its result or marked undone when its helper failed;
a failed helper takes no more batches; nothing is forked before the first batch; helpers
ignore Ctrl-C and are gone once closed."""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.child_env import same_code_env

from fanin.transforms.forked_helpers import Helpers, in_order


def _pid_and_sum(batch: list[int]) -> tuple[int, int]:
    return os.getpid(), sum(batch)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_every_batch_comes_back_once_with_its_result_from_another_process() -> None:
    helpers: Helpers[list[int], tuple[int, int]] = Helpers(_pid_and_sum, 2)
    assert not helpers.forked and helpers.idle()
    batches = [list(range(n)) for n in range(1, 7)]
    done: list[tuple[Any, list[int], tuple[int, int] | None]] = []
    for n, batch in enumerate(batches):
        if not helpers.idle():
            done += helpers.finished(wait=True)
        helpers.submit(batch, keep=n)
    done += helpers.finished(wait=True)
    helpers.close()
    assert sorted(keep for keep, _, _ in done) == list(range(6))
    for keep, batch, result in done:
        assert batch == batches[keep]
        assert result is not None and result[1] == sum(batch)
    pids = {result[0] for _, _, result in done if result is not None}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2
    assert all(_gone(pid) for pid in pids)  # closed: exited and reaped


def _dies_on_negative(batch: list[int]) -> int:
    if batch[0] < 0:
        os._exit(3)
    return sum(batch)


def _raises_on_negative(batch: list[int]) -> int:
    if batch[0] < 0:
        raise RuntimeError("bad batch")
    return sum(batch)


def _unmarshallable_on_negative(batch: list[int]) -> Any:
    return object() if batch[0] < 0 else sum(batch)


def _hangs_on_negative(batch: list[int]) -> int:
    if batch[0] < 0:
        signal.pause()  # a hang: only a signal ends it
    return sum(batch)


@pytest.mark.parametrize("work, reason", [
    (_dies_on_negative, "it exited with status 3"),
    (_raises_on_negative, "RuntimeError: bad batch"),
    (_unmarshallable_on_negative, "ValueError: unmarshallable object"),
    (_hangs_on_negative, "it did not answer within 0.5 s (killed)"),
])
def test_a_helper_that_fails_returns_its_batch_undone_and_takes_no_more(
        work: Any, reason: str) -> None:
    helpers: Helpers[list[int], int] = Helpers(work, 1, patience_s=0.5)
    helpers.submit([1, 2])
    assert helpers.finished(wait=True) == [(None, [1, 2], 3)]
    helpers.submit([-1, 5], keep="k")
    assert helpers.finished(wait=True) == [("k", [-1, 5], None)]
    assert helpers.failures == [reason]
    assert not helpers.idle() and helpers.holding == 0  # its only helper failed
    assert helpers.finished(wait=True) == []
    helpers.close()


def test_finished_without_waiting_returns_only_what_is_done() -> None:
    helpers: Helpers[list[int], tuple[int, int]] = Helpers(_pid_and_sum, 1)
    assert helpers.finished() == []
    helpers.submit([4])
    assert helpers.holding == 1 and not helpers.idle()
    ((_, batch, result),) = helpers.finished(wait=True)
    assert batch == [4] and result is not None and result[1] == 4
    assert helpers.holding == 0 and helpers.idle()
    helpers.close()


def test_a_helper_ignores_ctrl_c_and_goes_on() -> None:
    helpers: Helpers[list[int], tuple[int, int]] = Helpers(_pid_and_sum, 1)
    helpers.submit([1])
    ((_, _, first),) = helpers.finished(wait=True)
    assert first is not None
    os.kill(first[0], signal.SIGINT)
    helpers.submit([2])
    ((_, _, second),) = helpers.finished(wait=True)
    assert second == (first[0], 2)
    helpers.close()
    assert _gone(first[0])


def test_count_must_be_positive() -> None:
    with pytest.raises(ValueError, match="count"):
        Helpers(_pid_and_sum, 0)


def test_a_helper_holds_none_of_its_parents_files_or_their_locks(tmp_path: Path) -> None:
    """The output folder's lock (flock) ends when the parent lets it go, helpers alive."""
    path = tmp_path / "lock"
    held = os.open(path, os.O_CREAT | os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    helpers: Helpers[list[int], tuple[int, int]] = Helpers(_pid_and_sum, 1)
    helpers.submit([1])
    ((_, _, result),) = helpers.finished(wait=True)
    assert result is not None and not _gone(result[0])
    os.close(held)
    again = os.open(path, os.O_RDWR)
    fcntl.flock(again, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raised BlockingIOError if inherited
    os.close(again)
    helpers.close()


def test_a_batch_marshal_refuses_comes_back_undone_and_the_helper_stays_free() -> None:
    helpers: Helpers[list[Any], tuple[int, int]] = Helpers(_pid_and_sum, 1)
    odd = [object()]
    helpers.submit(odd, keep="odd")
    assert helpers.holding == 1 and helpers.idle()
    assert helpers.finished() == [("odd", odd, None)]
    assert helpers.failures == ["a batch could not be sent: unmarshallable object"]
    helpers.submit([2, 3])
    ((_, _, result),) = helpers.finished(wait=True)
    assert result is not None and result[1] == 5
    helpers.close()


_GRPC_PROBE = """
import json
from concurrent import futures
import grpc
from fanin.transforms.forked_helpers import Helpers, in_order

def add(batch):
    return sum(batch)

server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
channel = grpc.insecure_channel(f"127.0.0.1:{port}")
grpc.channel_ready_future(channel).result(timeout=30)
rounds = []
for n in range(8):
    helpers = Helpers(add, 2, patience_s=30)
    helpers.submit([n, 1], keep="a")
    helpers.submit([n, 2], keep="b")
    done = helpers.finished(wait=True)
    rounds.append({"done": sorted([keep, batch, result] for keep, batch, result in done),
                   "failures": helpers.failures})
    helpers.close()
server.stop(None)
print(json.dumps(rounds))
"""


def test_helpers_forked_from_a_process_with_grpc_threads_do_each_batch_once() -> None:
    """A fork of a process whose gRPC threads run (Beam's, the Pub/Sub client's) may crash in
    gRPC's fork handlers: each batch still comes back once, undone with the reason if so."""
    done = subprocess.run([sys.executable, "-c", _GRPC_PROBE], capture_output=True, text=True,
                          timeout=300, env=same_code_env())
    assert done.returncode == 0, done.stderr[-3000:]
    for n, found in enumerate(json.loads(done.stdout.strip().splitlines()[-1])):
        keys = [keep for keep, _, _ in found["done"]]
        assert keys == ["a", "b"]
        for _, batch, result in found["done"]:
            assert result in (sum(batch), None)
        undone = sum(result is None for _, _, result in found["done"])
        assert len(found["failures"]) == undone, (n, found)


def test_a_helper_that_cannot_be_forked_leaves_the_batch_undone_and_the_others_serve(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A process or file limit (EAGAIN, EMFILE) at the fork: the batch comes back undone,
    or the helpers forked before it serve; nothing is left behind."""
    fork, forks = os.fork, []

    def limited(allowed: int) -> Any:
        def fork_or_fail() -> int:
            forks.append(1)
            if len(forks) > allowed:
                raise BlockingIOError(11, "Resource temporarily unavailable")
            return fork()
        return fork_or_fail

    monkeypatch.setattr(os, "fork", limited(1))
    helpers: Helpers[list[int], tuple[int, int]] = Helpers(_pid_and_sum, 3)
    helpers.submit([4, 5])
    ((_, _, result),) = helpers.finished(wait=True)
    assert result is not None and result[1] == 9
    assert helpers.failures == ["a helper could not be started: [Errno 11] Resource "
                                "temporarily unavailable"]
    helpers.close()
    assert _gone(result[0])
    forks.clear()
    monkeypatch.setattr(os, "fork", limited(0))
    none: Helpers[list[int], tuple[int, int]] = Helpers(_pid_and_sum, 2)
    none.submit([1], keep="k")
    assert none.finished(wait=True) == [("k", [1], None)]
    assert not none.idle() and none.holding == 0
    none.close()


_ORPHAN_PROBE = """
import os, signal, sys
from fanin.transforms.forked_helpers import Helpers, in_order

def wait_for_a_signal(batch):
    signal.pause()

helpers = Helpers(wait_for_a_signal, 1)
helpers.submit([1])
print(helpers._all[0].pid, flush=True)
signal.pause()
"""


def test_a_helper_dies_with_its_parent_even_at_work() -> None:
    """SIGTERM or a second Ctrl-C kills the parent without its teardown: the helper, busy
    with a batch, must not run on as an orphan."""
    parent = subprocess.Popen([sys.executable, "-c", _ORPHAN_PROBE], stdout=subprocess.PIPE,
                              text=True, env=same_code_env())
    assert parent.stdout is not None
    helper = int(parent.stdout.readline())
    watch = os.pidfd_open(helper)
    try:
        parent.kill()
        parent.wait(timeout=60)
        ready, _, _ = select.select([watch], [], [], 30)  # readable once the helper exits
        assert ready, "the helper outlived its parent"
    finally:
        os.close(watch)


_TWO_POOLS = """
import json, os
from fanin.transforms.forked_helpers import Helpers, in_order
first = Helpers(sum, 1)
first.submit([1, 2])
assert first.finished(wait=True)[0][2] == 3
second = Helpers(sum, 1)  # forked while the first pool's helper lives
second.submit([3, 4])
assert second.finished(wait=True)[0][2] == 7
pids = [helper.pid for helper in first._all]
first.close()  # waits for its helper, which exits once no copy of its parent end is open
gone = []
for pid in pids:
    try:
        os.kill(pid, 0)
        gone.append(False)
    except ProcessLookupError:
        gone.append(True)
second.close()
print(json.dumps(gone))
"""


def test_a_pool_closes_while_helpers_of_a_later_pool_live() -> None:
    """The second pool's helpers hold no copy of the first pool's parent ends: the first
    pool's helper sees its end close and exits (else ``close`` would wait on it forever)."""
    done = subprocess.run([sys.executable, "-c", _TWO_POOLS], capture_output=True, text=True,
                          timeout=60, env=same_code_env())
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == [True]


def test_in_order_gives_each_batch_once_in_its_order_whoever_did_it() -> None:
    batches = [list(range(n)) for n in range(1, 40)]
    here = os.getpid()
    for processes in (1, 3):
        failures: list[str] = []
        done = list(in_order(_pid_and_sum, iter(batches), processes,
                             lambda batch: len(batch) % 5 != 0, failures.append))
        assert [batch for batch, _ in done] == batches  # in order, each once
        assert [total for _, (_, total) in done] == [sum(b) for b in batches]
        pids = {pid for _, (pid, _) in done}
        assert failures == []
        if processes == 1:
            assert pids == {here}
        else:  # helpers took some; what for_helpers refuses is done here
            assert len(pids) > 1
            assert all(pid == here for batch, (pid, _) in done if len(batch) % 5 == 0)


def test_in_order_ends_its_helpers_when_the_caller_stops_early() -> None:
    started = in_order(_pid_and_sum, iter([[n] for n in range(100)]), 2, lambda _: True,
                       lambda reason: None)
    first = [next(started) for _ in range(3)]
    helpers = {pid for _, (pid, _) in first} - {os.getpid()}
    assert helpers  # the first batch went to a helper
    started.close()
    for pid in helpers:
        assert _gone(pid)
