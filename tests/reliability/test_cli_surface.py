"""Hostile values and environments at the command line (a review of every subcommand's
options): each is one line on stderr and exit code 2 before anything is written, or runs as
documented; none is a traceback, a wait of minutes, or a value silently ignored."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.child_env import same_code_env

from fanin.cli import main
from fanin.fleet.simulate import CONTRACTS_PATH
from tests.reliability.runs import read_jsonl, write_lines

EXAMPLE = str(Path(CONTRACTS_PATH).with_name("triage.jsonl"))
FANIN = [sys.executable, "-c", "import sys; from fanin.cli import main; sys.exit(main())"]
RUN = ["run", "--input", EXAMPLE, "--contracts", CONTRACTS_PATH]


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) >= 1 and "Traceback" not in "\n".join(err)
    return err[-1]


def test_a_disorder_beyond_the_span_of_timestamps_covers_every_line(tmp_path: Path) -> None:
    """``--max-disorder-s 1e308`` is finite, so accepted: its milliseconds overflowed to
    infinity (``OverflowError``, a traceback)."""
    for name, disorder in (("huge", "1e308"), ("all", "1e9")):
        assert main([*RUN, "--output", str(tmp_path / name), "--replay",
                     "--max-disorder-s", disorder]) == 0
    assert read_jsonl(tmp_path / "huge") == read_jsonl(tmp_path / "all")


def test_an_output_folder_name_not_in_utf_8_is_refused_before_anything_is_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It failed in the write step (Beam's log with a traceback, a garbled last line) and left
    a folder marked partial."""
    out = os.fsdecode(os.fsencode(str(tmp_path)) + b"/bad\xff")
    assert main([*RUN, "--output", out]) == 2
    assert _one_line(capsys) == (f"fanin: error: --output {os.fsencode(out)!r}: not UTF-8; "
                                 "Beam names the files it writes in UTF-8")
    assert list(tmp_path.iterdir()) == []


def test_sql_not_in_utf_8_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """DuckDB's parser raised ``TypeError`` (a traceback)."""
    assert main([*RUN, "--output", str(tmp_path / "o")]) == 0
    capsys.readouterr()
    assert main(["query", str(tmp_path / "o"), "select '" + os.fsdecode(b"\xff") + "'"]) == 2
    assert _one_line(capsys) == "fanin query: error: the SQL is not UTF-8 text"


def test_a_stream_on_fnapirunner_is_refused_before_earlier_outputs_are_deleted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--replay --runner=FnApiRunner --overwrite`` deleted the earlier outputs, then failed
    with ``beam:transform:teststream:v1`` (and left the folder marked partial)."""
    out = tmp_path / "o"
    assert main([*RUN, "--output", str(out)]) == 0
    before = read_jsonl(out)
    capsys.readouterr()
    assert main([*RUN, "--output", str(out), "--overwrite", "--replay",
                 "--runner=FnApiRunner"]) == 2
    assert _one_line(capsys) == (
        "fanin: error: FnApiRunner runs bounded input only; a stream (--replay, Pub/Sub) runs "
        "on BundleBasedDirectRunner (the default), PrismRunner or FlinkRunner")
    assert read_jsonl(out) == before
    assert sorted(p.name for p in out.iterdir()) == ["closes", "dead_letter", "late"]


@pytest.mark.parametrize("option", ["--closes-topic", "--late-topic", "--dead-letter-topic",
                                    "--bigquery-dataset"])
def test_an_empty_output_resource_is_refused(tmp_path: Path, option: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """An empty topic or dataset was dropped: the run ended "done" with nothing published."""
    assert main([*RUN, "--output", str(tmp_path / "o"), "--replay", option, ""]) == 2
    assert _one_line(capsys) == (
        "fanin: error: --subscription, --topic, --<kind>-topic and --bigquery-dataset name a "
        "resource: an empty one names none")
    assert not (tmp_path / "o").exists()


def test_a_job_endpoint_that_is_not_host_and_port_is_refused_at_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--job_endpoint=garbage`` waited ``--job_server_timeout`` (minutes) without a word."""
    assert main([*RUN, "--output", str(tmp_path / "o"), "--runner=PortableRunner",
                 "--job_endpoint=garbage"]) == 2
    assert _one_line(capsys) == ("fanin: error: --job_endpoint garbage: give the job service "
                                 "as HOST:PORT (e.g. localhost:8099)")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", ["run", "publish"])
def test_credentials_that_cannot_be_read_name_the_variable(
        tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``GOOGLE_APPLICATION_CREDENTIALS`` naming a folder: a traceback (``IsADirectoryError``)
    from a run; ``fanin publish`` blamed its input file ("cannot read FILE")."""
    monkeypatch.delenv("PUBSUB_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path))
    topic = "projects/my-project/topics/outputs"
    argv = ([*RUN, "--output", str(tmp_path / "o"), "--replay", "--closes-topic", topic]
            if command == "run" else ["publish", "--topic", topic, "--timeout", "5", EXAMPLE])
    assert main(argv) == 2
    line = _one_line(capsys)
    assert line.endswith(f"GOOGLE_APPLICATION_CREDENTIALS={tmp_path}: cannot read it: Is a "
                         "directory"), line


@pytest.mark.parametrize(("argv", "closed", "line"), [
    (["simulate", "--joins", "3", "--out", "-"], 1,
     "fanin simulate: error: standard output is closed: give --out FILE"),
    (["publish", "--topic", "projects/my-project/topics/outputs", "-"], 0,
     "fanin publish: error: standard input is closed: give FILE")])
def test_a_closed_standard_stream_is_one_line(argv: list[str], closed: int, line: str) -> None:
    """Python holds None for a stream closed at start: ``AttributeError`` tracebacks. The
    shell closes it (``N>&-``): a ``preexec_fn`` runs in a fork of this test process, where
    gRPC's poller, loaded by earlier tests, logged ``epoll_wait error: Bad file descriptor``
    into the child's standard error now and then."""
    env = {**same_code_env(), "PUBSUB_EMULATOR_HOST": "127.0.0.1:1"}
    done = subprocess.run(["sh", "-c", f'exec "$@" {closed}>&-', "sh", *FANIN, *argv],
                          stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, timeout=120, check=False, env=env)
    assert (done.returncode, done.stderr.strip().splitlines()) == (2, [line])


def test_a_huge_disorder_covers_lines_from_year_9999_back_to_year_1(tmp_path: Path) -> None:
    """The widest disorder a file can have: a replay covering it gives the bounded run."""
    lines = [{"kind": "open", "join_id": "late-era", "opened_at": "9999-12-31T23:59:00Z",
              "required": ["a"], "deadline_s": 30},
             {"join_id": "late-era", "branch": "a", "status": "ok",
              "event_time": "9999-12-31T23:59:01Z"},
             {"kind": "open", "join_id": "early-era", "opened_at": "0001-01-01T00:00:00Z",
              "required": ["a", "b"], "deadline_s": 30},
             {"join_id": "early-era", "branch": "a", "status": "ok",
              "event_time": "0001-01-01T00:00:01Z"},
             {"join_id": "early-era", "branch": "b", "status": "ok",
              "event_time": "0001-01-01T00:00:02Z"}]
    data = write_lines(tmp_path / "eras.jsonl", [json.dumps(line) for line in lines])
    base = ["run", "--input", str(data), "--close-trigger", "watermark"]
    assert main([*base, "--output", str(tmp_path / "bounded")]) == 0
    assert main([*base, "--output", str(tmp_path / "replay"), "--replay",
                 "--max-disorder-s", "1e308"]) == 0
    assert read_jsonl(tmp_path / "replay") == read_jsonl(tmp_path / "bounded")
    assert len(read_jsonl(tmp_path / "bounded")["closes"]) == 2


def test_a_locale_that_cannot_spell_a_file_name_escapes_the_message_not_the_data(
        tmp_path: Path) -> None:
    """With ``PYTHONIOENCODING=ascii``, ``fanin simulate``'s summary naming ``é.jsonl`` was a
    ``UnicodeEncodeError`` traceback after the file was written, and ``fanin query`` refused a
    result holding ``é``. The message is escaped; the query's result stays exact UTF-8."""
    env = {**same_code_env(), "PYTHONIOENCODING": "ascii"}
    data = tmp_path / "é.jsonl"
    done = subprocess.run([*FANIN, "simulate", "--joins", "2", "--out", str(data)],
                          capture_output=True, timeout=120, check=False, env=env)
    assert (done.returncode, done.stderr) == (0, b"")
    assert done.stdout.startswith(b"fanin simulate: wrote " + os.fsencode(tmp_path) +
                                  b"/\\xe9.jsonl: ")
    write_lines(data, ['{"kind": "open", "join_id": "j\\u00e9", "required": ["a"], '
                       '"opened_at": "2026-01-01T00:00:00Z"}'])
    assert main([*RUN[:2], str(data), "--output", str(tmp_path / "o")]) == 0
    done = subprocess.run([*FANIN, "query", str(tmp_path / "o"), "select join_id from closes",
                           "--format", "csv"],
                          capture_output=True, timeout=120, check=False, env=env)
    assert (done.returncode, done.stdout, done.stderr) == (0, "join_id\njé\n".encode(), b"")


def test_a_dash_names_standard_output_for_query_and_report(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``--out -`` and ``--html -`` wrote files named ``-`` in the working folder; ``-`` is
    standard output, as for ``fanin simulate --out -``: the HTML there, the summary on
    standard error."""
    assert main([*RUN, "--output", str(tmp_path / "o")]) == 0
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["query", "o", "select count(*) as n from closes", "--format", "csv",
                 "--out", "-"]) == 0
    assert capsys.readouterr().out == f"n\n{len(read_jsonl(tmp_path / 'o')['closes'])}\n"
    assert main(["report", "o", "--html", "-"]) == 0
    shown = capsys.readouterr()
    assert shown.out.startswith("<!DOCTYPE html>") and shown.out.endswith("</html>\n")
    assert shown.err.startswith("Fanin outputs in o\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]


@pytest.mark.parametrize(("runner", "reason"), [
    ("nosuch.module.Runner", "cannot import nosuch.module: No module named 'nosuch'"),
    ("apache_beam.runners.NoSuchRunner", "apache_beam.runners has no NoSuchRunner"),
    ("apache_beam.pvalue.PCollection", "not a Beam runner class (a subclass of "
     "apache_beam.runners.runner.PipelineRunner)"),
    ("", "an empty name names no runner; leave it out for the local runner"),  # it ran locally
    (" ", "an empty name names no runner; leave it out for the local runner")])
def test_a_runner_module_path_that_names_no_runner_is_one_line(
        tmp_path: Path, runner: str, reason: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Beam imported it while the job was built: ``ModuleNotFoundError``, ``AttributeError``
    or ``TypeError`` tracebacks, exit 1."""
    assert main([*RUN, "--output", str(tmp_path / "o"), f"--runner={runner}"]) == 2
    assert _one_line(capsys) == f"fanin: error: --runner{runner.strip() and ' '}" \
        f"{runner.strip()}: {reason}"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("runner", "named"), [
    ([], "BundleBasedDirectRunner"), (["--runner=DirectRunner"], "DirectRunner"),
    (["--runner", "direct"], "DirectRunner"),
    (["--runner=SwitchingDirectRunner"], "SwitchingDirectRunner")])
def test_workers_the_local_streaming_runner_would_ignore_are_refused(
        tmp_path: Path, runner: list[str], named: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--replay --direct_num_workers=2`` ran on one worker without a word."""
    assert main([*RUN, "--output", str(tmp_path / "o"), "--replay", *runner,
                 "--direct_num_workers=2"]) == 2
    assert _one_line(capsys) == (
        f"fanin: error: --direct_num_workers=2 applies to bounded runs (FnApiRunner); a "
        f"stream on {named} runs one worker and would ignore it")
    assert list(tmp_path.iterdir()) == []
    if not runner:  # one worker is what it runs: accepted
        assert main([*RUN, "--output", str(tmp_path / "o"), "--replay",
                     "--direct_num_workers=1"]) == 0


@pytest.mark.parametrize(("option", "value", "rule"), [
    ("--deadline-s", "-1", "must be a finite number > 0"),
    ("--retention-s", "nan", "must be a finite number >= 0")])
def test_a_join_default_out_of_range_is_named_as_the_option(
        tmp_path: Path, option: str, value: str, rule: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The line named the contracts file's field (``deadline_s``), not the option given."""
    assert main([*RUN, "--output", str(tmp_path / "o"), option, value]) == 2
    assert _one_line(capsys) == f"fanin: error: {option} {rule}"


@pytest.mark.parametrize("closed", ["2>&-", "0<&- 2>&-"])
def test_a_run_with_standard_error_closed_runs(tmp_path: Path, closed: str) -> None:
    """Python holds None for it: the first log line failed (a traceback no one saw, exit 1,
    nothing written), and the output folder's lock took descriptor 2."""
    out = tmp_path / "out"
    done = subprocess.run(["sh", "-c", f'exec "$@" {closed}', "sh", *FANIN, *RUN, "--output",
                           str(out)], capture_output=True, text=True, timeout=120,
                          env=same_code_env(), check=False)
    assert (done.returncode, done.stdout) == (0, "")
    assert sorted(os.listdir(out)) == ["closes", "dead_letter", "late"]  # no mark left
    assert len(read_jsonl(out)["closes"]) == 40
