"""What both framework integrations share: a fan-out becomes an open and skips, a branch run a
receipt (docs/spec.md §1), through a ``fanin.sdk.Emitter``. No framework is imported here.

Guarantees:
- ``FanOutReporter.open(possible, taken, run_id)`` opens a join only for a real fan-out: two or
  more distinct possible branches. The open's ``required`` is every possible branch (sorted),
  and each possible branch not in ``taken`` is skipped right after the open, so the join
  never waits for a route that was not taken. Returns the join's context, else ``None``; also
  ``None``, with a warning, for a fan-out so wide that its open is over the emitter's size
  limit (thousands of ``Send`` packets): it is not reported, and the graph runs on.
- ``ok`` reports a value made JSON by ``jsonable``; when it still is not JSON (or the message is
  over the emitter's size limit, or nested beyond what Python encodes, or refers to itself,
  or reading it raised, or its state key cannot be sent), an ``error`` receipt stating why
  (with the key, or without it when the key cannot be sent) is reported instead and a warning is
  logged: the join learns that the branch finished without a usable value, and the user's
  graph is not broken by what an observer could not encode. ``keyed`` never raises.
- ``error`` reports the text ``describe`` makes, ``"ExceptionType: message"`` (the SDK's form).
- Every receipt carries the attempt it is given (the framework's own retry count), so a retry
  supersedes the failed attempt (docs/spec.md §3).
- Sink failures (``PublishError``, a closed sink's ``ValueError``)
  propagate to the caller, as with the SDK (never reported as the branch's error), except while a
  branch's own exception is reported (``error`` with ``during_failure``): that exception is
  what reaches the caller, and the sink's failure is logged.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection, Mapping
from typing import Any

from fanin.sdk import Emitter, JoinContext, MessageRefused

__all__ = ["FanOutReporter", "describe", "describe_exception", "jsonable", "keyed",
           "missing_extra"]

_LOG = logging.getLogger(__name__)


def jsonable(value: Any) -> Any:
    """``value`` with pydantic models (LangChain messages, ADK and GenAI types) and dataclasses
    turned into JSON objects, and tuples into arrays; anything else is left as it is."""
    if isinstance(value, Mapping):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        return dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    return value


def describe(kind: str, message: str) -> str:
    """An error's text as the SDK writes it: ``"Kind: message"``, or ``"Kind"`` alone."""
    return f"{kind}: {message}" if message else kind


def describe_exception(error: BaseException) -> str:
    """``describe`` of a branch's exception; one whose ``str()`` raises is described as such
    (the branch's own exception must reach the caller, not one raised while reporting it)."""
    try:
        text = str(error)
    except Exception as failure:  # any __str__ may fail
        text = f"<str() of the exception failed: {type(failure).__name__}>"
    return describe(type(error).__name__, text)


def keyed(update: Any, is_plain_key: Callable[[str], bool]) -> tuple[str | None, Any]:
    """The ``(key, value)`` of a branch's receipt for a state ``update``.

    When the update is a mapping that writes exactly one key and ``is_plain_key(key)`` (the
    framework keeps the last value written there), the receipt writes that key: two branches
    writing it with different values are then a ``key_conflict``. Otherwise the key is ``None``
    (the branch's own name, docs/spec.md §1) and the value the whole update.
    """
    try:
        one = isinstance(update, Mapping) and len(update) == 1
        ((key, value),) = update.items() if one else ((None, None),)
    except Exception:  # a mapping whose len()/items() raises: ``ok`` reports why
        one = False
    if one and isinstance(key, str) and is_plain_key(key):
        return key, value
    return None, update


class FanOutReporter:
    """Opens joins for fan-outs and reports branch runs; join fields apply to every open."""

    def __init__(self, emitter: Emitter, *, contract: str | None = None,
                 deadline_s: float | None = None, allow_partial: bool | None = None,
                 fail_fast: bool | None = None) -> None:
        self.emitter = emitter
        self.contract = contract
        self.deadline_s = deadline_s
        self.allow_partial = allow_partial
        self.fail_fast = fail_fast

    def open(self, possible: Collection[str], taken: Collection[str],
             run_id: str | None) -> JoinContext | None:
        """Open a join over ``possible`` and skip what is not ``taken``; ``None`` if < 2."""
        branches = sorted(set(possible))
        if len(branches) < 2:
            return None
        ctx = JoinContext.new(contract=self.contract, run_id=run_id, clock=self.emitter.clock)
        try:
            self.emitter.open(ctx, required=branches, deadline_s=self.deadline_s,
                              allow_partial=self.allow_partial, fail_fast=self.fail_fast)
        except MessageRefused as exc:
            if exc.error != "too_large":
                raise
            _LOG.warning("fanin: a fan-out of %d branches is not reported: %s", len(branches),
                         exc)
            return None
        for branch in branches:
            if branch not in taken:
                self.emitter.skip(ctx, branch)
        return ctx

    def ok(self, ctx: JoinContext, branch: str, value: Any, *, key: str | None,
           attempt: int) -> None:
        """Report a finished run of ``branch`` with ``value`` (see the module guarantees)."""
        try:  # the receipt is made and checked first: only what it holds can fail here
            sendable = jsonable(value)
            self.emitter.check_receipt(ctx, branch, "ok", value=sendable, key=key,
                                       attempt=attempt)
        except Exception as exc:  # the value (or the key) cannot be sent, whatever raised
            why = "nested too deeply, or refers to itself" if isinstance(exc, RecursionError) \
                else describe_exception(exc) if not isinstance(exc, (TypeError, ValueError)) \
                else str(exc)
            _LOG.warning("fanin: branch %r of join %s: %s", branch, ctx.join_id, why)
            error = f"unreported value: {why}"
            try:
                self.emitter.check_receipt(ctx, branch, "error", error=error, key=key,
                                           attempt=attempt)
            except (TypeError, MessageRefused):  # the key was what failed: an error writes none
                key = None
            self.emitter.emit(ctx, branch, "error", error=error, key=key, attempt=attempt)
            return
        # the sink's failures (PublishError, a closed sink) reach the caller
        self.emitter.emit(ctx, branch, "ok", value=sendable, key=key, attempt=attempt)

    def error(self, ctx: JoinContext, branch: str, text: str, *, attempt: int,
              during_failure: bool = False) -> None:
        """Report a failed run of ``branch`` with the error ``text`` (see ``describe``).
        ``during_failure``: the branch's own exception is on its way to the caller, and a
        failure to send is logged rather than raised in its place."""
        try:
            self.emitter.emit(ctx, branch, "error", error=text, attempt=attempt)
        except Exception as exc:  # the sink's, or the message's: the branch's error goes on
            if not during_failure:
                raise
            _LOG.warning("fanin: the error receipt of branch %r of join %s was not sent: %s",
                         branch, ctx.join_id, exc)


def missing_extra(extra: str, missing: ImportError) -> ImportError:
    """The error of ``fanin.integrations.<extra>`` imported without its framework: names the
    extra to install (``pip install 'fanin[<extra>]'``) and what was missing."""
    return ImportError(f"fanin.integrations.{extra} needs Fanin's {extra} extra: pip install "
                       f"'fanin[{extra}]' ({missing})", name=missing.name)
