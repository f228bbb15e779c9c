"""Pub/Sub I/O for Fanin: Beam composites, a file publisher and the ``publish`` subcommand."""

from fanin.io.pubsub import (
    PublishFailure,
    PublishJson,
    PublishSummary,
    ReadMessages,
    parse_event_time_ms,
    publish_file,
    validate_topic_path,
)

__all__ = [
    "PublishFailure",
    "PublishJson",
    "PublishSummary",
    "ReadMessages",
    "parse_event_time_ms",
    "publish_file",
    "validate_topic_path",
]
