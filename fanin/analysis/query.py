"""Read-only SQL over an output folder (docs/spec.md §5) with DuckDB.

``open_outputs(dir)`` returns an in-memory DuckDB connection with three views, ``closes``,
``late`` and ``dead_letter``, whose columns are exactly ``fanin.contracts.tables.schema(kind)``
(top-level JSON-text columns ``values``, ``message``, ``source`` typed ``JSON``; timestamps
``TIMESTAMP WITH TIME ZONE`` in a UTC session), whichever files are present:

- ``DIR/<kind>/**/*.jsonl`` is parsed by Python with ``tables.to_table`` (the same conversion that
  writes Parquet, so both formats yield identical rows) and staged as an Arrow table;
- ``DIR/<kind>/**/*.parquet`` is read by pyarrow after every file's schema was checked
  against ``tables.schema(kind)`` (a path is never a pattern: a folder named ``o[x]`` is
  that folder);
- a run asked for both formats writes the same rows twice, so of each run's files (the run
  named in the file name, ``<kind>-<run>-p<pane>-s<shard>``: ``all`` for a bounded run, the
  job token for a streaming one; a subscription's runs add their files to one folder) its
  Parquet files are read when it wrote any, else its JSONL files, one file at a time, into
  the in-memory table ``_<kind>`` that the view selects from (each row once); with neither,
  the view exists with zero rows. Hidden files and folders (``.`` or ``_`` prefix: temp
  files, Beam's ``.temp-beam-*``) are skipped, so a half-written file is never read.

The outputs are copied into memory once (DuckDB's compressed columnar tables): that is what
lets the connection give up file access entirely. It suits a run's outputs up to a few GB; for
more, query the Parquet or BigQuery tables with an engine of your choice.

Read-only guarantee (defence in depth):

1. Once the tables are loaded the connection is locked down: ``enable_external_access = false``
   (no COPY, ATTACH, EXPORT, INSTALL/LOAD, file reader or writer: DuckDB touches no file at all)
   then ``lock_configuration = true`` (no ``SET``/``PRAGMA`` can undo it); extension
   auto-install/auto-load are off. (``allowed_paths`` is deliberately not used: DuckDB lets
   ``COPY ... TO`` overwrite an allowed path.)
2. ``run_query`` accepts a single ``SELECT`` (DuckDB parses ``WITH``, ``DESCRIBE``, ``SHOW`` and
   ``SUMMARIZE`` as ``SELECT``), or ``EXPLAIN [ANALYZE]`` of one, and refuses anything else with
   ``QueryRefused`` before executing it, so not even the in-memory copies can be changed
   (``EXPLAIN ANALYZE`` runs the statement it explains: the explained statement is parsed on its
   own and must be a ``SELECT``).

A folder is an output folder when it holds at least one of ``closes/``, ``late/`` and
``dead_letter/`` as a folder (a run creates all three, even with no outputs); anything else
(a kind folder itself, an unrelated folder, ``closes`` as a file) is refused with
``ValueError`` rather than read as zero rows.

Nested JSON-text fields (``branches[].value``, ``conflicts[].value`` and ``.extra``) stay
``VARCHAR``; wrap them in ``json(...)`` to use JSON operators.

``run_query`` renders ``table`` (aligned text; control characters, such as a terminal's escape
sequences or a newline in a value, shown escaped: ``\\x1b``, ``\\n``), ``csv`` (RFC 4180,
header row, NULL as empty) or ``json`` (an array of objects; JSON columns embedded as JSON,
times as RFC 3339 UTC text, in every format, to the millisecond, or the microsecond where a
computed time has more digits; a computed time beyond years 0001-9999, which RFC 3339 cannot
write, as DuckDB writes it (``10000-01-01 00:00:00+00``, ``0001-12-31 (BC) 00:00:00``),
and an infinite one with a time zone as ``infinity`` / ``-infinity`` (DuckDB gives Python no
way to tell one without a time zone from its extreme instants); ``NaN`` and infinite
numbers, which JSON cannot hold, as ``null``, also inside JSON columns). Decimals keep their
exact digits in every format.
``run_query(..., out=FILE)`` writes the rendered CSV/JSON/table with Python (atomically, to
exactly that path); DuckDB never writes a file.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import decimal
import itertools
import json
import math
import os
import re
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from fanin.analysis.interrupts import interrupts_held
from fanin.contracts import tables
from fanin.contracts.shown import visible
from fanin.contracts.timefmt import format_ms
from fanin.io.files import atomic_write

__all__ = ["FORMATS", "QueryRefused", "open_outputs", "outside_outputs", "run_query", "visible"]

FORMATS = ("table", "csv", "json")
_ALLOWED = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


class QueryRefused(ValueError):
    """The SQL is not a single read-only statement."""


def _visible(path: Path, root: Path) -> bool:
    return not any(part.startswith((".", "_")) for part in path.relative_to(root).parts)


def _run_of(kind: str, file: Path) -> str | None:
    """The run an output file's name says wrote it (``<kind>-<run>-p<pane>-s<shard>``, as
    ``fanin.transforms.write`` names files); None for a name of another form."""
    found = re.fullmatch(rf"{re.escape(kind)}-(.+)-p[0-9]+-s[0-9]+", file.stem)
    return found.group(1) if found else None


def _named(kind: str, folder: Path, files: list[Path]) -> list[Path]:
    """``files``, each where and as ``fanin run`` names its outputs (docs/spec.md §5
    "Files": ``<kind>-<run>-p<pane>-s<shard>`` in ``folder``, a closes Parquet file in its
    ``close_date=YYYY-MM-DD`` folder); else ``ValueError`` naming the first that is not: a
    copy (``copy.jsonl``, ``old/closes-all-p0000-s000.jsonl``) counted its rows twice."""
    for file in files:
        where = file.parent.relative_to(folder).parts
        dated = file.suffix == ".parquet" and kind == "closes" and len(where) == 1 and \
            re.fullmatch(r"close_date=[0-9]{4}-[0-9]{2}-[0-9]{2}", where[0]) is not None
        if _run_of(kind, file) is None or not (dated or not where):
            form = (f"{kind}/close_date=YYYY-MM-DD/{kind}-<run>-p<pane>-s<shard>.parquet"
                    if file.suffix == ".parquet" and kind == "closes"
                    else f"{kind}/{kind}-<run>-p<pane>-s<shard>{file.suffix}")
            raise ValueError(f"{file}: not an output file of fanin run ({form}); a copy "
                             "would count its rows twice: move it out of the output folder "
                             "or hide it (a name starting with . or _)")
    return files


def _output_files(folder: Path, suffix: str) -> list[Path]:
    """Sorted visible ``*<suffix>`` files anywhere under ``folder`` (none if it is missing); a
    visible folder under it that cannot be listed raises ``PermissionError``, and a visible
    ``*<suffix>`` that is not a regular file (a pipe, a device, a link to nothing) raises
    ``ValueError``: either would have been left out silently (a pipe or a device can also
    never be read to an end)."""
    if not folder.is_dir():
        return []
    found: list[Path] = []

    def unlisted(error: OSError) -> None:
        if error.filename is None or _visible(Path(error.filename), folder.parent):
            raise PermissionError(f"cannot list {error.filename or folder}: "
                                  f"{error.strerror or error}")

    for root, dirs, names in os.walk(folder, onerror=unlisted):
        dirs[:] = [name for name in dirs if not name.startswith((".", "_"))]
        found.extend(Path(root, name) for name in names if name.endswith(suffix))
    visible = sorted(p for p in found if _visible(p, folder))
    for path in visible:
        if not path.is_file():
            raise ValueError(f"{path}: not a regular file (a pipe, a device or a link to "
                             "nothing): its rows cannot be read")
    return visible


def _jsonl_tables(kind: str, files: Sequence[Path]) -> Iterator[pa.Table]:
    """Each JSONL file's rows as an Arrow table of the ``kind`` schema (``tables.to_row``)."""
    schema = tables.schema(kind)
    for file in files:
        rows = []
        with open(file, "rb") as fh:
            for number, data in enumerate(fh, 1):
                try:
                    line = data.decode("utf-8")
                    if line.strip():
                        rows.append(tables.to_row(kind, json.loads(line)))
                except (ValueError, RecursionError) as exc:  # JSON, UTF-8, nesting
                    reason = "nested too deeply" if isinstance(exc, RecursionError) else exc
                    raise ValueError(f"{file}:{number}: {reason}") from None
        yield pa.Table.from_pylist(rows, schema=schema)


@contextlib.contextmanager
def _opened_parquet(file: Path) -> Iterator[pq.ParquetFile]:
    """``file`` opened by pyarrow as Parquet through a Python file object, for the body of
    the ``with``: its path is never a pattern or a URI (DuckDB's ``read_parquet`` expanded ``[``,
    ``*`` and ``?`` in it: a folder named ``o[x]`` read the files of ``ox``). A file that is
    not Parquet, or damaged, is named (``ValueError``)."""
    try:
        handle = open(file, "rb")  # noqa: SIM115 (closed below, after the body's reads)
    except OSError as exc:
        raise ValueError(f"{file}: cannot be opened: {exc.strerror or exc}") from None
    try:
        yield pq.ParquetFile(handle)
    except (pa.ArrowException, OSError) as exc:  # damaged data pages: pyarrow's OSError
        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        raise ValueError(f"{file}: not a readable Parquet file: {lines[0]}") from None
    finally:
        handle.close()


def _check_parquet(kind: str, files: Sequence[Path]) -> None:
    """Every file is Parquet of the ``kind`` schema (all checked before any is loaded)."""
    expected = tables.schema(kind)
    for file in files:
        with _opened_parquet(file) as parquet:
            found = parquet.schema_arrow
        if found.remove_metadata() != expected.remove_metadata() or found.names != expected.names:
            raise ValueError(f"{file}: Parquet schema differs from the {kind} schema")


def _parquet_tables(files: Sequence[Path]) -> Iterator[pa.Table]:
    """The files' rows, ``_BATCH_ROWS`` at a time (one batch is held, not a whole file)."""
    for file in files:
        with _opened_parquet(file) as parquet:
            for batch in parquet.iter_batches(batch_size=_BATCH_ROWS):
                yield pa.Table.from_batches([batch])


_BATCH_ROWS = 65_536


def _load(con: duckdb.DuckDBPyConnection, kind: str, folder: Path,
          check: Callable[[], None]) -> None:
    """Copy the ``kind`` outputs under ``folder`` into table ``_<kind>``; create view ``kind``
    (``check()`` after each file: ``interrupts_held``).

    A run that wrote both formats wrote the same rows twice: of each run's files, its Parquet
    files are read when it wrote any, else its JSONL files, so every row appears once.
    """
    sch = tables.schema(kind)
    columns = ", ".join(f'"{name}"' for name in sch.names)
    parquet = _named(kind, folder, _output_files(folder, ".parquet"))
    _check_parquet(kind, parquet)
    in_parquet = {_run_of(kind, file) for file in parquet}
    jsonl = [file for file in _named(kind, folder, _output_files(folder, ".jsonl"))
             if _run_of(kind, file) not in in_parquet]
    parts = itertools.chain(_parquet_tables(parquet), _jsonl_tables(kind, jsonl))
    staging = f"_{kind}_staging"
    # one file's table at a time: an empty table of the schema first, then each file's rows
    for n, part in enumerate(itertools.chain([sch.empty_table()], parts)):
        con.register(staging, part)
        # kind, columns: constants of the schema; staging: a registered Arrow table
        into = f'INSERT INTO "_{kind}"' if n else f'CREATE TABLE "_{kind}" AS'
        con.execute(f"{into} SELECT {columns} FROM {staging}")  # noqa: S608
        con.unregister(staging)
        check()
    projection = ", ".join(
        f'"{f.name}"::JSON AS "{f.name}"'
        if (f.metadata or {}).get(b"fanin.encoding") == b"json" else f'"{f.name}"'
        for f in sch
    )
    con.execute(f'CREATE VIEW "{kind}" AS SELECT {projection} FROM "_{kind}"')  # noqa: S608


def _check_layout(root: Path) -> None:
    """Refuse a folder that is not an output folder (see the module docstring)."""
    folders = [root / kind for kind in tables.KINDS]
    for folder in folders:
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"{folder} is not a folder: not an output folder")
    if not any(folder.is_dir() for folder in folders):
        raise ValueError(f"{root} is not an output folder: it has no closes/, late/ or "
                         "dead_letter/ folder")


def _memory_limit() -> str:
    """Half of this machine's memory (DuckDB's own default, 80 %, let a query and Python's
    copy of its result exhaust it: the process was killed); a statement needing more fails
    with DuckDB's out-of-memory error, one line."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: DuckDB's default
        return "80%"
    return f"{max(total // 2 // 2**20, 256)}MB"


_MEMORY_LIMIT = _memory_limit()


def _spill_folder() -> str:
    """Where a statement larger than the memory limit spills: a fresh folder in the system's
    temporary folder, which DuckDB makes when it first spills and deletes when the connection
    closes (its default, ``.tmp`` in the working folder, wrote beside the user's files, and
    failed in a folder the user cannot write in)."""
    return os.path.join(tempfile.gettempdir(), f"fanin-query-{uuid.uuid4().hex}")


def open_outputs(directory: str | os.PathLike[str]) -> duckdb.DuckDBPyConnection:
    """Locked-down in-memory connection with views ``closes``, ``late``, ``dead_letter``.

    Raises ``FileNotFoundError`` if ``directory`` is not a directory and ``ValueError`` (naming
    ``file:line``) if an output file does not follow the layout; Ctrl-C while the outputs load
    raises ``KeyboardInterrupt`` between two files (``interrupts_held``), never an error of
    DuckDB's.
    """
    if not os.fspath(directory):  # Path("") is the working folder: a DIR left empty by mistake
        raise ValueError("an empty name is no output folder: give DIR")
    root = Path(directory)
    if not root.is_dir():
        what = "a file, not an output folder" if root.exists() else "no such output directory"
        raise FileNotFoundError(f"{what}: {root}")
    _check_layout(root)
    con = duckdb.connect(
        ":memory:",
        config={"autoinstall_known_extensions": False, "autoload_known_extensions": False,
                "memory_limit": _MEMORY_LIMIT, "temp_directory": _spill_folder()},
    )
    try:
        with interrupts_held() as check:
            con.execute("SET TimeZone = 'UTC'")
            for kind in tables.KINDS:
                _load(con, kind, root / kind, check)
            con.execute("SET enable_external_access = false")
            con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con


# what may stand between EXPLAIN's parts: white space and comments
_GAP = re.compile(r"(?:\s+|--[^\n]*|/\*.*?\*/)*", re.DOTALL)
_EXPLAIN_PARTS = (re.compile(r"explain\b", re.IGNORECASE),
                  re.compile(r"analy[sz]e\b", re.IGNORECASE),
                  re.compile(r"\([^()]*\)"))  # options: (FORMAT JSON), (ANALYZE), ...


def _explained(sql: str) -> list[str]:
    """What an ``EXPLAIN`` statement may explain: ``sql`` after ``EXPLAIN``, an optional
    ``ANALYZE`` and an optional list of options (and the comments between them); with and
    without the parenthesised part, which is the options or the start of the statement
    (``EXPLAIN (SELECT 1)``)."""
    pos = _GAP.match(sql).end()  # type: ignore[union-attr]  # matches the empty string
    found: list[str] = []
    for part in _EXPLAIN_PARTS:
        matched = part.match(sql, pos)
        if matched is not None:
            if part is _EXPLAIN_PARTS[-1]:
                found.append(sql[pos:])
            pos = _GAP.match(sql, matched.end()).end()  # type: ignore[union-attr]
    return [sql[pos:], *found]


def _one_select(con: duckdb.DuckDBPyConnection, sql: str) -> bool:
    """``sql`` is exactly one ``SELECT`` statement."""
    try:
        inner = con.extract_statements(sql)
    except duckdb.Error:
        return False
    return len(inner) == 1 and inner[0].type == duckdb.StatementType.SELECT


def _first_word(sql: str, otherwise: str) -> str:
    """The statement's first keyword as the user wrote it (``PIVOT``, ``INSTALL``: DuckDB's
    own names for them are ``MULTI``, ``LOAD``), else ``otherwise``."""
    found = re.match(r"\s*([A-Za-z_]+)", sql)
    return found.group(1).upper() if found else otherwise


def _check_read_only(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    statements = con.extract_statements(sql)
    if len(statements) != 1:
        raise QueryRefused(f"expected exactly one SQL statement, got {len(statements)}")
    kind = statements[0].type
    if kind not in _ALLOWED:
        raise QueryRefused("only SELECT or EXPLAIN is allowed, not "
                           f"{_first_word(statements[0].query, kind.name)}")
    if kind == duckdb.StatementType.EXPLAIN and not any(
            _one_select(con, text) for text in _explained(statements[0].query)):
        raise QueryRefused("EXPLAIN is allowed only of a SELECT (EXPLAIN ANALYZE runs "
                           "the statement it explains)")


def _finite(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


class _Exact:
    """Decimals in a rendering, with their exact digits and scale (``7.0``, ``1.50``):
    ``json.dumps`` writes a ``Decimal`` only as a float (``12345678901234567.89`` became
    ``1.2345678901234568e+16``). Each is a placeholder string, unique to this rendering,
    that ``dumps`` replaces by its digits (a JSON number). The token is drawn at the first
    decimal: a rendering without one (most cells) costs no random draw."""

    def __init__(self) -> None:
        self._token = ""
        self._digits: list[str] = []

    def number(self, value: decimal.Decimal) -> str:
        if not self._token:
            self._token = f"fanin-decimal-{uuid.uuid4().hex}-"
        self._digits.append(format(value, "f"))
        return f"{self._token}{len(self._digits) - 1}"

    def dumps(self, value: Any, **options: Any) -> str:
        text = json.dumps(value, **options)
        if not self._digits:
            return text
        return re.sub(f'"{self._token}([0-9]+)"', lambda m: self._digits[int(m[1])], text)


def _to_json(value: Any, exact: _Exact, json_text: bool = False) -> Any:
    """A JSON-native rendering of a DuckDB result value (times as RFC 3339 UTC, to the
    millisecond, or to the microsecond where a computed time has more digits; NaN and
    infinities, also inside JSON text, as null; decimals by ``exact``)."""
    if json_text and isinstance(value, str):
        return json.loads(value, parse_constant=lambda _: None, parse_float=_finite)
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN or infinity
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.timezone.utc)
        text = format_ms((value - _EPOCH) // dt.timedelta(milliseconds=1))
        micros = value.microsecond % 1000  # a computed time's (the outputs' are whole ms)
        return f"{text[:-1]}{micros:03d}Z" if micros else text
    if isinstance(value, (dt.date, dt.time, dt.timedelta, uuid.UUID)):
        return str(value)
    if isinstance(value, decimal.Decimal):
        return exact.number(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dict):
        return {str(k): _to_json(v, exact) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_json(v, exact) for v in value]
    return value


def _cell(value: Any, null: str) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return json.dumps(value)  # NaN, Infinity, -Infinity: text, not NULL
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    exact = _Exact()
    value = _to_json(value, exact)
    if value is None:
        return null
    return value if isinstance(value, str) else exact.dumps(value, ensure_ascii=False)


def _render(names: Sequence[str], types: Sequence[str], rows: Sequence[tuple[Any, ...]],
            fmt: str) -> str:
    """Render a result as ``table`` (aligned text, control characters shown escaped:
    ``visible``), ``csv`` (RFC 4180) or ``json`` (array). A value nested beyond what Python
    renders is ``ValueError``."""
    try:
        return _rendered(names, types, rows, fmt)
    except RecursionError:
        raise ValueError("a result value is nested too deeply to render; select a part of "
                         "it (json_extract) or cast it to VARCHAR") from None


# What DuckDB gives Python for an infinite TIMESTAMP WITH TIME ZONE: the extreme datetimes,
# without the time zone every finite value of such a column has
_INFINITE = {dt.datetime.max: "infinity", dt.datetime.min: "-infinity"}


def _infinities(types: Sequence[str], rows: Sequence[tuple[Any, ...]]
                ) -> Sequence[tuple[Any, ...]]:
    """``rows`` with each infinite time of a ``TIMESTAMP WITH TIME ZONE`` column as the text
    ``infinity`` or ``-infinity`` (it read as a real instant: 9999-12-31T23:59:59.999999Z)."""
    zoned = [i for i, t in enumerate(types) if t == "TIMESTAMP WITH TIME ZONE"]
    if not zoned:
        return rows

    def cell(value: Any) -> Any:
        if isinstance(value, dt.datetime) and value.tzinfo is None:
            return _INFINITE.get(value, value)
        return value

    return [tuple(cell(v) if i in zoned else v for i, v in enumerate(row)) for row in rows]


def _rendered(names: Sequence[str], types: Sequence[str], rows: Sequence[tuple[Any, ...]],
              fmt: str) -> str:
    rows = _infinities(types, rows)
    if fmt == "json":
        flags = [t == "JSON" for t in types]
        exact = _Exact()
        objs = [
            {n: _to_json(v, exact, f) for n, v, f in zip(names, row, flags, strict=True)}
            for row in rows
        ]
        return exact.dumps(objs, ensure_ascii=False, indent=2) + "\n"
    if fmt == "csv":
        return "".join(_csv_line(cells) for cells in
                       [names, *([_cell(v, "") for v in row] for row in rows)])
    if fmt == "table":
        cells = [[visible(n) for n in names]] + \
            [[visible(_cell(v, "NULL")) for v in row] for row in rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(names))]
        lines = [
            " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells
        ]
        lines.insert(1, "-+-".join("-" * w for w in widths))
        return "\n".join(lines) + f"\n({len(rows)} row{'s' if len(rows) != 1 else ''})\n"
    raise ValueError(f"unknown format {fmt!r}; expected one of {FORMATS}")


def outside_outputs(directory: str | os.PathLike[str], out: str | os.PathLike[str],
                    option: str = "--out") -> None:
    """Refuse a FILE (``--out``, ``fanin report --html``) inside the folder's output folders:
    it would become one more output file (or replace one) that the next query reads."""
    target = os.path.realpath(out)
    for kind in tables.KINDS:
        folder = os.path.realpath(os.path.join(directory, kind))
        if os.path.commonpath([folder, target]) == folder:
            raise ValueError(f"{option} {out}: is in {os.path.join(directory, kind)}, which holds "
                             "the outputs queried; give a file outside it")


MAX_ROWS = 1_000_000  # a result's rows, all held in memory to be rendered


def _fetch(con: duckdb.DuckDBPyConnection, sql: str
           ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The statement's description and rows; ``ValueError`` beyond ``MAX_ROWS`` rows."""
    cursor = con.execute(sql)
    description = list(cursor.description or [])
    rows = cursor.fetchmany(MAX_ROWS + 1) if description else []
    if len(rows) > MAX_ROWS:
        raise ValueError(f"the result has more than {MAX_ROWS:,} rows: add a LIMIT, or "
                         "aggregate")
    return description, rows


def _interruptible(con: duckdb.DuckDBPyConnection, sql: str
                   ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """``_fetch`` in a worker thread, so that Ctrl-C stops it: DuckDB does not see Python's
    signals while a statement runs. On ``KeyboardInterrupt`` the statement is interrupted
    (until the worker has ended) and the interrupt raised again. Either way no worker thread
    is left when this returns or raises."""
    result: dict[str, Any] = {}
    done = threading.Event()  # (Thread.is_alive can be wrong after an interrupted join)

    def work() -> None:
        try:
            result["value"] = _fetch(con, sql)
        except BaseException as exc:  # handed to the caller's thread
            result["error"] = exc
        finally:
            done.set()

    worker = threading.Thread(target=work, name="fanin-query", daemon=True)
    try:
        # a Ctrl-C while start() runs waits for it to return (``interrupts_held``): landing
        # inside, it could come before the thread had an ident, which read as "never
        # started", and the statement ran on after the interrupt
        with interrupts_held():
            worker.start()
        done.wait()
    except KeyboardInterrupt:
        # an interrupt before the statement began stops nothing, and one while DuckDB starts
        # it is refused (the connection is busy): again, until the worker has ended (a worker
        # never started has nothing to stop; one interrupted in start() left the caller's
        # close() of the connection failing as "busy": exit 2, not 130)
        while worker.ident is not None:
            with contextlib.suppress(duckdb.Error):
                con.interrupt()
            if done.wait(0.1):
                break
        raise
    finally:
        if done.is_set():  # it has nothing left to do: no thread outlives the statement
            worker.join()
    if "error" in result:
        raise result["error"]
    return result["value"]  # type: ignore[no-any-return]


_CSV_QUOTED = re.compile(r'[,"\r\n]')


def _csv_line(cells: Sequence[str]) -> str:
    """One CSV record (RFC 4180) ending in ``\n``: a cell holding a comma, a double quote, a
    carriage return or a line feed is quoted, its quotes doubled (Python's ``csv`` quotes a
    carriage return only when the line terminator holds one: a lone ``\r`` in a value split
    its row for every reader); a record of one empty cell is ``""`` (not an empty line)."""
    if len(cells) == 1 and not cells[0]:
        return '""\n'
    return ",".join('"' + c.replace('"', '""') + '"' if _CSV_QUOTED.search(c) else c
                    for c in cells) + "\n"


def run_query(
    directory: str | os.PathLike[str],
    sql: str,
    fmt: str = "table",
    out: str | os.PathLike[str] | None = None,
) -> str:
    """Run one read-only statement over the outputs in ``directory`` and return it rendered.

    With ``out`` the text is also written (atomically, by Python) to exactly that path.
    Raises ``QueryRefused`` for a non-read-only statement, ``duckdb.Error`` for bad SQL, plus
    the errors of ``open_outputs``.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {FORMATS}")
    try:
        sql.encode("utf-8")
    except UnicodeEncodeError:  # bytes of the command line that are not UTF-8, escaped
        raise QueryRefused("the SQL is not UTF-8 text") from None
    if out is not None:
        outside_outputs(directory, out)
    con = open_outputs(directory)
    try:
        with interrupts_held():
            _check_read_only(con, sql)
        description, rows = _interruptible(con, sql)
    finally:
        con.close()
    text = _render([d[0] for d in description], [str(d[1]) for d in description], rows, fmt)
    if out is not None:
        atomic_write(out, lambda fh: fh.write(text.encode("utf-8")))
    return text
