"""A test double for ``fanin run`` (run as a script, arguments as ``fanin``'s): its SIGINT
arrives while Beam's ``Pipeline.run`` is still starting the job, once the local runner's Pub/Sub
read has acknowledged its first pull: the moment a Ctrl-C used to lose acknowledged messages
(the drain's handler was installed only after ``run`` returned)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

import apache_beam as beam

from fanin.cli import main
from fanin.io import pubsub_drain

_ACKED, _SENT = threading.Event(), threading.Event()
_acknowledge = pubsub_drain._IdlePollingClient.acknowledge
_run = beam.Pipeline.run


def _acknowledged(self: Any, subscription: str, ack_ids: list[str]) -> None:
    _acknowledge(self, subscription, ack_ids)
    _ACKED.set()


def _run_then_interrupt(self: beam.Pipeline, *args: Any, **kwargs: Any) -> Any:
    result = _run(self, *args, **kwargs)
    if _SENT.is_set():  # Beam's run calls run again on a copy of the pipeline: signal once
        return result
    _SENT.set()
    if not _ACKED.wait(120):
        raise RuntimeError("the read acknowledged no pull within 120 s")
    os.kill(os.getpid(), signal.SIGINT)  # its handler runs here, before run returns
    return result


pubsub_drain._IdlePollingClient.acknowledge = _acknowledged  # type: ignore[method-assign]
beam.Pipeline.run = _run_then_interrupt  # type: ignore[method-assign]
sys.exit(main(sys.argv[1:]))
