"""fanin.analysis: schemas, Parquet, BigQuery files, read-only SQL views, CLI and HTML report."""

from __future__ import annotations

import argparse
import csv
import decimal
import hashlib
import io
import json
import os
import random
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq
import pytest

from fanin.analysis import cli, query, report
from fanin.contracts import tables
from fanin.contracts.timefmt import format_ms
from fanin.io import parquet
from fanin.io.files import atomic_write

REPO = Path(__file__).resolve().parents[2]
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00.000Z

# Hand-written lines in exactly the layout of the lead's brief (not produced by our code).
HAND_CLOSE = (
    '{"join_id":"h1","contract":"triage","run_id":"r1","reason":"partial",'
    '"opened_at":"2026-01-01T00:00:00.000Z","deadline":"2026-01-01T00:00:30.000Z",'
    '"closed_at":"2026-01-01T00:00:30.000Z","latency_ms":30000,"required":["rank","retrieve",'
    '"verify"],"optional":["enrich"],"pruned":[],"missing":["rank"],"failed":["verify"],'
    '"values":{"docs":["a","b"],"score":0.5},"branches":{"retrieve":{"status":"ok","key":"docs",'
    '"attempt":1,"event_time":"2026-01-01T00:00:01.250Z","value":["a","b"],"error":null},'
    '"verify":{"status":"error","key":"verify","attempt":2,"event_time":"2026-01-01T00:00:03.000Z",'
    '"value":null,"error":"boom"}},"conflicts":[{"kind":"duplicate_changed","branch":"enrich",'
    '"key":"enrich","attempt":1},{"kind":"contract_conflict","branch":null,"key":null,'
    '"contracts":["a","triage"]}],"counts":{"messages":5,"duplicates":1,"superseded":1}}'
)
HAND_LATE = (
    '{"join_id":"h1","reason":"after_deadline","close_reason":"partial","message":{"join_id":"h1",'
    '"branch":"rank","status":"ok","event_time":"2026-01-01T00:01:00Z","x-extra":true}}'
)
HAND_DEAD = (
    '{"error":"invalid_json","detail":"Expecting value: line 1 column 1","raw":"{nope",'
    '"source":{"kind":"file","file":"in.jsonl","line":7}}'
)


def close_obj(i: int, rng: random.Random) -> dict[str, Any]:
    """A valid close (docs/spec.md §5 layout) with varied reason, contract, times and problems."""
    contract = ("triage", "routed", None)[i % 3]
    opened = T0 + i * 37_000
    latency = rng.randint(200, 30_000)
    reason = rng.choice(("complete", "complete", "partial", "timeout"))
    missing = [] if reason == "complete" else [rng.choice(["rank", "verify", "review/legal"])]
    failed = ["verify"] if reason == "timeout" and i % 2 else []
    conflicts = [{"kind": kind, "branch": "rank", "key": "score", "value": 0.1}
                 for kind, every in (("key_conflict", 5), ("unknown_branch", 7),
                                     ("schema_violation", 11)) if i % every == 0]
    return {
        "join_id": f"j{i:04d}", "contract": contract, "run_id": f"run{i % 2}", "reason": reason,
        "opened_at": format_ms(opened), "deadline": format_ms(opened + 30_000),
        "closed_at": format_ms(opened + latency), "latency_ms": latency,
        "required": ["rank", "retrieve", "verify"], "optional": ["enrich"], "pruned": [],
        "missing": missing, "failed": failed, "values": {"score": i / 100},
        "branches": {"retrieve": {"status": "ok", "key": "retrieve", "attempt": 1,
                                  "event_time": format_ms(opened + 10), "value": {"n": i},
                                  "error": None}},
        "conflicts": conflicts, "counts": {"messages": 4, "duplicates": 0, "superseded": 0},
    }


def sample(n: int = 40) -> dict[str, list[dict[str, Any]]]:
    """Deterministic synthetic outputs of every kind."""
    rng = random.Random(7)
    closes = [close_obj(i, rng) for i in range(n)]
    late = [{"join_id": c["join_id"], "reason": ("after_close", "after_deadline")[i % 2],
             "close_reason": c["reason"], "message": {"join_id": c["join_id"], "branch": "rank"}}
            for i, c in enumerate(closes[: n // 4])]
    dead = [{"error": ("invalid_json", "undefined_join", "too_large")[i % 3], "detail": "bad",
             "raw": "{", "source": {"kind": "file", "file": "in.jsonl", "line": i}}
            for i in range(n // 5)]
    return {"closes": closes, "late": late, "dead_letter": dead}


def write_jsonl(root: Path, data: dict[str, list[dict[str, Any]]], run: str = "all") -> None:
    """The files ``fanin run`` would write (one shard, pane 0; ``run``: ``all`` is a bounded
    run's, a streaming one's is its job token)."""
    for kind, objs in data.items():
        folder = root / kind
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{kind}-{run}-p0000-s000.jsonl").write_text(
            "".join(json.dumps(o) + "\n" for o in objs))


def write_parquet(root: Path, data: dict[str, list[dict[str, Any]]], run: str = "all") -> None:
    for kind, objs in data.items():
        parquet.write_parquet(kind, objs, root / kind, f"{kind}-{run}-p0000-s000")


def select(root: Path, sql: str) -> list[tuple]:
    con = query.open_outputs(root)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


# --- schemas -------------------------------------------------------------------------------

def test_schema_columns_follow_the_layout_and_are_stable() -> None:
    assert tables.schema("closes").names == [
        "join_id", "contract", "run_id", "reason", "opened_at", "deadline", "closed_at",
        "latency_ms", "required", "optional", "pruned", "missing", "failed", "values",
        "branches", "conflicts", "counts"]
    assert tables.schema("late").names == ["join_id", "reason", "close_reason", "message"]
    assert tables.schema("dead_letter").names == ["error", "detail", "raw", "source", "raw_base64"]
    assert str(tables.schema("closes").field("closed_at").type) == "timestamp[ms, tz=UTC]"
    first, again = (tables.to_table("closes", sample(10)["closes"]) for _ in range(2))
    assert first.equals(again) and first.schema.serialize() == again.schema.serialize()
    with pytest.raises(ValueError, match="unknown output kind"):
        tables.schema("nope")


def test_to_row_is_lossless_and_strict() -> None:
    row = tables.to_row("closes", json.loads(HAND_CLOSE))
    assert [b["branch"] for b in row["branches"]] == ["retrieve", "verify"]
    assert row["branches"][0]["event_time"] == T0 + 1250
    assert json.loads(row["values"]) == {"docs": ["a", "b"], "score": 0.5}
    assert json.loads(row["conflicts"][1]["extra"] or "null") is None
    extra = tables.to_row("closes", {**json.loads(HAND_CLOSE), "conflicts": [
        {"kind": "open_conflict", "branch": None, "key": None, "new_field": [1]}]})
    assert json.loads(extra["conflicts"][0]["extra"]) == {"new_field": [1]}
    good = json.loads(HAND_CLOSE)
    bad_cases = [
        {k: v for k, v in good.items() if k != "counts"},
        {**good, "surprise": 1},
        {**good, "closed_at": "2026-01-01 00:00:30"},
        {**good, "latency_ms": "30000"},
        {**good, "latency_ms": True},
        {**good, "required": "rank"},
        {**good, "counts": {**good["counts"], "other": 1}},
        {**good, "branches": {"x": {"status": "ok", "colour": "red"}}},
    ]
    for bad in bad_cases:
        with pytest.raises(ValueError):
            tables.to_row("closes", bad)


def test_json_text_columns_spell_numbers_as_the_jsonl_outputs() -> None:
    """docs/spec.md §1 "Numbers": outputs write a double in its shortest form. The JSON-text
    columns (Parquet, BigQuery) wrote the standard encoder's ``1e-07`` where the JSONL line of
    the same close has ``1e-7``; fields stay sorted by name."""
    from fanin.core.outcomes import encode_line

    def by_name(value: Any) -> Any:
        if isinstance(value, dict):
            return {name: by_name(value[name]) for name in sorted(value)}
        return [by_name(item) for item in value] if isinstance(value, list) else value

    values = {"tiny": 1e-7, "huge": 1e16, "neg": -0.0, "tenth": 0.1, "big": 10**30,
              "small": -(2**63) - 1, "nested": {"z": 2.5e-300, "a": [1.0, 1e22]}}
    row = tables.to_row("closes", {**json.loads(HAND_CLOSE), "values": values})
    assert row["values"] == encode_line({"v": by_name(values)})[len('{"v":'):-1]
    assert row["values"].endswith('"tiny":1e-7}') and '"z":2.5e-300}' in row["values"]
    assert json.loads(row["values"]) == values


# --- Parquet -------------------------------------------------------------------------------

def test_parquet_round_trip_and_partitions(tmp_path: Path) -> None:
    objs = sample(10)["closes"] + [json.loads(HAND_CLOSE)]
    objs[0] = {**objs[0], "closed_at": "2026-01-02T00:00:00.001Z"}
    paths = parquet.write_parquet("closes", objs, tmp_path / "closes", "b0")
    assert [Path(p).relative_to(tmp_path).as_posix() for p in paths] == [
        "closes/close_date=2026-01-01/b0.parquet", "closes/close_date=2026-01-02/b0.parquet"]
    back = [r for p in paths for r in pq.read_table(p).to_pylist()]
    assert sorted(back, key=lambda r: r["join_id"]) == sorted(
        tables.to_table("closes", objs).to_pylist(), key=lambda r: r["join_id"])
    assert pq.read_schema(paths[0]).remove_metadata().equals(tables.schema("closes"))
    late = parquet.write_parquet("late", [json.loads(HAND_LATE)], tmp_path / "late", "b0")
    assert late == [str(tmp_path / "late" / "b0.parquet")]
    assert parquet.write_parquet("dead_letter", [], tmp_path / "dead_letter", "b0") == []
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(".")]


def test_atomic_write_writes_under_a_hidden_name(tmp_path: Path) -> None:
    """docs/spec.md §5: a file appears atomically, written under a hidden temporary name (a
    visible ``x.jsonl.tmp-...`` was left by a killed run where users look)."""
    seen: list[str] = []

    def write(fh: Any) -> None:
        seen.extend(p.name for p in tmp_path.iterdir())
        fh.write(b"{}\n")

    atomic_write(tmp_path / "closes-x-p0000-s000.jsonl", write)
    assert len(seen) == 1 and seen[0].startswith(".closes-x-p0000-s000.jsonl.tmp-"), seen
    assert [p.name for p in tmp_path.iterdir()] == ["closes-x-p0000-s000.jsonl"]


def test_atomic_write_leaves_nothing_on_failure(tmp_path: Path) -> None:
    def crash(fh: Any) -> None:
        fh.write(b"PAR1 half")
        raise RuntimeError("disk gone")

    with pytest.raises(RuntimeError):
        atomic_write(tmp_path / "x.parquet", crash)
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_follows_a_link_and_replaces_its_target(tmp_path: Path) -> None:
    """``--out LINK`` (query, report) writes the file the link names and keeps the link; a
    link to no file yet creates its target (it replaced the link by a file before)."""
    (tmp_path / "target.html").write_text("old")
    for link, target in (("link", "target.html"), ("dangling", "new.html")):
        (tmp_path / link).symlink_to(target)
        atomic_write(tmp_path / link, lambda fh: fh.write(b"new"))
        assert (tmp_path / link).is_symlink() and (tmp_path / target).read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "dangling", "link", "new.html", "target.html"]


def test_atomic_write_writes_into_a_pipe_in_place(tmp_path: Path) -> None:
    """A path that is not a regular file (a pipe, ``/dev/stdout``) is written as a shell's
    ``>`` writes it: its reader gets the bytes and the pipe stays a pipe (it was replaced by a
    regular file, and its reader got nothing)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    atomic_write(fifo, lambda fh: fh.write(b"one\n1\n"))
    reader.join(timeout=30)
    assert got == [b"one\n1\n"] and stat.S_ISFIFO(fifo.lstat().st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["fifo"]


def test_atomic_write_to_dev_stdout_appends_to_the_file_the_shell_opened(tmp_path: Path) -> None:
    """``--out /dev/stdout >> F``: written through the descriptor, appended as the shell
    opened it; F was replaced by a new file (what ``>>`` left there lost, and the process's
    later output went to the deleted file). The test names ``/proc/self/fd/1``, where
    ``/dev/stdout`` leads: code that renames onto the path it is given (as the old code did)
    then fails here, where it would replace the machine's ``/dev/stdout`` link."""
    out = tmp_path / "out.txt"
    out.write_text("previous\n")
    code = ("from fanin.io.files import atomic_write; "
            "atomic_write('/proc/self/fd/1', lambda fh: fh.write(b'new\\n')); print('after')")
    with out.open("ab") as stdout:
        subprocess.run([sys.executable, "-c", code], stdout=stdout, check=True, cwd=REPO)
    assert out.read_text() == "previous\nnew\nafter\n"


@pytest.mark.parametrize("via", ["/proc/self/fd/1", "so", "d/1", "d/../d/1"])
def test_atomic_write_to_a_descriptor_writes_where_the_shell_expects_it(
        tmp_path: Path, via: str) -> None:
    """``{ echo header; fanin query ... --out /dev/stdout; echo footer; } > F``: the output is
    written through the process's own descriptor, its offset shared with the shell's writes
    (reopened, it was written at the file's end and the shell's next write overwrote it), also
    reached through a link (``so`` -> /dev/stdout) or a linked folder (``d`` -> /dev/fd; the
    folder's link was missed and F replaced). Code that renames onto what the path resolves
    to replaces F here, never a file of the machine."""
    (tmp_path / "so").symlink_to("/dev/stdout")
    (tmp_path / "d").symlink_to("/dev/fd")
    out = tmp_path / "grp.txt"
    name = via if via.startswith("/") else str(tmp_path / via)
    code = ("import os; from fanin.io.files import atomic_write; os.write(1, b'header\\n'); "
            f"atomic_write({name!r}, lambda fh: fh.write(b'x\\n1\\n')); "
            "os.write(1, b'footer\\n')")
    with out.open("wb") as stdout:
        subprocess.run([sys.executable, "-c", code], stdout=stdout, check=True, cwd=REPO)
    assert out.read_text() == "header\nx\n1\nfooter\n"


def test_atomic_write_refuses_a_folders_name(tmp_path: Path) -> None:
    """A name ending in ``/`` names a folder (it made a file named ``newdir``), also where it
    leads to a descriptor."""
    (tmp_path / "err").symlink_to("/dev/stdout")
    for name in (f"{tmp_path}/newdir/", f"{tmp_path}/err/"):
        with pytest.raises(OSError, match="cannot write"):
            atomic_write(name, lambda fh: fh.write(b"x"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["err"]


# --- BigQuery ------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", tables.KINDS)
def test_bigquery_schema_files_match(kind: str) -> None:
    committed = (REPO / "fanin" / "contracts" / "bigquery" / f"{kind}.json").read_text()
    assert committed == tables.bigquery_schema_text(kind)
    assert [f["name"] for f in json.loads(committed)] == tables.schema(kind).names


def test_bigquery_rows_are_json_and_fit_the_schema() -> None:
    row = tables.to_bigquery_row("closes", json.loads(HAND_CLOSE))
    assert json.loads(json.dumps(row)) == row
    assert row["closed_at"] == "2026-01-01T00:00:30.000Z"
    assert row["branches"][0]["event_time"] == "2026-01-01T00:00:01.250Z"
    assert row["conflicts"][0]["contracts"] == []  # REPEATED is never NULL
    modes = {f["name"]: f["mode"] for f in tables.bigquery_schema("closes")}
    assert modes["required"] == modes["branches"] == "REPEATED" and modes["run_id"] == "NULLABLE"


# --- query views ---------------------------------------------------------------------------

def test_views_identical_for_jsonl_and_parquet_and_each_row_once_with_both(tmp_path: Path) -> None:
    data = sample()
    write_jsonl(tmp_path / "j", data)
    write_parquet(tmp_path / "p", data)
    write_jsonl(tmp_path / "both", data)
    write_parquet(tmp_path / "both", data)
    for kind in tables.KINDS:
        sql = f"SELECT * FROM {kind} ORDER BY ALL"
        assert select(tmp_path / "j", sql) == select(tmp_path / "p", sql) != []
        assert len(select(tmp_path / "both", sql)) == len(data[kind])  # each row once
        describe = f"SELECT column_name, column_type FROM (DESCRIBE {kind})"
        assert select(tmp_path / "j", describe) == select(tmp_path / "p", describe)
        assert [r[0] for r in select(tmp_path / "both", describe)] == tables.schema(kind).names


def test_each_run_counts_once_when_runs_of_one_folder_wrote_different_formats(
        tmp_path: Path) -> None:
    """A subscription's runs add their files to one folder: a later run writing Parquet made
    every earlier run's JSONL files unread (the choice was per folder, not per run)."""
    data = sample(40)
    earlier = {kind: objs[: len(objs) // 2] for kind, objs in data.items()}
    later = {kind: objs[len(objs) // 2:] for kind, objs in data.items()}
    for kind in tables.KINDS:
        write_jsonl(tmp_path, {kind: earlier[kind]}, f"{kind}-0123456789ab-p0000-s000")
        write_jsonl(tmp_path, {kind: later[kind]}, f"{kind}-ba9876543210-p0000-s000")
        write_parquet(tmp_path, {kind: later[kind]}, f"{kind}-ba9876543210-p0000-s000")
    whole = tmp_path.parent / f"{tmp_path.name}-whole"
    write_jsonl(whole, data)
    for kind in tables.KINDS:
        sql = f"SELECT * FROM {kind} ORDER BY ALL"
        assert select(tmp_path, sql) == select(whole, sql) != []


def test_views_exist_for_empty_and_missing_folders(tmp_path: Path) -> None:
    (tmp_path / "closes").mkdir()
    (tmp_path / "closes" / ".hidden.jsonl").write_text("not json\n")
    (tmp_path / "late" / "_temp").mkdir(parents=True)
    (tmp_path / "late" / "_temp" / "x.jsonl").write_text("not json\n")
    full = tmp_path.parent / f"{tmp_path.name}-full"
    write_parquet(full, sample(5))
    for kind in tables.KINDS:
        assert select(tmp_path, f"SELECT count(*) FROM {kind}") == [(0,)]
        describe = f"SELECT column_name, column_type FROM (DESCRIBE {kind})"
        assert select(tmp_path, describe) == select(full, describe)


def test_hand_written_lines_are_queryable(tmp_path: Path) -> None:
    for kind, line in (("closes", HAND_CLOSE), ("late", HAND_LATE), ("dead_letter", HAND_DEAD)):
        (tmp_path / kind).mkdir()
        (tmp_path / kind / f"{kind}-all-p0000-s000.jsonl").write_text(line + "\n\n")
    assert select(tmp_path, "SELECT \"values\"->>'$.score', counts.messages, "
                  "strftime(closed_at, '%Y-%m-%dT%H:%M:%S.%gZ') FROM closes") == [
        ("0.5", 5, "2026-01-01T00:00:30.000Z")]
    assert select(tmp_path, "SELECT b.branch, b.status FROM closes, unnest(branches) AS t(b) "
                  "ORDER BY 1") == [("retrieve", "ok"), ("verify", "error")]
    assert select(tmp_path, "SELECT message->>'$.x-extra', reason FROM late") == [
        ("true", "after_deadline")]
    assert select(tmp_path, "SELECT source->>'$.line' FROM dead_letter") == [("7",)]


def test_malformed_output_line_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "late").mkdir()
    (tmp_path / "late" / "late-all-p0000-s000.jsonl").write_text(
        HAND_LATE + "\n{\"join_id\": 1}\n")
    with pytest.raises(ValueError, match=r"late-all-p0000-s000\.jsonl:2: late: missing keys"):
        query.open_outputs(tmp_path)


# --- read-only -----------------------------------------------------------------------------

REFUSED = [
    "COPY (SELECT 1) TO '{target}'",
    "COPY closes TO '{target}' (FORMAT parquet)",
    "ATTACH '{target}' AS other",
    "INSTALL httpfs",
    "LOAD httpfs",
    "EXPORT DATABASE '{target}'",
    "PRAGMA enable_profiling = 'json'",
    "SET enable_external_access = true",
    "CREATE TABLE t AS SELECT 1",
    "DELETE FROM _closes",
    "SELECT 1; SELECT 2",
    # EXPLAIN ANALYZE runs what it explains
    "EXPLAIN ANALYZE DELETE FROM _closes",
    "explain analyse insert into _late select * from _late",
    "/* a */ EXPLAIN -- b\n /* c */ ANALYZE\n DROP VIEW closes",
    "EXPLAIN (ANALYZE) CREATE TABLE t AS SELECT 1",
    "EXPLAIN ANALYZE (FORMAT JSON) DELETE FROM _closes",
    "EXPLAIN ANALYZE COPY (SELECT 1) TO '{target}'",
]


@pytest.mark.parametrize("sql", REFUSED)
def test_writes_are_refused_and_leave_no_file(tmp_path: Path, sql: str) -> None:
    write_parquet(tmp_path / "out", sample(5))
    target = tmp_path / "x.csv"
    with pytest.raises(query.QueryRefused):
        query.run_query(tmp_path / "out", sql.format(target=target))
    assert not target.exists()


@pytest.mark.parametrize(("sql", "named"), [
    ("pivot late on reason using count(*)", "PIVOT"), ("install httpfs", "INSTALL"),
    ("  create table t as select 1", "CREATE")])
def test_a_refusal_names_the_statement_as_written(tmp_path: Path, sql: str, named: str) -> None:
    """DuckDB's names for these are MULTI and LOAD: the refusal said "not MULTI"."""
    write_parquet(tmp_path, sample(5))
    with pytest.raises(query.QueryRefused) as refused:
        query.run_query(tmp_path, sql)
    assert str(refused.value) == f"only SELECT or EXPLAIN is allowed, not {named}"


@pytest.mark.parametrize("sql", [s for s in REFUSED if "{target}" in s or s.startswith("SET")])
def test_locked_connection_cannot_touch_files(tmp_path: Path, sql: str) -> None:
    """The second layer: even if a statement reaches DuckDB, file access is off and locked."""
    write_parquet(tmp_path, sample(5))
    existing = tmp_path / "closes" / "close_date=2026-01-01" / "closes-all-p0000-s000.parquet"
    con = query.open_outputs(tmp_path)
    for target in (tmp_path / "x.csv", existing):
        with pytest.raises(duckdb.Error):
            con.execute(sql.format(target=target))
    assert not (tmp_path / "x.csv").exists()
    assert pq.read_table(existing).num_rows > 0
    assert con.execute("SELECT count(*) FROM closes").fetchone()[0] == 5  # views still work


def test_explain_of_a_select_runs_and_explain_analyze_changes_nothing(tmp_path: Path) -> None:
    write_parquet(tmp_path, sample(5))
    for sql, plan in (("EXPLAIN SELECT count(*) FROM closes", "physical_plan"),
                      ("/* plan */ explain analyze select count(*) from closes", "analyzed_plan"),
                      ("EXPLAIN (FORMAT JSON) SELECT * FROM late", "physical_plan"),
                      ("EXPLAIN (SELECT count(*) FROM closes)", "physical_plan"),
                      ("EXPLAIN ANALYZE (SELECT 1) UNION ALL (SELECT 2)", "analyzed_plan")):
        rows = list(csv.reader(io.StringIO(query.run_query(tmp_path, sql, "csv"))))
        assert rows[0] == ["explain_key", "explain_value"] and rows[1][0] == plan, sql
    con = query.open_outputs(tmp_path)
    for sql in REFUSED:
        if sql.startswith("EXPLAIN") or "explain" in sql:
            with pytest.raises(query.QueryRefused, match="EXPLAIN is allowed only of a SELECT"):
                query._check_read_only(con, sql.format(target=tmp_path / "x.csv"))
    assert con.execute("SELECT count(*) FROM closes").fetchone() == (5,)


def test_file_readers_are_disabled(tmp_path: Path) -> None:
    write_jsonl(tmp_path, sample(5))
    with pytest.raises(duckdb.Error, match="disabled"):
        query.run_query(tmp_path, "SELECT * FROM read_text("
                        f"'{tmp_path / 'late'}/late-all-p0000-s000.jsonl')")


# --- formats and --out ---------------------------------------------------------------------

def test_csv_json_table_and_out(tmp_path: Path) -> None:
    write_jsonl(tmp_path, sample())
    sql = "SELECT join_id, closed_at, \"values\", missing FROM closes ORDER BY join_id LIMIT 2"
    rows = list(csv.reader(io.StringIO(query.run_query(tmp_path, sql, "csv"))))
    assert rows[0] == ["join_id", "closed_at", "values", "missing"]
    assert rows[1][0] == "j0000" and rows[1][1].endswith("Z") and json.loads(rows[1][2])
    objs = json.loads(query.run_query(tmp_path, sql, "json"))
    assert objs[0]["values"] == {"score": 0.0} and isinstance(objs[0]["missing"], list)
    assert objs[0]["closed_at"] == rows[1][1]
    table = query.run_query(tmp_path, sql)
    assert table.splitlines()[0].split(" | ")[0].strip() == "join_id" and "(2 rows)" in table
    out = tmp_path / "res.json"
    text = query.run_query(tmp_path, sql, "json", out=out)
    assert out.read_text() == text
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "closes", "dead_letter", "late", "res.json"]


def test_json_has_no_nan_or_infinity(tmp_path: Path) -> None:
    """JSON cannot hold NaN or infinities: they are null there; csv and table show them."""
    write_jsonl(tmp_path, sample(5))
    sql = ("SELECT 'nan'::DOUBLE AS a, 1 / 0.0 AS b, -1 / 0.0 AS c, ['nan'::DOUBLE, 2.5] AS d, "
           "0.5 AS e")
    text = query.run_query(tmp_path, sql, "json")
    assert json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in JSON")) == [
        {"a": None, "b": None, "c": None, "d": [None, 2.5], "e": 0.5}]
    assert query.run_query(tmp_path, sql, "csv").splitlines()[1].split(",")[:3] == [
        "NaN", "Infinity", "-Infinity"]


def test_json_text_nan_and_infinity_are_null(tmp_path: Path) -> None:
    """A JSON column holding NaN or an overflowing number (a dead letter's raw, cast) is
    written with null there too: the file stays JSON."""
    write_jsonl(tmp_path, sample(5))
    sql = """SELECT '{"a":NaN,"b":[1e400,-Infinity,2.5]}'::JSON AS j"""
    text = query.run_query(tmp_path, sql, "json")
    assert json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in JSON")) == [
        {"j": {"a": None, "b": [None, None, 2.5]}}]


def test_decimals_keep_their_exact_digits(tmp_path: Path) -> None:
    write_jsonl(tmp_path, sample(5))
    sql = ("SELECT 12345678901234567.89::DECIMAL(38,2) AS d, [1.5::DECIMAL(4,2), 2.25] AS l, "
           "7::DECIMAL(5,1) AS i, 'fanin-decimal-x-0' AS s")
    objs = json.loads(query.run_query(tmp_path, sql, "json"), parse_float=decimal.Decimal)
    assert objs == [{"d": decimal.Decimal("12345678901234567.89"),
                     "l": [decimal.Decimal("1.50"), decimal.Decimal("2.25")],
                     "i": decimal.Decimal("7.0"),
                     "s": "fanin-decimal-x-0"}]
    assert query.run_query(tmp_path, sql, "csv").splitlines()[1] == \
        '12345678901234567.89,"[1.50, 2.25]",7.0,fanin-decimal-x-0'


def test_a_value_nested_too_deeply_to_render_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_jsonl(tmp_path, sample(5))
    deep = "[" * 5000 + "]" * 5000
    assert _cli(["query", str(tmp_path), f"SELECT '{deep}'::JSON AS j", "--format", "json"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nested too deeply to render" in err
    assert _cli(["query", str(tmp_path), f"SELECT '{deep}'::JSON AS j", "--format", "csv"]) == 0


def test_control_characters_reach_no_terminal(tmp_path: Path,
                                              capsys: pytest.CaptureFixture) -> None:
    """Names and values made by whoever publishes messages may hold a terminal's escape
    sequences (retitle, clear, recolour), a newline or a line separator, or a right-to-left
    override (it reversed the rest of the row): the table and the report show them escaped,
    one row a line; csv and json keep them as data."""
    attack = "\x1b]0;PWNED\x07\x1b[2J\x1b[31mbr\nx\x85\t\u2028\u202eab"
    data = sample(5)
    data["closes"][0]["missing"] = [attack]
    data["closes"][0]["branches"]["retrieve"]["error"] = attack
    write_jsonl(tmp_path, data)
    sql = "SELECT join_id, missing, branches[1].error AS e FROM closes ORDER BY join_id LIMIT 1"
    shown = "\\x1b]0;PWNED\\x07\\x1b[2J\\x1b[31mbr\\nx\\x85\\t\\u2028\\u202eab"
    table = query.run_query(tmp_path, sql)
    assert table.splitlines()[2].startswith("j0000") and table.count(shown) == 1
    assert len(table.splitlines()) == 4 and not set(table) & {
        "\x1b", "\x07", "\x85", "\t", "\u2028", "\u202e"}
    assert json.loads(query.run_query(tmp_path, sql, "json"))[0]["e"] == attack
    assert _cli(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"top missing:  {shown} 1" in out and "\x1b" not in out


def test_a_statement_beyond_the_memory_limit_spills_outside_the_working_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DuckDB spilled to ``.tmp`` in the working folder: beside the user's files, and failing
    where that name cannot be made (here a file holds it)."""
    write_jsonl(tmp_path / "out", sample(5))
    work, system_tmp = tmp_path / "work", tmp_path / "system-tmp"
    work.mkdir()
    system_tmp.mkdir()
    (work / ".tmp").write_text("the user's\n")
    monkeypatch.chdir(work)
    monkeypatch.setattr(tempfile, "tempdir", str(system_tmp))
    monkeypatch.setattr(query, "_MEMORY_LIMIT", "64MB")
    sql = ("SELECT m FROM (SELECT md5(i::VARCHAR) AS m FROM range(3000000) t(i)) "
           "ORDER BY m LIMIT 3 OFFSET 1500000")  # the sort holds 3,000,000 texts: ~200 MB
    ranked = sorted(hashlib.md5(str(i).encode()).hexdigest() for i in range(3_000_000))
    assert json.loads(query.run_query(tmp_path / "out", sql, "json")) == [
        {"m": m} for m in ranked[1_500_000:1_500_003]]
    assert sorted(os.listdir(work)) == [".tmp"] and (work / ".tmp").read_text() == "the user's\n"
    assert os.listdir(system_tmp) == []  # the spill folder went with the connection


def test_a_parquet_folder_named_like_a_pattern_is_that_folder(tmp_path: Path) -> None:
    """Folder names holding [, * or ? are names: DuckDB's read_parquet took them as patterns
    (o[x] read the files of ox; r* counted r1's rows as well as its own)."""
    for name, n in (("o[x]", 3), ("ox", 8), ("r*", 4), ("r1", 6), ("q?", 2), ("qq", 5)):
        write_parquet(tmp_path / name, sample(n * 5))
    for name, n in (("o[x]", 3), ("r*", 4), ("q?", 2)):
        assert select(tmp_path / name, "SELECT count(*), count(DISTINCT join_id) FROM closes") \
            == [(n * 5, n * 5)]
        assert select(tmp_path / name, "SELECT count(*) FROM dead_letter") == [(n,)]


def test_a_folder_that_is_not_an_output_is_refused(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "out", sample(5))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x\n")
    (tmp_path / "file-kind").mkdir()
    (tmp_path / "file-kind" / "closes").write_text("")
    (tmp_path / "file-kind" / "late").mkdir()
    for folder, message in ((tmp_path / "other", "not an output folder: it has no closes/"),
                            (tmp_path / "out" / "closes", "not an output folder: it has no"),
                            (tmp_path / "file-kind", r"closes is not a folder")):
        with pytest.raises(ValueError, match=message):
            query.open_outputs(folder)
        with pytest.raises(ValueError, match=message):
            report.build_report(folder)


@pytest.mark.parametrize(("data", "message"), [
    (b"\xff\xfe{}\n", "s000.jsonl:1: 'utf-8' codec can't decode"),
    (HAND_LATE.encode() + b"\n" + b"[" * 5000 + b"]" * 5000 + b"\n",
     "s000.jsonl:2: nested too deeply"),
])
def test_unreadable_output_line_names_file_and_line(tmp_path: Path, data: bytes,
                                                    message: str) -> None:
    (tmp_path / "late").mkdir()
    (tmp_path / "late" / "late-all-p0000-s000.jsonl").write_bytes(data)
    with pytest.raises(ValueError, match=message):
        query.open_outputs(tmp_path)


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fanin")
    cli.add_subcommand(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_errors_are_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_jsonl(tmp_path, sample(5))
    cases = [["query", str(tmp_path / "nope"), "SELECT 1"],
             ["query", str(tmp_path), "SELEC 1"],
             ["query", str(tmp_path), "SELECT * FROM nowhere"],
             ["query", str(tmp_path), "COPY (SELECT 1) TO 'x.csv'"],
             ["query", str(tmp_path), "EXPLAIN ANALYZE DELETE FROM _closes"],
             ["query", str(tmp_path / "closes"), "SELECT 1"],
             ["report", str(tmp_path / "late")],
             ["report", str(tmp_path / "nope")]]
    for argv in cases:
        assert _cli(argv) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1, argv
        assert captured.err.startswith(f"fanin {argv[0]}: error: ")


def test_an_out_file_that_cannot_be_written_is_named_as_given(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_jsonl(tmp_path, sample(5))
    (tmp_path / "afile").write_text("x")
    for argv, shown in ((["query", str(tmp_path), "SELECT 1", "--out", ""], "''"),
                        (["query", str(tmp_path), "SELECT 1", "--out", str(tmp_path)],
                         repr(str(tmp_path))),
                        (["report", str(tmp_path), "--html", str(tmp_path / "afile" / "r.html")],
                         repr(str(tmp_path / "afile" / "r.html")))):
        assert _cli(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"cannot write {shown}" in err and ".tmp-" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "closes", "dead_letter", "late"]


def test_cli_query_and_report(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_jsonl(tmp_path, sample(5))
    assert _cli(["query", str(tmp_path), "SELECT count(*) n FROM closes", "--format", "csv"]) == 0
    assert capsys.readouterr().out == "n\n5\n"
    out = tmp_path / "n.csv"
    assert _cli(["query", str(tmp_path), "SELECT 1 one", "--format", "csv", "--out", str(out)]) == 0
    assert capsys.readouterr().out == "" and out.read_text() == "one\n1\n"
    html = tmp_path / "r.html"
    assert _cli(["report", str(tmp_path), "--html", str(html)]) == 0
    assert "closes:       5" in capsys.readouterr().out and html.is_file()


# --- report --------------------------------------------------------------------------------

CHART_IDS = ["close-reasons", "latency", "missing", "failed", "conflicts", "late", "dead-letters"]


def _sections(html: str) -> dict[str, str]:
    parts = html.split('<section id="chart-')[1:]
    return {p.split('"', 1)[0]: p.split("</section>", 1)[0] for p in parts}


def test_report_every_chart_has_data(tmp_path: Path) -> None:
    write_jsonl(tmp_path, sample())
    write_parquet(tmp_path, sample())  # the same rows in both formats count once
    rep = report.build_report(tmp_path)
    assert rep.rows == {"closes": 40, "late": 10, "dead_letter": 8}
    reasons = rep.chart("close-reasons")
    assert sum(reasons.total(r) for r in ("complete", "partial", "timeout")) == 40
    assert rep.chart("latency").categories == ("(no contract)", "routed", "triage")
    path = tmp_path / "report.html"
    report.write_html(rep, path)
    html = path.read_text()
    sections = _sections(html)
    assert list(sections) == CHART_IDS
    for chart_id, body in sections.items():
        assert "<svg" in body and "<rect" in body and "nodata" not in body, chart_id
    assert html.count("http") == html.count('xmlns="http://www.w3.org/2000/svg"')
    assert "src=" not in html and "<script" not in html and "<link" not in html
    text = report.summary_text(rep)
    assert "closes:       40" in text and "dead letters: 8" in text


def test_report_empty_shows_no_data(tmp_path: Path) -> None:
    for kind in tables.KINDS:  # what a run over no input leaves
        (tmp_path / kind).mkdir()
    rep = report.build_report(tmp_path)
    path = tmp_path / "empty.html"
    report.write_html(rep, path)
    sections = _sections(path.read_text())
    assert list(sections) == CHART_IDS
    assert all('<p class="nodata">No data</p>' in b and "<svg" not in b for b in sections.values())
    assert "latency:      n/a" in report.summary_text(rep)


def test_report_figures_round_halves_away_from_zero(tmp_path: Path) -> None:
    """Python's ``:,.0f`` rounds a half to even: one chart showed a p50 of 14676.5 ms as
    14,676 and one of 3789.5 ms as 3,790."""
    import dataclasses

    from fanin.analysis.svg import whole

    assert [whole(v) for v in (14676.5, 3789.5, 2.5, 0.5, 0.49, -2.5, -0.4, 1234567.5,
                               0.49999999999999994, 2.0**53 + 2, -0.5)] == \
        ["14,677", "3,790", "3", "1", "0", "-3", "0", "1,234,568", "0",
         "9,007,199,254,740,994", "-1"]
    assert [whole(v) for v in (float("nan"), float("inf"))] == ["nan", "inf"]
    for kind in tables.KINDS:
        (tmp_path / kind).mkdir()
    rep = dataclasses.replace(report.build_report(tmp_path), latency=(2.5, 14676.5, 3789.5))
    assert "latency:      p50 3 / p95 14,677 / p99 3,790 ms" in report.summary_text(rep)


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not on PATH")
def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    write_jsonl(tmp_path, sample())
    html = tmp_path / "report.html"
    report.write_html(report.build_report(tmp_path), html)
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "check_report.py"), str(html),
                           str(tmp_path / "shot.png")], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_a_computed_time_keeps_its_microseconds(tmp_path: Path, fmt: str) -> None:
    """A time with digits beyond the millisecond (an average of ``closed_at``s, a literal)
    lost them silently; the outputs' own times keep their three digits."""
    write_jsonl(tmp_path, sample(3))
    sql = ("SELECT TIMESTAMP '2026-01-01 00:00:00.123456' AS fine, "
           "TIMESTAMP '1969-12-31 23:59:59.000250' AS before, min(opened_at) AS own "
           "FROM closes")
    text = query.run_query(tmp_path, sql, fmt)
    for shown in ("2026-01-01T00:00:00.123456Z", "1969-12-31T23:59:59.000250Z",
                  "2026-01-01T00:00:00.000Z"):
        assert shown in text, (shown, text)


@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_an_infinite_time_is_not_shown_as_an_instant(tmp_path: Path, fmt: str) -> None:
    """DuckDB gives an infinite TIMESTAMP WITH TIME ZONE as Python's extreme datetimes, which
    read as 9999-12-31T23:59:59.999999Z and 0001-01-01T00:00:00.000Z; that instant itself
    stays one."""
    write_jsonl(tmp_path, sample(1))
    sql = ("SELECT 'infinity'::TIMESTAMPTZ AS up, '-infinity'::TIMESTAMPTZ AS down, "
           "TIMESTAMPTZ '9999-12-31 23:59:59.999999+00' AS last, min(opened_at) AS own "
           "FROM closes")
    text = query.run_query(tmp_path, sql, fmt)
    cells = json.loads(text)[0] if fmt == "json" else None
    if cells is not None:
        assert (cells["up"], cells["down"], cells["last"]) == (
            "infinity", "-infinity", "9999-12-31T23:59:59.999999Z")
    for shown in ("infinity", "-infinity", "9999-12-31T23:59:59.999999Z"):
        assert text.count(shown) == 1 + (shown == "infinity"), (shown, text)
    assert "0001-01-01" not in text


@pytest.mark.parametrize("first_at, last_at, label, note", [
    # the widest bucket was 3650 days: 1,002 columns, the first labelled year 1 though it
    # started in 10 BC
    ("0001-01-01T00:00:00.000Z", "9999-12-31T23:59:59.999Z", "0001-01-01 00:00:00",
     "bucket: 182500 days"),
    # 59.5 minutes touch 61 one-minute buckets (the count was the span over the width, plus 1)
    ("2026-01-01T00:00:30.000Z", "2026-01-01T01:00:00.000Z", "2026-01-01 00:00:00",
     "bucket: 10 minutes"),
])
def test_the_close_reasons_chart_stays_within_max_buckets(
        tmp_path: Path, first_at: str, last_at: str, label: str, note: str) -> None:
    data = sample(2)
    first, last = data["closes"]
    first["closed_at"], last["closed_at"] = first_at, last_at
    write_jsonl(tmp_path, data)
    reasons = report.build_report(tmp_path).chart("close-reasons")
    assert len(reasons.categories) <= report.MAX_BUCKETS
    assert (reasons.categories[0], reasons.note) == (label, note)
    assert sum(reasons.total(r) for r in ("complete", "partial", "timeout")) == 2


def test_report_figures_are_the_outputs_numbers(tmp_path: Path) -> None:
    """Every chart's figures from outputs written by hand: continuous percentiles overall
    and per contract (README), the narrowest time bucket of at most ``MAX_BUCKETS`` columns,
    late lines by their own reason, the ``TOP_N`` branches most often missing (ties by name),
    and files a hidden name leaves out (``.`` or ``_``: a copy is not counted twice)."""
    rng = random.Random(1)
    closes = []
    for i, (closed, latency) in enumerate(((T0, 1_000), (T0 + 59_000, 2_000))):
        close = close_obj(i, rng)
        close.update(contract="triage", reason="timeout", latency_ms=latency,
                     opened_at=format_ms(closed - latency), closed_at=format_ms(closed),
                     missing=[f"b{i}{n:02d}" for n in range(8)], failed=[])
        closes.append(close)
    late = [{"join_id": "j0000", "reason": "after_close", "close_reason": "complete",
             "message": {"join_id": "j0000", "branch": "rank"}}]
    write_jsonl(tmp_path, {"closes": closes, "late": late, "dead_letter": []})
    written = tmp_path / "closes" / "closes-all-p0000-s000.jsonl"
    shutil.copy(written, tmp_path / "closes" / "_copy.jsonl")
    shutil.copy(written, tmp_path / "closes" / ".copy.jsonl")
    rep = report.build_report(tmp_path)
    assert rep.rows == {"closes": 2, "late": 1, "dead_letter": 0}
    assert rep.latency == (1_500.0, 1_950.0, 1_990.0)
    assert rep.chart("latency").series == (("p50", (1_500.0,)), ("p95", (1_950.0,)),
                                           ("p99", (1_990.0,)))
    assert "latency:      p50 1,500 / p95 1,950 / p99 1,990 ms" in report.summary_text(rep)
    over_time = rep.chart("close-reasons")
    assert over_time.note == "bucket: 1 second" and len(over_time.categories) == 60
    assert rep.chart("late").categories == ("after_close",)
    missing = rep.chart("missing")
    assert missing.categories == tuple(sorted(b for c in closes for b in c["missing"]))[
        :report.TOP_N]
    assert len(missing.categories) == report.TOP_N == 15
