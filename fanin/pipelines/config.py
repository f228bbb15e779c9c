"""``fanin run``'s settings besides Beam's own options, and their validation.

Guarantees: ``RunConfig.validate`` refuses bad settings with one clear ``ConfigError`` line
(a ``ValueError``) and touches nothing.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from fanin.contracts.catalog import JoinDefaults
from fanin.contracts.parsing import DEFAULT_MAX_BYTES
from fanin.core.outcomes import CLOSES, DEAD_LETTER, LATE
from fanin.transforms.join import DEFAULT_MAX_BYTES_PER_JOIN
from fanin.transforms.write import FORMATS

__all__ = ["MAX_BYTES_LIMIT", "MAX_CLOSE_PROCESSES", "MAX_SHARDS", "MAX_WINDOW_S", "ConfigError",
           "RunConfig"]

MAX_WINDOW_S = 86_400  # --window-s: outputs are written at least once a day
MAX_SHARDS = 1_000  # --shards: file names give a shard three digits (s000-s999)
MAX_CLOSE_PROCESSES = 64  # --close-processes: each a forked copy of the running process
# --max-bytes, --max-bytes-per-join: above any memory, below what a read's limit (the size
# and a few bytes) can index (an OverflowError blamed the input file)
MAX_BYTES_LIMIT = 2**62


class ConfigError(ValueError):
    """A setting is invalid; the message is one line for the user."""


@dataclass
class RunConfig:
    """Everything ``fanin run`` needs besides Beam's own options."""

    output: str
    inputs: Sequence[str] = ()
    contracts_path: str | None = None
    defaults: JoinDefaults = field(default_factory=JoinDefaults)
    formats: Sequence[str] = ("jsonl",)
    replay: bool = False
    max_disorder_s: float = 0.0
    max_bytes: int = DEFAULT_MAX_BYTES
    max_messages_per_join: int = 100_000
    max_bytes_per_join: int = DEFAULT_MAX_BYTES_PER_JOIN  # of messages (UTF-8)
    window_s: float = 60.0
    shards: int = 1
    subscription: str | None = None
    topic: str | None = None
    overwrite: bool = False
    id_label: str | None = None  # Pub/Sub attribute Dataflow deduplicates by (Dataflow only)
    bigquery_dataset: str | None = None  # also write each output to <dataset>.<kind>
    # optional Pub/Sub topics the outputs are also published to (kind -> topic)
    topics: dict[str, str] = field(default_factory=dict)
    log_closes: bool = False  # one fanin.close log line per close, also on workers
    # processes deciding a bounded local run's joins (None: by the cores; runner_choice)
    close_processes: int | None = None

    def validate(self) -> None:
        if not self.output:
            raise ConfigError("--output is required")
        try:
            self.output.encode("utf-8")
        except UnicodeEncodeError:  # bytes that are not UTF-8, escaped by Python
            raise ConfigError(f"--output {os.fsencode(self.output)!r}: not UTF-8; Beam names "
                              "the files it writes in UTF-8") from None
        if self.contracts_path == "" or "" in self.inputs:  # "" is no file (a glob of all)
            raise ConfigError("--contracts and --input name a file: an empty one names none")
        if "" in (self.subscription, self.topic, self.bigquery_dataset, *self.topics.values()):
            raise ConfigError("--subscription, --topic, --<kind>-topic and --bigquery-dataset "
                              "name a resource: an empty one names none")
        sources = bool(self.inputs) + bool(self.subscription) + bool(self.topic)
        if sources != 1:
            raise ConfigError("give exactly one of --input, --subscription, --topic")
        if self.replay and not self.inputs:
            raise ConfigError("--replay replays --input files")
        if self.id_label and not (self.subscription or self.topic):
            raise ConfigError("--id-label is for Pub/Sub input")
        self._validate_limits()
        if not self.formats or set(self.formats) - set(FORMATS):
            raise ConfigError(f"--format must be one or more of {', '.join(FORMATS)}")
        if set(self.topics) - {CLOSES, LATE, DEAD_LETTER}:
            raise ConfigError("output topics are for closes, late and dead_letter")
        if self.topics and not self.streaming:
            raise ConfigError("publishing outputs to Pub/Sub needs a streaming run "
                              "(--subscription, --topic or --replay)")
        self._validate_pubsub_paths()

    def _validate_limits(self) -> None:
        """Every size, count and duration option is in its range (the reason in one line)."""
        if not 0 <= self.max_disorder_s < math.inf:  # NaN fails too
            raise ConfigError("--max-disorder-s must be a finite number >= 0")
        if self.max_bytes <= 0 or self.max_messages_per_join < 1:
            raise ConfigError("--max-bytes and --max-messages-per-join must be >= 1")
        if self.max_messages_per_join >= sys.maxsize:  # the bounded plan counts to it + 1
            raise ConfigError(f"--max-messages-per-join must be < {sys.maxsize}")
        if max(self.max_bytes, self.max_bytes_per_join) >= MAX_BYTES_LIMIT:
            raise ConfigError("--max-bytes and --max-bytes-per-join must be < "
                              f"{MAX_BYTES_LIMIT} (2**62)")
        if self.max_bytes_per_join < self.max_bytes:
            raise ConfigError("--max-bytes-per-join must be >= --max-bytes (a join must hold "
                              "at least one message)")
        if not 0 < self.window_s <= MAX_WINDOW_S:  # NaN fails too
            raise ConfigError(f"--window-s must be > 0 and at most {MAX_WINDOW_S} (a day)")
        if not 1 <= self.shards <= MAX_SHARDS:
            raise ConfigError(f"--shards must be from 1 to {MAX_SHARDS}")
        if self.close_processes is not None and \
                not 1 <= self.close_processes <= MAX_CLOSE_PROCESSES:
            raise ConfigError(f"--close-processes must be from 1 to {MAX_CLOSE_PROCESSES}")

    def _validate_pubsub_paths(self) -> None:
        """Every Pub/Sub path is one the service accepts (the reason in one line if not)."""
        from fanin.io.pubsub import validate_pubsub_path

        paths = [(self.subscription, "subscriptions"), (self.topic, "topics")]
        paths += [(topic, "topics") for topic in self.topics.values()]
        try:
            for path, collection in paths:
                if path:
                    validate_pubsub_path(path, collection)
        except ValueError as error:
            raise ConfigError(str(error)) from None

    @property
    def reads_pubsub(self) -> bool:
        """A subscription's or a topic's run: its files join an earlier run's in ``output``."""
        return bool(self.subscription or self.topic)

    @property
    def streaming(self) -> bool:
        return self.replay or self.reads_pubsub
