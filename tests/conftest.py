"""Shared fixtures: the example catalog and Google's Pub/Sub emulator (builders live in
``tests/support/``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.builders import make_catalog
from support.emulator import EmulatorMissing, PubSubEmulator

from fanin.contracts.catalog import Catalog


@pytest.fixture
def catalog() -> Catalog:
    return make_catalog()


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
