"""Test helpers that stand in for external services (no network beyond 127.0.0.1)."""

from fanin.testing.pubsub_server import EnvSetter, PubSubServer, pubsub_server_fixture

__all__ = ["EnvSetter", "PubSubServer", "pubsub_server_fixture"]
