"""Whole-pipeline fuzz: a hostile input file through the local runner, bounded and replay.

The file mixes simulator traffic with the parse fuzz corpus (one line per corpus entry that has
no line break), random garbage bytes, truncated and byte-flipped copies of real lines, a line
one byte over the size limit and blank separator lines. The run must not crash and docs/spec.md §5's
"nothing is lost" must hold exactly: the closes' ``counts.messages`` plus the ``late/`` and
``dead_letter/`` lines equal the non-empty input lines; every dead letter carries a known code
and the exact text of an input line.
"""

from __future__ import annotations

import base64
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from spec.invariants import check_run

from fanin.contracts.lines import message_lines
from fanin.contracts.parsing import DEFAULT_MAX_BYTES, ERRORS
from fanin.contracts.timefmt import parse_rfc3339
from fanin.fleet.simulate import CONTRACTS_PATH, write_simulation
from fanin.pipelines.pipeline import RunConfig, run_pipeline
from fanin.transforms.replay import scan_line

CORPUS = Path(__file__).resolve().parents[1] / "data" / "fuzz_corpus"
KINDS = ("closes", "late", "dead_letter")
RETENTION_MS = 604_800_000  # the default retention_s; no bundled contract overrides it


def _garbage(rng: random.Random, real: list[bytes]) -> bytes:
    """One hostile line (never containing a line break)."""
    how = rng.randrange(5)
    if how == 0:
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 80)))
    elif how == 1:
        line = rng.choice(real)
        data = line[:rng.randrange(1, len(line))]
    elif how == 2:
        line = bytearray(rng.choice(real))
        for _ in range(rng.randrange(1, 4)):
            line[rng.randrange(len(line))] = rng.randrange(256)
        data = bytes(line)
    elif how == 3:
        line = rng.choice(real)
        at = rng.randrange(len(line))
        data = line[:at] + rng.choice([b"NaN", b"\xff", b'"\\ud800"', b"1e400", b",,"]) + \
            line[at:]
    else:
        data = rng.choice(real)  # a plain redelivery
    return data.replace(b"\n", b" ").replace(b"\r", b" ") or b"?"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hostile")
    sim = folder / "sim.jsonl"
    write_simulation(sim, joins=30, seed=17)
    real = [line for line in sim.read_bytes().splitlines() if line]
    corpus = [p.read_bytes() for p in sorted(CORPUS.glob("*.bin"))]
    corpus = [c for c in corpus if b"\n" not in c and b"\r" not in c and c]
    rng = random.Random(20260101)
    extra = corpus + [_garbage(rng, real) for _ in range(120)]
    extra.append(b'{"join_id":"big","branch":"a","status":"ok","event_time":'
                 b'"2026-01-01T00:00:00Z","pad":"' + b"x" * DEFAULT_MAX_BYTES + b'"}')
    lines = list(real)
    for item in extra:
        lines.insert(rng.randrange(len(lines) + 1), item)
    for _ in range(5):
        lines.insert(rng.randrange(len(lines) + 1), b"")
    path = folder / "hostile.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    assert 250 <= sum(1 for line in lines if line) <= 600
    return path


def _read(out: Path) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for kind in KINDS:
        assert not list((out / kind).glob("*.tmp-*")), "a temporary file was left behind"
        found[kind] = [json.loads(line) for f in sorted((out / kind).glob("*.jsonl"))
                       for line in f.read_bytes().decode("utf-8").splitlines()]
    return found


def _check_conservation(found: dict[str, list[dict[str, Any]]], path: Path,
                        replay: bool) -> None:
    inputs = [line for line in path.read_bytes().splitlines() if line]
    folded = sum(close["counts"]["messages"] for close in found["closes"])
    assert folded + len(found["late"]) + len(found["dead_letter"]) == len(inputs)
    per_join = Counter(c["join_id"] for c in found["closes"])
    if not replay:
        assert max(per_join.values()) == 1
    else:
        # A join closes at most once while its tombstone lives. The hostile file holds a
        # valid receipt dated six months later (corpus ok--leap-second); the replay watermark
        # follows the largest event time, so it expires every earlier tombstone and a later
        # redelivery legitimately opens its join again (docs/spec.md, "Tombstones").
        newest = max(t for t, _ in map(scan_line, inputs) if t is not None)
        for close in found["closes"]:
            if per_join[close["join_id"]] > 1:
                expiry = parse_rfc3339(close["deadline"]) + RETENTION_MS
                assert expiry < newest, close["join_id"]
    available = Counter(inputs)
    numbered = path.read_bytes().split(b"\n")  # a dead letter's source: its line's number
    for dead in found["dead_letter"]:
        assert dead["error"] in ERRORS, dead["error"]
        assert dead["detail"] and "\n" not in dead["detail"]
        raw = base64.b64decode(dead["raw_base64"]) if "raw_base64" in dead \
            else dead["raw"].encode("utf-8")
        if dead["error"] == "too_large":  # its first bytes and its size (docs/spec.md §1)
            line = numbered[dead["source"]["line"] - 1].removesuffix(b"\r")
            assert line.startswith(raw) and dead["detail"].startswith(f"{len(line)} bytes > ")
            raw = line
        assert available[raw] > 0, f"dead letter not matching an input line: {raw[:80]!r}"
        available[raw] -= 1
        assert dead["source"]["kind"] == "file"
    errors = Counter(d["error"] for d in found["dead_letter"])
    assert {"not_utf8", "invalid_json", "not_object", "invalid_message",
            "too_large"} <= set(errors), errors
    assert found["closes"] and found["late"]


@pytest.mark.parametrize("replay", [False, True], ids=["bounded", "replay"])
def test_hostile_file_is_conserved(hostile: Path, tmp_path: Path, replay: bool) -> None:
    out = tmp_path / "out"
    run_pipeline(RunConfig(output=str(out), inputs=[str(hostile)], contracts_path=CONTRACTS_PATH,
                           replay=replay, max_disorder_s=1.0 if replay else 0.0), [])
    found = _read(out)
    _check_conservation(found, hostile, replay)
    with hostile.open("rb") as handle:  # the run invariants of docs/spec.md as well
        check_run([line for line, _ in message_lines(handle)], found, eager=replay)
