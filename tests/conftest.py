"""Shared test helpers: a catalog with the SPEC's example contracts and record builders."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.emulator import EmulatorMissing, PubSubEmulator

from fanin.contracts.catalog import Catalog, JoinDefaults, parse_contracts
from fanin.contracts.parsing import parse_message
from fanin.contracts.records import Record

CONTRACTS_YAML = """
contracts:
  - name: triage
    required: [retrieve, verify, rank]
    optional: [enrich]
    deadline_s: 30
    allow_partial: true
    schemas:
      score: {type: number, minimum: 0, maximum: 1}
  - name: strict
    required: [a, b]
    deadline_s: 10
  - name: routed
    required: [classify, review/legal, review/tech, answer]
    deadline_s: 60
  - name: watch
    required: [a, b]
    deadline_s: 10
    close_trigger: watermark
  - name: short
    required: [a, b]
    deadline_s: 10
    retention_s: 5
  - name: fast
    required: [a, b]
    deadline_s: 10
    fail_fast: true
"""

BASE = "2026-01-01T00:00:00"


@pytest.fixture(scope="session")
def pubsub_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PubSubEmulator]:
    """Google's Pub/Sub emulator for the whole session, with ``PUBSUB_EMULATOR_HOST`` set to it
    (restored afterwards). Fails the test in one line when the emulator is not installed."""
    emulator = PubSubEmulator(Path(tmp_path_factory.mktemp("pubsub-emulator")))
    missing = None
    try:
        emulator.start()
    except EmulatorMissing as error:
        missing = str(error)
    if missing is not None:
        pytest.fail(missing, pytrace=False)
    previous = os.environ.get("PUBSUB_EMULATOR_HOST")
    os.environ["PUBSUB_EMULATOR_HOST"] = emulator.host
    try:
        yield emulator
    finally:
        emulator.stop()
        if previous is None:
            os.environ.pop("PUBSUB_EMULATOR_HOST", None)
        else:
            os.environ["PUBSUB_EMULATOR_HOST"] = previous


def ts(seconds: float) -> str:
    """RFC 3339 time ``seconds`` after the test epoch (millisecond precision)."""
    whole = int(seconds)
    millis = round((seconds - whole) * 1000)
    minutes, secs = divmod(whole, 60)
    hours, minutes = divmod(minutes, 60)
    return f"2026-01-01T{hours:02d}:{minutes:02d}:{secs:02d}.{millis:03d}Z"


def make_catalog(**defaults: Any) -> Catalog:
    return Catalog(parse_contracts(CONTRACTS_YAML), JoinDefaults(**defaults))


@pytest.fixture
def catalog() -> Catalog:
    return make_catalog()


def open_msg(join_id: str = "j", at: float = 0, **fields: Any) -> dict[str, Any]:
    return {"kind": "open", "join_id": join_id, "opened_at": ts(at), **fields}


def receipt(branch: str, at: float, join_id: str = "j", status: str = "ok",
            **fields: Any) -> dict[str, Any]:
    return {"join_id": join_id, "branch": branch, "status": status, "event_time": ts(at),
            **fields}


def record(message: dict[str, Any], catalog: Catalog | None = None, line: int = 0) -> Record:
    names = (catalog or make_catalog()).contracts
    rec, dead = parse_message(json.dumps(message), {"kind": "test", "line": line}, names)
    assert dead is None, dead
    return rec


def records(messages: list[dict[str, Any]], catalog: Catalog | None = None) -> list[Record]:
    return [record(m, catalog, i) for i, m in enumerate(messages)]
