"""The emitter agents call: opens, receipts per branch (decorator or context manager), skips.

Guarantees:
- Every message gets a fresh ``message_id`` (UUID4 hex unless ``new_id`` is injected) and an
  ``event_time`` from the injected wall ``clock`` at the moment the result is known; an open's
  event time is its context's ``opened_at``. Messages satisfy docs/spec.md §1 exactly.
- Nothing ``fanin run`` would dead-letter is sent. Each message is encoded, then checked by the
  pipeline's own parser (``fanin.sdk.messages.refuse_unparsable``) with this emitter's
  ``max_bytes`` (keep it equal to ``fanin run --max-bytes``) and, when given, the
  ``contracts`` names of the pipeline's contracts file (``unknown_contract`` otherwise; without
  them any contract name passes): a refused message raises
  ``MessageRefused`` (a ``ValueError``) naming the join, the branch, the dead-letter code and the
  parser's reason, at the call, and nothing is sent. A value that is not JSON at all raises
  ``TypeError``.
- A branch run through ``branch`` (decorator) or ``receipt`` (context manager), sync or async,
  emits exactly one receipt: ``ok`` with the return value / ``r.value``; ``error`` with
  ``"ExceptionType: text"`` when the body raises any ``Exception`` (which is then re-raised,
  unchanged); ``timeout`` when the body raises ``TimeoutError`` (``asyncio.wait_for`` enforces
  ``timeout_s`` for async functions; the timeout is re-raised) or, for a body that cannot be
  interrupted (sync code, ``async with``), when it returns after more than ``timeout_s`` as
  measured by the injected monotonic ``timer`` (the value is then returned to the caller but
  not reported). The error text is made to fit (``fanin.sdk.messages.fit_error``: lone
  surrogates escaped, cut at 16 KiB or at what ``max_bytes`` leaves, with a
  ``[truncated: N characters]`` marker), so an exception never prevents its receipt. If the
  returned value cannot be sent (not JSON, refused by the parser), an ``error`` receipt stating
  why is emitted and the ``TypeError``/``MessageRefused`` is raised.
- A branch whose receipt could never be sent, whatever its value or error, is refused
  (``MessageRefused``) when ``receipt``/the decorated call starts, before the body runs and
  before anything is sent: everything about the receipt that does not depend on the body
  (context, branch name, key, attempt) is checked by the pipeline's parser
  (``check_reportable``): a name or key that alone exceeds ``max_bytes``, a lone surrogate
  in the branch name, the key or the context (``not_utf8``), a contract not among
  ``contracts`` (``unknown_contract``), an attempt past 2**63-1 (a context carrying
  ``attempt=2**63-1`` run a second time). The attempt checked is the one the counter gives at
  the start (a run of the same branch finishing meanwhile may still raise it).
- A body's exception is never replaced by a failure to build its receipt: should its
  ``error``/``timeout`` receipt still be refused (a concurrent run of the same branch
  pushing the attempt past 2**63-1, or a clock answering something that is not a time:
  ``ClockError``), nothing is sent and the body's exception propagates, the refusal added as
  a note (``__notes__``). ``BaseException``\\s that are not
  ``Exception`` (cancellation, ``KeyboardInterrupt``) emit nothing: the branch did not finish.
  A sink failure while reporting (``PublishError``, a closed sink) propagates (the body's
  exception is its context).
- Attempts (docs/spec.md §3: a higher attempt supersedes a lower one). Each (join_id, branch) has a
  counter in this emitter; a receipt without an explicit attempt uses the next one (1, 2, ...),
  and at least the context's ``attempt`` when it carries one, so running a branch again in
  this process is a retry. Across processes the attempt must travel: the process handing a
  failed branch on passes ``ctx.with_attempt(n + 1)`` (in the context's JSON), or the retrying
  code passes ``attempt=`` to ``branch``/``receipt``/``emit`` (a number, or for ``branch`` a
  callable given the call's arguments), typically the queue's own delivery count: Celery
  ``self.request.retries + 1``, Cloud Tasks ``X-CloudTasks-TaskRetryCount`` + 1, Pub/Sub
  ``message.delivery_attempt`` (with a dead-letter policy), SQS ``ApproximateReceiveCount``.
  An explicit ``attempt`` is used as given; the counter then continues after it. Counters are
  kept for the ``max_tracked`` most recently used branches: a branch run again after more
  than that many other branches ran in this emitter starts from the context's attempt (1)
  again, and its new receipt then conflicts with the old one (``duplicate_changed``) unless
  the retry passes ``attempt=``. Skips always carry attempt 1 and do not count.
- The wall ``clock`` must answer seconds since the Unix epoch (years 0001-9999): any other
  answer (NaN, ``time.time_ns``'s nanoseconds) raises ``ClockError`` (a ``ValueError``) where
  the time is needed, rather than sending a time clamped to year 9999.
- Emission is synchronous and thread-safe; sink failures propagate (see ``fanin.sdk.sinks``).
  ``with Emitter(sink) as emitter:`` (or ``async with``) closes the sink on exit, so every
  message is flushed and publish failures raise there; a sink that still holds unflushed
  messages when the interpreter exits is flushed then, with an ``UnflushedMessagesWarning``.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import sys
import threading
import time
import uuid
from collections.abc import Callable, Container, Iterable
from types import TracebackType
from typing import Any, TypeVar, cast

from fanin.contracts.parsing import DEFAULT_MAX_BYTES
from fanin.sdk.context import Clock, ClockError, JoinContext, now_rfc3339
from fanin.sdk.messages import (
    MessageRefused,
    Status,
    encode_message,
    fit_error,
    open_message,
    receipt_message,
    refuse_unparsable,
    refuse_unreportable,
)
from fanin.sdk.sinks import EncodedMessage, Sink

__all__ = ["DEFAULT_MAX_BYTES", "AttemptSource", "ContextSource", "Emitter", "Receipt"]


F = TypeVar("F", bound=Callable[..., Any])
ContextSource = JoinContext | Callable[..., JoinContext]
"""A context, or a callable given the decorated function's arguments that returns one."""
AttemptSource = int | Callable[..., int | None] | None
"""An attempt, or a callable given the decorated function's arguments that returns one."""


def _uuid_hex() -> str:
    return uuid.uuid4().hex


def _describe(exc: BaseException, elapsed_s: float) -> str:
    try:
        text = str(exc)
    except Exception as failure:  # any exception still gets its receipt
        text = f"<str() of the exception raised {type(failure).__name__}>"
    return f"{type(exc).__name__}: {text}" if text else \
        f"{type(exc).__name__} after {elapsed_s:.3f}s"


def _add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``; on Python 3.10 the note is kept in ``__notes__`` all the same
    (which 3.10's tracebacks do not print)."""
    if sys.version_info >= (3, 11):
        exc.add_note(note)
    else:
        with contextlib.suppress(AttributeError):  # a type refusing attributes: no note
            exc.__notes__ = [*getattr(exc, "__notes__", ()), note]


_UNSENDABLE = (TypeError, MessageRefused, ClockError)
"""Why a receipt could not be made: its value is not JSON, the parser refuses it, the clock
answered no time."""

_PROBE_EVENT_TIME = "1970-01-01T00:00:00.000Z"
"""Stands for a receipt's event time in ``check_reportable`` (the length of any before 10000)."""
_PROBE_MESSAGE_ID = "0" * 32
"""Stands for a receipt's message id in ``check_reportable`` (the length of the default)."""


class Emitter:
    """Builds, encodes and publishes messages to ``sink``."""

    def __init__(self, sink: Sink, *, clock: Clock = time.time,
                 timer: Callable[[], float] = time.monotonic,
                 new_id: Callable[[], str] = _uuid_hex, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_tracked: int = 100_000, contracts: Container[str] | None = None) -> None:
        if sink.max_message_bytes is not None and max_bytes > sink.max_message_bytes:
            # a message between the two would pass the parser's check, then fail to send,
            # with no receipt to say so
            raise ValueError(f"max_bytes={max_bytes} is over what {sink!r} can send "
                             f"({sink.max_message_bytes} bytes a message)")
        if isinstance(max_tracked, bool) or not isinstance(max_tracked, int) or max_tracked < 1:
            # 0 would count nothing: every run of a branch would be attempt 1
            raise ValueError(f"max_tracked must be an integer >= 1, not {max_tracked!r}")
        self.sink = sink
        self.contracts = contracts
        self.clock = clock
        self.timer = timer
        self.new_id = new_id
        self.max_bytes = max_bytes
        self.max_tracked = max_tracked
        self._attempts: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def _encode(self, msg: dict[str, Any]) -> str:
        """The line of ``msg``, its ``error`` cut to what ``max_bytes`` leaves; checked by the
        parser (``MessageRefused`` otherwise)."""
        error = msg.get("error")
        if error is not None:
            msg["error"] = fit_error(error)
        line = encode_message(msg)
        if error:
            size = len(line.encode("utf-8"))
            if size > self.max_bytes:  # rare: cut the error to what the other fields leave
                msg["error"] = ""
                rest = len(encode_message(msg).encode("utf-8"))
                # cut from the whole text, so the marker counts its characters, not those of
                # the first cut
                msg["error"] = fit_error(error, self.max_bytes - rest)
                line = encode_message(msg)
        refuse_unparsable(msg, line, self.max_bytes, self.contracts)
        return line

    def _send(self, msg: dict[str, Any]) -> dict[str, Any]:
        return self._publish(msg, self._encode(msg))

    def _publish(self, msg: dict[str, Any], line: str) -> dict[str, Any]:
        self.sink.publish(EncodedMessage(line=line, join_id=msg["join_id"],
                                         message_id=msg["message_id"],
                                         event_time=msg.get("event_time", msg["opened_at"])))
        return msg

    def _peek_attempt(self, ctx: JoinContext, branch: str, attempt: int | None) -> int:
        """The attempt ``_next_attempt(ctx, branch, attempt)`` would choose now (nothing
        counted)."""
        with self._lock:
            return self._choose((ctx.join_id, branch), ctx, attempt)

    def _next_attempt(self, ctx: JoinContext, branch: str, attempt: int | None) -> int:
        with self._lock:
            key = (ctx.join_id, branch)
            chosen = self._choose(key, ctx, attempt)
            self._count(key, chosen)
            return chosen

    def _choose(self, key: tuple[str, str], ctx: JoinContext, attempt: int | None) -> int:
        """The attempt of the branch's next receipt (``attempt`` if given); counts nothing."""
        return max(self._attempts.get(key, 0) + 1, ctx.attempt or 1) if attempt is None \
            else attempt

    def _count(self, key: tuple[str, str], chosen: int) -> None:
        """Count ``chosen`` as sent for the branch ``key`` (with ``_lock`` held)."""
        last = self._attempts.pop(key, 0)
        self._attempts[key] = max(last, chosen)
        if len(self._attempts) > self.max_tracked:
            del self._attempts[next(iter(self._attempts))]

    def check_reportable(self, ctx: JoinContext, branch: str, key: str | None = None, *,
                         attempt: int | None = None) -> None:
        """Raise ``MessageRefused`` if no receipt of ``branch`` (with ``key``) for ``ctx`` could
        be sent, whatever its value or error; send nothing, count nothing.

        The pipeline's parser (``refuse_unreportable``, with ``max_bytes`` and ``contracts``)
        decides on the receipt with the least room for a value: status ``timeout``, an empty
        error, ``attempt`` (``None``: the one the counter gives now). So it refuses a branch
        name or key over ``max_bytes``, a lone surrogate in the branch name, the key or the
        context (``not_utf8``), an unknown contract, an attempt past 2**63-1. The clock and
        ``new_id`` are not called (stand-ins of the same length are used).
        """
        chosen = self._peek_attempt(ctx, branch, attempt)
        refuse_unreportable(receipt_message(ctx, branch, "timeout", _PROBE_EVENT_TIME,
                                            _PROBE_MESSAGE_ID, attempt=chosen, key=key,
                                            error=""),
                            self.max_bytes, self.contracts)

    def open(self, ctx: JoinContext, required: Iterable[str] | None = None,
             optional: Iterable[str] | None = None, deadline_s: float | None = None, *,
             allow_partial: bool | None = None, fail_fast: bool | None = None) -> dict[str, Any]:
        """Emit the open of ``ctx``; given fields override the contract. Returns the message."""
        return self._send(open_message(ctx, self.new_id(), required=required,
                                       optional=optional, deadline_s=deadline_s,
                                       allow_partial=allow_partial, fail_fast=fail_fast))

    def emit(self, ctx: JoinContext, branch: str, status: Status, *, value: Any = None,
             error: str | None = None, key: str | None = None,
             attempt: int | None = None) -> dict[str, Any]:
        """Emit one receipt now (attempt per the counter unless given). Returns the message.
        A receipt refused before it reaches the sink (``MessageRefused``, ``TypeError``,
        ``ClockError``) counts no attempt; a sink's failure propagates, its attempt counted."""
        if status == "skipped":
            return self._send(receipt_message(ctx, branch, status, now_rfc3339(self.clock),
                                              self.new_id(), attempt=1, key=key, value=value,
                                              error=error))
        with self._lock:
            branch_key = (ctx.join_id, branch)
            chosen = self._choose(branch_key, ctx, attempt)
            msg = receipt_message(ctx, branch, status, now_rfc3339(self.clock), self.new_id(),
                                  attempt=chosen, key=key, value=value, error=error)
            line = self._encode(msg)
            self._count(branch_key, chosen)
        return self._publish(msg, line)

    def check_receipt(self, ctx: JoinContext, branch: str, status: Status, *,
                      value: Any = None, error: str | None = None, key: str | None = None,
                      attempt: int | None = None) -> None:
        """Raise what ``emit`` would raise for this receipt before it reaches the sink
        (``MessageRefused``, ``TypeError`` for a value JSON cannot hold, ...); send nothing,
        count nothing. The clock and ``new_id`` are not called (stand-ins of the same length
        are used)."""
        chosen = self._peek_attempt(ctx, branch, attempt)
        self._encode(receipt_message(ctx, branch, status, _PROBE_EVENT_TIME, _PROBE_MESSAGE_ID,
                                     attempt=chosen, key=key, value=value, error=error))

    def skip(self, ctx: JoinContext, branch: str) -> dict[str, Any]:
        """Report the route ``branch`` (and everything under ``branch/``) as not taken."""
        return self.emit(ctx, branch, "skipped")

    def receipt(self, ctx: JoinContext, branch: str, *, key: str | None = None,
                timeout_s: float | None = None, attempt: int | None = None) -> Receipt:
        """A context manager (``with`` or ``async with``) that reports its body as ``branch``."""
        return Receipt(self, ctx, branch, key=key, timeout_s=timeout_s, attempt=attempt)

    def branch(self, ctx: ContextSource, name: str, *, key: str | None = None,
               timeout_s: float | None = None, attempt: AttemptSource = None
               ) -> Callable[[F], F]:
        """Decorate a sync or async function so each call reports one receipt of ``name``.

        ``ctx`` and ``attempt`` may be callables, given the call's arguments (e.g.
        ``attempt=lambda task: task.retries + 1``); ``attempt=None`` follows the counter.
        """
        def scope_for(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Receipt:
            found = ctx(*args, **kwargs) if callable(ctx) else ctx
            if not isinstance(found, JoinContext):
                raise TypeError(f"branch {name!r}: the context getter returned "
                                f"{type(found).__name__}, not a JoinContext")
            chosen = attempt(*args, **kwargs) if callable(attempt) else attempt
            return self.receipt(found, name, key=key, timeout_s=timeout_s, attempt=chosen)

        def decorate(fn: F) -> F:
            if inspect.iscoroutinefunction(fn):
                @functools.wraps(fn)
                async def run_async(*args: Any, **kwargs: Any) -> Any:
                    scope = scope_for(args, kwargs)
                    async with scope:
                        work = fn(*args, **kwargs)
                        scope.value = await (work if timeout_s is None
                                             else asyncio.wait_for(work, timeout_s))
                    return scope.value

                return cast(F, run_async)

            @functools.wraps(fn)
            def run(*args: Any, **kwargs: Any) -> Any:
                scope = scope_for(args, kwargs)
                with scope:
                    scope.value = fn(*args, **kwargs)
                return scope.value

            return cast(F, run)

        return decorate

    def flush(self) -> None:
        """Flush the sink (raises its ``PublishError``)."""
        self.sink.flush()

    def close(self) -> None:
        """Close the sink (raises its ``PublishError``)."""
        self.sink.close()

    def __enter__(self) -> Emitter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    async def __aenter__(self) -> Emitter:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await asyncio.to_thread(self.close)  # flushing blocks: not on the event loop


class Receipt:
    """One branch run; set ``value`` (and optionally ``key``) inside the block.

    Single use. After the block, ``message`` is the receipt that was emitted (``None`` when the
    block was cancelled) and ``attempt`` the attempt it carries.
    """

    def __init__(self, emitter: Emitter, ctx: JoinContext, branch: str, *, key: str | None,
                 timeout_s: float | None, attempt: int | None) -> None:
        if not isinstance(ctx, JoinContext):
            raise TypeError(f"branch {branch!r}: expected a JoinContext, got "
                            f"{type(ctx).__name__}")
        if not isinstance(branch, str) or not branch:
            raise ValueError("branch must be a non-empty string")
        if key is not None and not isinstance(key, str):
            raise ValueError("key must be a string or None")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError("timeout_s must be > 0")
        if attempt is not None and (isinstance(attempt, bool) or not isinstance(attempt, int)
                                    or attempt < 1):
            raise ValueError("attempt must be an integer >= 1 or None")
        emitter.check_reportable(ctx, branch, key, attempt=attempt)
        self._emitter = emitter
        self.ctx = ctx
        self.branch = branch
        self.key = key
        self.timeout_s = timeout_s
        self.attempt = attempt
        self.value: Any = None
        self.message: dict[str, Any] | None = None
        self._started: float | None = None

    def __enter__(self) -> Receipt:
        if self._started is not None:
            raise RuntimeError(f"receipt of branch {self.branch!r} is single use")
        self._started = self._emitter.timer()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._finish(exc)

    async def __aenter__(self) -> Receipt:
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self._finish(exc)

    def _finish(self, exc: BaseException | None) -> None:
        if exc is not None and not isinstance(exc, Exception):
            return
        emitter = self._emitter
        elapsed = emitter.timer() - cast(float, self._started)
        attempt = self.attempt = emitter._next_attempt(self.ctx, self.branch, self.attempt)

        def report(status: Status, **fields: Any) -> None:
            self.message = emitter.emit(self.ctx, self.branch, status, key=self.key,
                                        attempt=attempt, **fields)

        def report_failure(failure: BaseException, status: Status, error: str) -> None:
            """Report ``status``; if even that receipt is refused, note it on ``failure``
            (which the caller sees, unchanged otherwise)."""
            try:
                report(status, error=error)
            except _UNSENDABLE as refused:
                _add_note(failure, f"fanin.sdk: no receipt was sent for branch "
                                   f"{self.branch!r} of join {self.ctx.join_id!r}: {refused}")

        if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
            report_failure(exc, "timeout", _describe(exc, elapsed))
        elif exc is not None:
            report_failure(exc, "error", _describe(exc, elapsed))
        elif self.timeout_s is not None and elapsed > self.timeout_s:
            report("timeout", error=f"took {elapsed:.3f}s, over timeout_s={self.timeout_s:g}")
        else:
            try:
                report("ok", value=self.value)
            except _UNSENDABLE as failure:
                report_failure(failure, "error", str(failure))
                raise
