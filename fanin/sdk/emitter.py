"""The emitter agents call: opens, receipts per branch (decorator or context manager), skips.

Guarantees:
- Every message gets a fresh ``message_id`` (UUID4 hex unless ``new_id`` is injected) and an
  ``event_time`` from the injected wall ``clock`` at the moment the result is known; an open's
  event time is its context's ``opened_at``. Messages satisfy SPEC §1 exactly.
- A branch run through ``branch`` (decorator) or ``receipt`` (context manager), sync or async,
  emits exactly one receipt: ``ok`` with the return value / ``r.value``; ``error`` with
  ``"ExceptionType: text"`` when the body raises an ``Exception`` (which is then re-raised);
  ``timeout`` when the body raises ``TimeoutError`` (``asyncio.wait_for`` enforces
  ``timeout_s`` for async functions; the timeout is re-raised) or, for a body that cannot be
  interrupted (sync code, ``async with``), when it returns after more than ``timeout_s`` as
  measured by the injected monotonic ``timer`` (the value is then returned to the caller but
  not reported). ``BaseException``\\s that are not ``Exception`` (cancellation,
  ``KeyboardInterrupt``) emit nothing: the branch did not finish.
- Attempts: each (join_id, branch) has a counter in this emitter; every non-skip receipt uses
  the next attempt (1, 2, ...), so running a branch again for the same context is a retry.
  Pass ``attempt=`` when retries happen in another process (e.g. a task queue's retry count);
  the counter then continues after it. Counters are kept for the ``max_tracked`` most recently
  used branches. Skips always carry attempt 1 and do not count (SPEC §3).
- A value that is not JSON, or a message over ``max_bytes``, fails loudly: a ``TypeError``
  (resp. ``ValueError``) is raised. Inside ``branch``/``receipt`` an ``error`` receipt stating
  the problem is emitted first, so the join learns of the failure before its deadline.
- Emission is synchronous and thread-safe; sink failures propagate (see ``fanin.sdk.sinks``).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
import time
import uuid
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar, cast

from fanin.sdk.context import Clock, JoinContext, now_rfc3339
from fanin.sdk.messages import Status, encode_message, open_message, receipt_message
from fanin.sdk.sinks import EncodedMessage, Sink

__all__ = ["DEFAULT_MAX_BYTES", "ContextSource", "Emitter", "Receipt"]

DEFAULT_MAX_BYTES = 256 * 1024

F = TypeVar("F", bound=Callable[..., Any])
ContextSource = JoinContext | Callable[..., JoinContext]
"""A context, or a callable given the decorated function's arguments that returns one."""


def _uuid_hex() -> str:
    return uuid.uuid4().hex


def _describe(exc: BaseException, elapsed_s: float) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else \
        f"{type(exc).__name__} after {elapsed_s:.3f}s"


class Emitter:
    """Builds, encodes and publishes messages to ``sink``."""

    def __init__(self, sink: Sink, *, clock: Clock = time.time,
                 timer: Callable[[], float] = time.monotonic,
                 new_id: Callable[[], str] = _uuid_hex, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_tracked: int = 100_000) -> None:
        self.sink = sink
        self.clock = clock
        self.timer = timer
        self.new_id = new_id
        self.max_bytes = max_bytes
        self.max_tracked = max_tracked
        self._attempts: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def _send(self, msg: dict[str, Any]) -> dict[str, Any]:
        line = encode_message(msg)
        size = len(line.encode("utf-8"))
        if size > self.max_bytes:
            raise ValueError(f"message of join {msg['join_id']!r} is {size} bytes, over the "
                             f"limit of {self.max_bytes}")
        self.sink.publish(EncodedMessage(line=line, join_id=msg["join_id"],
                                         message_id=msg["message_id"],
                                         event_time=msg.get("event_time", msg["opened_at"])))
        return msg

    def _next_attempt(self, join_id: str, branch: str, attempt: int | None) -> int:
        with self._lock:
            key = (join_id, branch)
            last = self._attempts.pop(key, 0)
            chosen = last + 1 if attempt is None else attempt
            self._attempts[key] = max(last, chosen)
            if len(self._attempts) > self.max_tracked:
                del self._attempts[next(iter(self._attempts))]
            return chosen

    def open(self, ctx: JoinContext, required: list[str] | None = None,
             optional: list[str] | None = None, deadline_s: float | None = None, *,
             allow_partial: bool | None = None, fail_fast: bool | None = None) -> dict[str, Any]:
        """Emit the open of ``ctx``; given fields override the contract. Returns the message."""
        return self._send(open_message(ctx, self.new_id(), required=required,
                                       optional=optional, deadline_s=deadline_s,
                                       allow_partial=allow_partial, fail_fast=fail_fast))

    def emit(self, ctx: JoinContext, branch: str, status: Status, *, value: Any = None,
             error: str | None = None, key: str | None = None,
             attempt: int | None = None) -> dict[str, Any]:
        """Emit one receipt now (attempt per the counter unless given). Returns the message."""
        chosen = 1 if status == "skipped" else self._next_attempt(ctx.join_id, branch, attempt)
        return self._send(receipt_message(ctx, branch, status, now_rfc3339(self.clock),
                                          self.new_id(), attempt=chosen, key=key, value=value,
                                          error=error))

    def skip(self, ctx: JoinContext, branch: str) -> dict[str, Any]:
        """Report the route ``branch`` (and everything under ``branch/``) as not taken."""
        return self.emit(ctx, branch, "skipped")

    def receipt(self, ctx: JoinContext, branch: str, *, key: str | None = None,
                timeout_s: float | None = None, attempt: int | None = None) -> Receipt:
        """A context manager (``with`` or ``async with``) that reports its body as ``branch``."""
        return Receipt(self, ctx, branch, key=key, timeout_s=timeout_s, attempt=attempt)

    def branch(self, ctx: ContextSource, name: str, *, key: str | None = None,
               timeout_s: float | None = None) -> Callable[[F], F]:
        """Decorate a sync or async function so each call reports one receipt of ``name``."""
        def resolve(args: tuple[Any, ...], kwargs: dict[str, Any]) -> JoinContext:
            found = ctx(*args, **kwargs) if callable(ctx) else ctx
            if not isinstance(found, JoinContext):
                raise TypeError(f"branch {name!r}: the context getter returned "
                                f"{type(found).__name__}, not a JoinContext")
            return found

        def decorate(fn: F) -> F:
            if inspect.iscoroutinefunction(fn):
                @functools.wraps(fn)
                async def run_async(*args: Any, **kwargs: Any) -> Any:
                    scope = self.receipt(resolve(args, kwargs), name, key=key,
                                         timeout_s=timeout_s)
                    async with scope:
                        work = fn(*args, **kwargs)
                        scope.value = await (work if timeout_s is None
                                             else asyncio.wait_for(work, timeout_s))
                    return scope.value

                return cast(F, run_async)

            @functools.wraps(fn)
            def run(*args: Any, **kwargs: Any) -> Any:
                scope = self.receipt(resolve(args, kwargs), name, key=key, timeout_s=timeout_s)
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


class Receipt:
    """One branch run; set ``value`` (and optionally ``key``) inside the block.

    Single use. After the block, ``message`` is the receipt that was emitted (``None`` when the
    block was cancelled).
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
        attempt = emitter._next_attempt(self.ctx.join_id, self.branch, self.attempt)

        def report(status: Status, **fields: Any) -> None:
            self.message = emitter.emit(self.ctx, self.branch, status, key=self.key,
                                        attempt=attempt, **fields)

        if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
            report("timeout", error=_describe(exc, elapsed))
        elif exc is not None:
            report("error", error=_describe(exc, elapsed))
        elif self.timeout_s is not None and elapsed > self.timeout_s:
            report("timeout", error=f"took {elapsed:.3f}s, over timeout_s={self.timeout_s:g}")
        else:
            try:
                report("ok", value=self.value)
            except (TypeError, ValueError) as failure:
                report("error", error=str(failure))
                raise
