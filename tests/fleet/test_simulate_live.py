"""``fanin simulate --start`` and ``--rate N/s`` make a
live stream whose event times follow the clock, down to Pub/Sub through ``fanin publish -``."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from support.child_env import same_code_env
from support.emulator import PubSubEmulator

from fanin.cli import main as fanin_main
from fanin.contracts.timefmt import parse_rfc3339
from fanin.fleet.simulate import SHOWCASE_RATES, simulate_lines, timed_lines, write_paced

FANIN = [sys.executable, "-c", "import sys; from fanin.cli import main; sys.exit(main())"]
TIME_FIELDS = ("opened_at", "event_time")


def times(line: str) -> dict[str, int] | None:
    """The parseable time fields of a JSON object line, else None."""
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    found = {}
    for name in TIME_FIELDS:
        with contextlib.suppress(KeyError, TypeError, ValueError):
            found[name] = parse_rfc3339(obj[name])
    return found


_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z")


def event_ms(line: str) -> int | None:
    """When the message happened: an open's opened_at, a receipt's event_time."""
    obj = json.loads(line)
    return parse_rfc3339(obj["opened_at" if obj.get("kind") == "open" else "event_time"])


def test_start_shifts_every_time_and_nothing_else() -> None:
    base = list(simulate_lines(200, 5, SHOWCASE_RATES))
    start = "2030-05-01T12:00:00.000Z"
    moved = list(simulate_lines(200, 5, SHOWCASE_RATES, start=start))
    delta = parse_rfc3339(start) - parse_rfc3339("2026-01-01T00:00:00.000Z")
    assert [(i.category, i.flags) for i in moved] == [(i.category, i.flags) for i in base]
    shifted = 0
    for old, new in zip(base, moved, strict=True):
        old_times, new_times = times(old.line), times(new.line)
        assert (old_times is None) == (new_times is None)
        if old_times:
            assert new_times == {name: ms + delta for name, ms in old_times.items()}
            shifted += 1
    assert shifted > 1000
    assert json.loads(moved[0].line)["opened_at"] == start


def test_start_now_opens_the_first_join_at_the_clock(tmp_path: Path) -> None:
    out = tmp_path / "now.jsonl"
    before = int(time.time() * 1000)
    assert fanin_main(["simulate", "--joins", "5", "--start", "now", "--out", str(out)]) == 0
    after = int(time.time() * 1000)
    first = json.loads(out.read_text().splitlines()[0])
    assert before <= parse_rfc3339(first["opened_at"]) <= after


class FakeClock:
    """A wall clock that only ``sleep`` moves (nothing here really sleeps)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.now += seconds


class Recorder:
    """A text stream that remembers the clock at each line written."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.lines: list[tuple[float, str]] = []

    def write(self, text: str) -> None:
        self.lines.append((self.clock(), text.rstrip("\n")))

    def flush(self) -> None:
        pass


def test_paced_writing_follows_the_clock() -> None:
    clock = FakeClock(1_800_000_000.0)
    out = Recorder(clock)
    summary = write_paced(out, 60, 2, SHOWCASE_RATES, joins_per_s=4,  # type: ignore[arg-type]
                          clock=clock, sleep=clock.sleep)
    start_ms = 1_800_000_000_000
    expected = list(timed_lines(60, 2, SHOWCASE_RATES, start=start_ms, stagger_ms=250))
    assert [line for _, line in out.lines] == [item.line for _, item in expected]
    assert summary.lines == len(expected)
    opens = [json.loads(item.line) for _, item in expected if item.category == "open"]
    opened = sorted({o["join_id"]: parse_rfc3339(o["opened_at"]) for o in opens}.items())
    assert [ms for _, ms in opened] == [start_ms + 250 * i for i in range(60)]  # 4 a second
    for (written_s, line), (arrival_ms, item) in zip(out.lines, expected, strict=True):
        assert written_s * 1000 >= arrival_ms  # never early...
        assert written_s * 1000 - arrival_ms < 1  # ...nor late
        if item.category in ("open", "receipt", "retry", "skipped"):
            assert event_ms(line) <= written_s * 1000  # no event from the future
        # nor a time named anywhere in a line, malformed ones included
        assert all(parse_rfc3339(t) <= written_s * 1000 for t in _TIME.findall(line)), line
    assert {item.category for _, item in expected} >= {"invalid_json", "missing_field"}


def test_a_live_stream_reaches_pubsub_in_real_time(pubsub_emulator: PubSubEmulator) -> None:
    topic, subscription = pubsub_emulator.topic_and_subscription("live", ack_deadline_s=60)
    simulate = subprocess.Popen(
        [*FANIN, "simulate", "--joins", "6", "--rate", "3/s", "--seed", "4", "--out", "-",
         "--delayed", "0", "--slow", "0", "--open-delayed", "0", "--explicit-open", "1",
         "--invalid-json", "0", "--bad-type", "0", "--missing-field", "0", "--not-object", "0",
         "--unknown-contract", "0", "--redelivery", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=same_code_env())
    publish = subprocess.run([*FANIN, "publish", "--topic", topic, "--progress-every", "0", "-"],
                             stdin=simulate.stdout, capture_output=True, text=True, timeout=180,
                             env=same_code_env())
    assert simulate.stdout is not None
    simulate.stdout.close()
    _, simulate_err = simulate.communicate(timeout=30)
    assert simulate.returncode == 0, simulate_err
    assert publish.returncode == 0, publish.stderr
    sent = int(publish.stdout.split()[0].removeprefix("sent="))
    got = pubsub_emulator.collect(subscription, lambda msgs: len(msgs) >= sent, 60)
    assert len(got) == sent > 6
    lags: list[int] = []
    for message in got:
        obj: dict[str, Any] = json.loads(message.data)
        published_ms = int(message.publish_time.timestamp() * 1000)
        lags.append(published_ms - event_ms(json.dumps(obj)))  # type: ignore[arg-type]
    # event times follow the clock: each message reaches Pub/Sub within seconds of its event
    assert all(-1000 <= lag <= 10_000 for lag in lags), sorted(lags)
