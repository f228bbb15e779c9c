"""``fanin query`` / ``fanin report`` never answer from part of a folder silently, and never
write into the outputs they read: an output folder this user cannot list is one line, exit 2
(it read as zero rows); ``query --out`` inside an output folder is refused (the next query
failed on the file it wrote there); a result beyond 1,000,000 rows is one line; Ctrl-C stops a
running statement with one line, exit 130, and so does one while the outputs load; a closed
standard output is one line, not a traceback."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import fanin.analysis.query as query_module
from fanin.analysis.interrupts import interrupts_held
from fanin.cli import main
from fanin.fleet.simulate import CONTRACTS_PATH

EXAMPLE = str(Path(CONTRACTS_PATH).with_name("triage.jsonl"))
FANIN = str(Path(sys.executable).with_name("fanin"))


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("outputs") / "out"
    assert main(["run", "--input", EXAMPLE, "--contracts", CONTRACTS_PATH, "--output",
                 str(out)]) == 0
    return out


def _as_unprivileged(argv: list[str]) -> list[str]:
    """``argv`` run without the capabilities that let root ignore permission bits."""
    if os.geteuid() != 0:
        return argv
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to drop root's file capabilities"
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search",
            "--inh-caps=-dac_override,-dac_read_search", *argv]


@pytest.mark.parametrize("command", [["query", "select count(*) from closes"], ["report"]])
def test_an_output_folder_this_user_cannot_list_is_one_line(
        outputs: Path, tmp_path: Path, command: list[str]) -> None:
    out = tmp_path / "out"
    shutil.copytree(outputs, out)
    (out / "closes").chmod(0)
    try:
        done = subprocess.run(_as_unprivileged([FANIN, command[0], str(out), *command[1:]]),
                              capture_output=True, text=True, timeout=120, check=False)
    finally:
        (out / "closes").chmod(0o755)
    assert done.returncode == 2, done.stdout
    assert done.stderr.strip().splitlines() == \
        [f"fanin {command[0]}: error: cannot list {out / 'closes'}: Permission denied"]


def test_query_out_inside_the_outputs_is_refused(outputs: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    before = sorted(p.name for p in (outputs / "closes").iterdir())
    target = outputs / "closes" / "count.jsonl"
    assert main(["query", str(outputs), "select count(*) n from closes", "--format", "json",
                 "--out", str(target)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"fanin query: error: --out {target}: is in {outputs / 'closes'}, which holds the "
        "outputs queried; give a file outside it")
    assert sorted(p.name for p in (outputs / "closes").iterdir()) == before


def test_report_html_inside_the_outputs_is_refused(outputs: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """It was written there, and the next query failed on it as a damaged output file."""
    target = outputs / "late" / "report.jsonl"
    assert main(["report", str(outputs), "--html", str(target)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"fanin report: error: --html {target}: is in {outputs / 'late'}, which holds the "
        "outputs queried; give a file outside it")
    assert not target.exists()


@pytest.mark.parametrize("command", [["query", "select 1", "--out"], ["report", "--html"]])
def test_a_cloud_storage_file_without_credentials_is_one_line(
        outputs: Path, tmp_path: Path, command: list[str]) -> None:
    """It retried for minutes with tracebacks (no credentials, no network here)."""
    env = {**os.environ, "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "none.json"),
           "CLOUDSDK_CONFIG": str(tmp_path), "HOME": str(tmp_path)}
    target = "gs://no-such-bucket-fanin/x"
    done = subprocess.run([FANIN, command[0], str(outputs), *command[1:], target],
                          capture_output=True, text=True, timeout=120, check=False, env=env)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"fanin {command[0]}: error: {command[-1]} {target}: no Google credentials to reach "
        "Cloud Storage: set up Application Default Credentials (gcloud auth "
        "application-default login, or GOOGLE_APPLICATION_CREDENTIALS)"]


def test_a_result_beyond_the_row_cap_is_one_line(outputs: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Every row is held to be rendered: ``select * from range(10000000000)`` grew until the
    machine ran out of memory."""
    assert main(["query", str(outputs), "select * from range(1000001)"]) == 2
    assert capsys.readouterr().err.strip() == \
        "fanin query: error: the result has more than 1,000,000 rows: add a LIMIT, or aggregate"
    assert main(["query", str(outputs), "select count(*) from range(1000001)"]) == 0


def test_ctrl_c_stops_a_running_statement_with_one_line(
        outputs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """DuckDB does not see Python's signals while a statement runs: an endless statement
    ignored Ctrl-C and had to be killed. A real SIGINT, sent once the statement's thread is
    there."""
    def interrupt_when_running() -> None:
        while not any(t.name == "fanin-query" for t in threading.enumerate()):
            time.sleep(0.01)  # waits for the thread to exist; no timing depends on it
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_when_running, daemon=True).start()
    endless = "with recursive r(n) as (select 1 union all select n + 1 from r) select max(n) from r"
    assert main(["query", str(outputs), endless]) == 130
    assert capsys.readouterr().err.strip() == "fanin query: interrupted"
    assert not any(t.name == "fanin-query" for t in threading.enumerate())


def test_ctrl_c_while_the_statement_s_thread_starts_is_still_one_line(
        outputs: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C landing in ``Thread.start`` (the thread is there, the statement starting) left
    the statement running; closing the connection then failed as "busy": exit 2 (CI saw it).
    The signal is placed there by a wrapper of ``start`` (a real one cannot be aimed)."""
    start = threading.Thread.start

    def start_then_interrupt(thread: threading.Thread) -> None:
        start(thread)
        if thread.name == "fanin-query":
            raise KeyboardInterrupt

    monkeypatch.setattr(threading.Thread, "start", start_then_interrupt)
    endless = "with recursive r(n) as (select 1 union all select n + 1 from r) select max(n) from r"
    assert main(["query", str(outputs), endless]) == 130
    assert capsys.readouterr().err.strip() == "fanin query: interrupted"


@pytest.mark.parametrize("where", ["footer", "data"])
def test_a_damaged_parquet_file_is_named(outputs: Path, tmp_path: Path, where: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Its error named no file (``Parquet magic bytes not found in footer``; damaged data,
    ``Invalid or corrupted bit_width 255``, is an OSError of pyarrow's)."""
    out = tmp_path / "out"
    shutil.copytree(outputs, out)
    damaged = out / "late" / "late-all-p0000-s000.parquet"
    assert main(["run", "--input", EXAMPLE, "--contracts", CONTRACTS_PATH, "--output",
                 str(tmp_path / "pq"), "--format", "parquet"]) == 0
    capsys.readouterr()
    data = bytearray((tmp_path / "pq" / "late" / damaged.name).read_bytes())
    data[4:36] = b"\xff" * 32  # the first data page's header and values
    damaged.write_bytes(b"PAR1 not really parquet" if where == "footer" else bytes(data))
    assert main(["report", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"fanin report: error: {damaged}: not a readable Parquet file: ")
    assert "\n" not in err


@pytest.mark.parametrize(("value", "why"), [
    ("NaN", "Out of range float values are not JSON compliant"),
    ("-Infinity", "Out of range float values are not JSON compliant"),
    ('"\\ud800"', "not JSON: str is not valid UTF-8: surrogates not allowed")])
def test_a_value_that_is_not_json_in_a_closes_file_is_named(
        outputs: Path, tmp_path: Path, value: str, why: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A closes file not written by Fanin (edited by hand) holding NaN in a value: it came
    back as null, without a word, since the JSON-text columns are written with orjson (the
    standard encoder refused it); a lone surrogate was a traceback."""
    out = tmp_path / "out"
    shutil.copytree(outputs, out)
    closes = out / "closes" / "closes-all-p0000-s000.jsonl"
    lines = closes.read_text().splitlines()
    first = json.loads(lines[0])
    first["values"] = {"n": "PLACEHOLDER"}
    lines[0] = json.dumps(first).replace('"PLACEHOLDER"', value)
    closes.write_text("\n".join(lines) + "\n")
    assert main(["query", str(out), "select count(*) from closes"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"fanin query: error: {closes}:1: ") and err.endswith(why), err
    assert "\n" not in err


def _signalled_while_duckdb_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first JSONL table of the load handed to DuckDB as a stream whose first batch sends
    this process a real SIGINT: it lands while DuckDB is inside the ``INSERT`` reading it (the
    moment a real Ctrl-C cannot be aimed at)."""
    tables_of = query_module._jsonl_tables

    def signalled(kind: str, files: Any) -> Iterator[Any]:
        for n, table in enumerate(tables_of(kind, files)):
            if n or kind != "closes":
                yield table
                continue

            def batches(table: pa.Table = table) -> Iterator[pa.RecordBatch]:
                os.kill(os.getpid(), signal.SIGINT)
                yield from table.to_batches()

            yield pa.RecordBatchReader.from_batches(table.schema, batches())

    monkeypatch.setattr(query_module, "_jsonl_tables", signalled)


@pytest.mark.parametrize("command", [["query", "select count(*) from closes"], ["report"]])
def test_ctrl_c_while_the_outputs_load_is_one_line(
        outputs: Path, command: list[str], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C landing inside one of DuckDB's calls came out as DuckDB's error ("Query
    interrupted": a traceback; a failed read of the table: one wrong line, exit 2), or left
    the connection busy (its close failed; at exit the process could abort)."""
    _signalled_while_duckdb_reads(monkeypatch)
    assert main([command[0], str(outputs), *command[1:]]) == 130
    assert capsys.readouterr().err.strip() == f"fanin {command[0]}: interrupted"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_interrupts_held_wins_over_another_error_and_restores_the_handler() -> None:
    with pytest.raises(KeyboardInterrupt), interrupts_held() as check:
        os.kill(os.getpid(), signal.SIGINT)
        check_ran = False
        check()  # raises: the Ctrl-C was held until here
        check_ran = True
    assert not check_ran
    with pytest.raises(KeyboardInterrupt), interrupts_held():
        os.kill(os.getpid(), signal.SIGINT)
        raise ValueError("the block's own error")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with interrupts_held() as check:  # nothing held: nothing raised
        check()


@pytest.mark.parametrize("command", [["query", "select 1"], ["report"]])
def test_a_closed_standard_output_is_one_line(outputs: Path, command: list[str]) -> None:
    """Python holds None for a standard output closed at start: a traceback
    (``'NoneType' object has no attribute 'write'``) after the whole statement ran."""
    # the shell closes it (no preexec_fn: a fork of this process, with gRPC's threads, could
    # abort; tests/support/child_env.py)
    done = subprocess.run(["sh", "-c", 'exec "$@" 1>&-', "sh", FANIN, command[0], str(outputs),
                           *command[1:]], stderr=subprocess.PIPE, text=True, timeout=120,
                          check=False)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"fanin {command[0]}: error: standard output is closed: "
        + ("give --out FILE" if command[0] == "query" else "nowhere to print the summary")]


@pytest.mark.parametrize("kind", ["pipe", "link to nothing", "link to a device"])
def test_an_output_name_that_is_not_a_regular_file_is_named(
        outputs: Path, tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    """It was skipped: the query answered from the other files with no word (0 rows)."""
    out = tmp_path / "out"
    shutil.copytree(outputs, out)
    odd = out / "closes" / "closes-all-p0000-s001.jsonl"
    if kind == "pipe":
        os.mkfifo(odd)
    else:
        os.symlink(tmp_path / "gone" if kind == "link to nothing" else "/dev/zero", odd)
    assert main(["query", str(out), "select count(*) from closes"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"fanin query: error: {odd}: not a regular file (a pipe, a device or a link to "
        "nothing): its rows cannot be read")


@pytest.mark.parametrize(("copy", "form"), [
    ("closes/copy.jsonl", "closes/closes-<run>-p<pane>-s<shard>.jsonl"),
    ("closes/old/closes-all-p0000-s000.jsonl", "closes/closes-<run>-p<pane>-s<shard>.jsonl"),
    ("late/closes-all-p0000-s000.jsonl", "late/late-<run>-p<pane>-s<shard>.jsonl"),
    ("closes/backup.parquet",
     "closes/close_date=YYYY-MM-DD/closes-<run>-p<pane>-s<shard>.parquet")])
def test_a_copy_of_an_output_file_is_named_not_counted_twice(
        outputs: Path, tmp_path: Path, copy: str, form: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A file of another name or place was read as one more file of the run: its rows
    counted twice, without a word."""
    out = tmp_path / "out"
    shutil.copytree(outputs, out)
    original = out / "closes" / "closes-all-p0000-s000.jsonl"
    if copy.endswith(".parquet"):
        assert main(["run", "--input", EXAMPLE, "--contracts", CONTRACTS_PATH, "--output",
                     str(tmp_path / "pq"), "--format", "parquet"]) == 0
        original = next((tmp_path / "pq" / "closes").glob("*/*.parquet"))
        capsys.readouterr()
    (out / copy).parent.mkdir(exist_ok=True)
    shutil.copy(original, out / copy)
    assert main(["query", str(out), "select count(*) from closes"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"fanin query: error: {out / copy}: not an output file of fanin run ({form}); a copy "
        "would count its rows twice: move it out of the output folder or hide it (a name "
        "starting with . or _)")
    (out / copy).rename((out / copy).with_name("_" + (out / copy).name))  # hidden: skipped
    assert main(["query", str(out), "select count(*) from closes", "--format", "csv"]) == 0
    assert capsys.readouterr().out.split() == ["count_star()", "40"]


@pytest.mark.parametrize("command", [["query", "select * from closes"], ["report"]])
def test_a_reader_gone_away_is_one_line_exit_1(outputs: Path, command: list[str]) -> None:
    """``| head``: it was exit 2, ``error: [Errno 32] Broken pipe`` (bad use, which it is not)."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written
    try:
        done = subprocess.run([FANIN, command[0], str(outputs), *command[1:]], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=120, check=False)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr.strip().splitlines()) == (
        1, [f"fanin {command[0]}: cannot write its output: Broken pipe"])


def test_a_reader_gone_away_part_way_is_one_line_exit_1(outputs: Path) -> None:
    """``| head -1`` of a long result: the write the closing reader cut short returned part of
    it, and the rest was dropped without a word, exit 0."""
    with subprocess.Popen([FANIN, "query", str(outputs), "select * from range(1000000)",
                           "--format", "csv"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None and child.stderr is not None
        assert child.stdout.readline() == "range\n"  # the reader takes a line and goes
        child.stdout.close()
        assert child.wait(timeout=120) == 1
        assert child.stderr.read().strip().splitlines() == [
            "fanin query: cannot write its output: Broken pipe"]


@pytest.mark.parametrize("command", ["query", "report"])
def test_a_file_given_as_the_output_folder_is_named_a_file(
        tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """It said "no such output directory" of a file that exists (an input file, say)."""
    given = tmp_path / "in.jsonl"
    given.write_text("{}\n")
    argv = [command, str(given), *(["select 1"] if command == "query" else [])]
    assert main(argv) == 2
    assert capsys.readouterr().err == (f"fanin {command}: error: a file, not an output folder: "
                                       f"{given}\n")
    assert main([command, str(tmp_path / "nowhere"), *argv[2:]]) == 2
    assert capsys.readouterr().err == (f"fanin {command}: error: no such output directory: "
                                       f"{tmp_path / 'nowhere'}\n")
    assert main([command, "", *argv[2:]]) == 2  # it read the working folder
    assert capsys.readouterr().err == (f"fanin {command}: error: an empty name is no output "
                                       "folder: give DIR\n")
