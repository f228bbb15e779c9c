"""The Dataflow tests run with the network refused (they check what a job would do offline)."""

from __future__ import annotations

import socket

import pytest


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any connection attempt (metadata server, GCS, Dataflow or BigQuery API) fails the test."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"the test tried to reach the network: {args[1:]}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
