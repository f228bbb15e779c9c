"""RFC 3339 timestamps <-> integer epoch milliseconds (docs/spec.md §1, §5).

Guarantees:
- ``parse_rfc3339`` accepts exactly RFC 3339 §5.6 ``date-time``: ``YYYY-MM-DD``, ``T`` (or ``t``),
  ``hh:mm:ss`` with optional fraction, then ``Z`` (or ``z``) or ``+hh:mm`` / ``-hh:mm``. Anything
  else (no zone, a space for ``T``, a bad day of month, hour 24...) raises ``ValueError`` with a
  message naming the problem. The fraction is truncated (not rounded) to whole milliseconds.
- The year as written, and the instant once converted to UTC, must lie in years 0001-9999;
  otherwise ``ValueError``.
- A leap second (``:60``) is accepted, as RFC 3339 allows, and counted as ``:59.999`` of the same
  minute, so it keeps its order relative to its neighbours.
- ``format_ms`` renders UTC with milliseconds (``2026-01-02T03:04:05.678Z``) and is the inverse of
  ``parse_rfc3339`` on its own output.
"""

from __future__ import annotations

import re
from decimal import Decimal

__all__ = ["MAX_MS", "MIN_MS", "duration_ms", "format_ms", "parse_rfc3339"]

_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(?:([Zz])|([+-])(\d{2}):(\d{2}))\Z",
    re.ASCII,  # \d is 0-9 only: fullwidth or Arabic-Indic digits are not RFC 3339
)
_DAYS_IN_MONTH = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_MS_PER_DAY = 86_400_000


def _is_leap(year: int) -> bool:
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def _days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm)."""
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _civil_from_days(z: int) -> tuple[int, int, int]:
    z += 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    y = yoe + era * 400
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + (3 if mp < 10 else -9)
    return y + (m <= 2), m, d


MIN_MS = _days_from_civil(1, 1, 1) * _MS_PER_DAY
MAX_MS = _days_from_civil(10000, 1, 1) * _MS_PER_DAY - 1


_DAYS: dict[str, int | None] = {}  # "YYYY-MM-DD" -> days since the epoch (None: invalid)
# "YYYY-MM-DDThh:mm:ss" -> epoch ms of that second (None: not for the fast path). Messages of
# a busy second share one entry; bounded like the other caches.
_SECOND_MS: dict[str, int | None] = {}
_MILLIS_OF = {f"{m:03d}": m for m in range(1000)}  # "000" ... "999" -> 0 ... 999


def _utc_fast(text: str) -> int | None:
    """``YYYY-MM-DDThh:mm:ssZ`` or ``...ss.fffZ`` (the common forms), or None to take the
    general path. Same result as the general path on what it accepts."""
    size = len(text)
    if size == 24:
        if text[19] != "." or text[23] not in "Zz":
            return None
        millis = _MILLIS_OF.get(text[20:23])
        if millis is None:
            return None
    elif size != 20 or text[19] not in "Zz":
        return None
    else:
        millis = 0
    prefix = text[:19]
    second = _SECOND_MS.get(prefix, -1)
    if second == -1:
        second = _second_ms(prefix)
        if len(_SECOND_MS) > 100_000:
            _SECOND_MS.clear()
        _SECOND_MS[prefix] = second
    return None if second is None else second + millis


def _second_ms(prefix: str) -> int | None:
    """Epoch ms of ``YYYY-MM-DDThh:mm:ss`` (ASCII digits, a valid date, hh <= 23, mm and
    ss <= 59), else None: the general path gives the error, or takes the leap second."""
    if not prefix.isascii() or prefix[10] not in "Tt" or prefix[13] != ":" or prefix[16] != ":":
        return None
    clock = prefix[11:13] + prefix[14:16] + prefix[17:19]
    if not clock.isdigit():
        return None
    date = prefix[:10]
    days = _DAYS.get(date, -1)
    if days == -1 and date not in _DAYS:  # -1 is also 1969-12-31's
        try:
            days = _date_days(date)
        except ValueError:
            days = None
        if len(_DAYS) > 100_000:
            _DAYS.clear()
        _DAYS[date] = days
    hour, minute, second = int(clock[0:2]), int(clock[2:4]), int(clock[4:6])
    if days is None or hour > 23 or minute > 59 or second > 59:
        return None
    return days * _MS_PER_DAY + ((hour * 60 + minute) * 60 + second) * 1000


def _date_days(date: str) -> int:
    if date[4] != "-" or date[7] != "-" or not (date[:4] + date[5:7] + date[8:]).isdigit():
        raise ValueError("not a date")
    year, month, day = int(date[:4]), int(date[5:7]), int(date[8:])
    if year < 1 or not 1 <= month <= 12:
        raise ValueError("not a date")
    days_in_month = 29 if month == 2 and _is_leap(year) else _DAYS_IN_MONTH[month - 1]
    if not 1 <= day <= days_in_month:
        raise ValueError("not a date")
    return _days_from_civil(year, month, day)


def parse_rfc3339(text: str) -> int:
    """Parse an RFC 3339 date-time into epoch ms (UTC), truncating sub-millisecond digits."""
    fast = _utc_fast(text)
    if fast is not None:
        return fast
    match = _RFC3339.match(text)
    if match is None:
        raise ValueError("not an RFC 3339 date-time (YYYY-MM-DDThh:mm:ss[.fff](Z|+hh:mm))")
    year, month, day, hour, minute, second = (int(g) for g in match.group(1, 2, 3, 4, 5, 6))
    if year < 1:
        raise ValueError("year must be 0001-9999")
    if not 1 <= month <= 12:
        raise ValueError("month must be 01-12")
    days_in_month = 29 if month == 2 and _is_leap(year) else _DAYS_IN_MONTH[month - 1]
    if not 1 <= day <= days_in_month:
        raise ValueError(f"day must be 01-{days_in_month:02d} for {year:04d}-{month:02d}")
    if hour > 23 or minute > 59 or second > 60:
        raise ValueError("time of day out of range")
    fraction = match.group(7)
    millis = int((fraction + "00")[:3]) if fraction else 0
    if second == 60:
        second, millis = 59, 999
    offset_min = 0
    if match.group(8) is None:
        off_h, off_m = int(match.group(10)), int(match.group(11))
        if off_h > 23 or off_m > 59:
            raise ValueError("zone offset out of range")
        offset_min = (off_h * 60 + off_m) * (1 if match.group(9) == "+" else -1)
    value = (
        _days_from_civil(year, month, day) * _MS_PER_DAY
        + ((hour * 60 + minute - offset_min) * 60 + second) * 1000
        + millis
    )
    if not MIN_MS <= value <= MAX_MS:
        raise ValueError("instant is outside years 0001-9999 in UTC")
    return value


_SECONDS: dict[int, str] = {}  # epoch second -> "YYYY-MM-DDThh:mm:ss" (bounded cache)
_MILLIS = tuple(f".{m:03d}Z" for m in range(1000))  # ".000Z" ... ".999Z"


def format_ms(ms: int) -> str:
    """Render epoch milliseconds as RFC 3339 UTC with milliseconds; clamps to years 0001-9999."""
    if not MIN_MS <= ms <= MAX_MS:
        ms = min(max(ms, MIN_MS), MAX_MS)
    second = ms // 1000
    prefix = _SECONDS.get(second)
    if prefix is None:
        days, secs = divmod(second, 86_400)
        year, month, day = _civil_from_days(days)
        prefix = (f"{year:04d}-{month:02d}-{day:02d}T"
                  f"{secs // 3600:02d}:{secs // 60 % 60:02d}:{secs % 60:02d}")
        if len(_SECONDS) > 200_000:
            _SECONDS.clear()
        _SECONDS[second] = prefix
    return prefix + _MILLIS[ms - second * 1000]


def duration_ms(seconds: float) -> int:
    """A duration of ``seconds`` >= 0 in whole milliseconds, truncated: of the number as JSON
    writes it (the shortest decimal that reads back as the same double), so ``1.001`` is
    1,001 ms, not the 1,000 ms of the double just below 1.001 that ``1.001 * 1000`` gives.
    Beyond any timestamp range, 10**18."""
    if seconds >= 1e15:
        return 10**18
    if type(seconds) is int or seconds.is_integer():
        return int(seconds) * 1000
    return int(Decimal(repr(float(seconds))).scaleb(3))
