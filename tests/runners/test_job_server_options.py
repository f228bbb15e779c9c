"""``fanin run`` passes options that only a job server defines (Flink's, Spark's) to job-server
runners, and refuses them for every other runner (the job server's own check runs on Flink in
``test_parity.py``)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from apache_beam.runners.portability.flink_runner import FlinkRunner
from apache_beam.runners.portability.spark_runner import SparkRunner

from fanin import cli
from fanin.runners.job_server_options import checked_runner, job_server_option_names
from fanin.runners.toolchain import runner_failure, runner_setup_error

EXAMPLES = Path(__file__).resolve().parents[2] / "fanin" / "examples"


@pytest.mark.parametrize("runner", ["--runner=FlinkRunner", "--runner=SparkRunner",
                                    "--runner=PortableRunner", "--runner=flink"])
def test_job_server_runners_take_options_in_every_form(runner: str) -> None:
    unknown = ["--checkpointing_interval=60000", "--max_bundle_size", "50", "--faster",
               "--state_backend=rocksdb"]
    assert job_server_option_names([runner, *unknown], unknown) == [
        "checkpointing_interval", "max_bundle_size", "faster", "state_backend"]


@pytest.mark.parametrize("runner", [[], ["--runner=FnApiRunner"], ["--runner=DirectRunner"],
                                    ["--runner=PrismRunner"], ["--runner=DataflowRunner"],
                                    ["--runner=BundleBasedDirectRunner"], ["--runner=Nonesuch"]])
def test_other_runners_refuse_unknown_options(runner: list[str]) -> None:
    with pytest.raises(ValueError, match=r"^unrecognized arguments: --checkpointing_interval=1$"):
        job_server_option_names([*runner, "--checkpointing_interval=1"],
                                ["--checkpointing_interval=1"])
    with pytest.raises(ValueError, match="does not take options from a job server"):
        checked_runner(runner, ["checkpointing_interval"])


@pytest.mark.parametrize("unknown, bad", [(["-x", "3"], "-x"), (["stray"], "stray"),
                                          (["--a=1", "2"], "2"), (["--a", "1", "2"], "2"),
                                          (["--"], "--"), (["--9lives"], "--9lives")])
def test_what_is_not_an_option_is_refused(unknown: list[str], bad: str) -> None:
    with pytest.raises(ValueError, match=f"^unrecognized argument for FlinkRunner: {bad}$"):
        job_server_option_names(["--runner=FlinkRunner", *unknown], unknown)


@pytest.mark.parametrize(("runner", "cls"), [("FlinkRunner", FlinkRunner),
                                             ("SparkRunner", SparkRunner)])
def test_the_checked_runner_is_the_runner_asked_for(runner: str, cls: type) -> None:
    made = checked_runner([f"--runner={runner}"], ["checkpointing_interval"])
    assert isinstance(made, cls)
    assert type(made).__name__ == runner


def test_fanin_run_refuses_a_job_server_option_for_the_local_runner(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["run", "--input", str(EXAMPLES / "triage.jsonl"), "--contracts",
                  str(EXAMPLES / "contracts.yaml"), "--output", str(tmp_path / "out"),
                  "--runner=FnApiRunner", "--checkpointing_interval=60000"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == \
        "fanin: error: unrecognized arguments: --checkpointing_interval=60000\n"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("runner", "hint"), [
    (["--runner=SparkRunner", "--spark_job_server_jar=http://127.0.0.1:9/spark-js.jar"], ""),
    (["--runner=FlinkRunner", "--flink_job_server_jar=http://127.0.0.1:9/flink-js.jar"],
     " (`fanin setup flink` sets it up, and fanin run then uses it)"),
    # Beam's alias of the same runner (the hint was missing)
    (["--runner=flink", "--flink_job_server_jar=http://127.0.0.1:9/flink-js.jar"],
     " (`fanin setup flink` sets it up, and fanin run then uses it)")])
def test_a_job_server_jar_that_cannot_be_fetched_is_one_line(
        runner: list[str], hint: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Beam fetches a job server's jar that is not a local file when the job starts; when it
    cannot (nothing listens on port 9 here), ``fanin run`` says so in one line, exit 2."""
    code = cli.main(["run", "--input", str(EXAMPLES / "triage.jsonl"), "--contracts",
                     str(EXAMPLES / "contracts.yaml"), "--output", str(tmp_path / "out"),
                     *runner])
    assert code == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("fanin: error:")]
    jar = runner[1].split("=", 1)[1]
    assert len(errors) == 1
    assert errors[0].startswith(f"fanin: error: Unable to fetch remote job server jar at {jar}: ")
    assert errors[0].endswith(hint)
    assert "Traceback" not in err


@pytest.mark.parametrize("runner", ["--runner=PrismRunner", "--runner=prism"])
def test_a_prism_binary_that_cannot_be_fetched_is_one_line(runner: str) -> None:
    """Beam fetches Prism's binary as it fetches a job server's jar, and says so in the same
    words (``prism_runner.py``, ``_download_to_local_path``): the same one line, naming the
    set-up (it was a traceback of 111 lines, exit 1). Offline, Beam would try GitHub, so the
    runner's error is given here as Beam raises it."""
    error = RuntimeError("Unable to fetch remote prism binary at https://github.com/x.zip: "
                         "<urlopen error [Errno -3] Temporary failure in name resolution>")
    assert runner_setup_error(error, [runner]) == (
        "Unable to fetch remote prism binary at https://github.com/x.zip: <urlopen error "
        "[Errno -3] Temporary failure in name resolution> (`fanin setup prism` sets it up, "
        "and fanin run then uses it)")
    assert runner_setup_error(ValueError(str(error)), [runner]) is None
    assert runner_setup_error(RuntimeError("another failure"), [runner]) is None


def test_a_job_service_that_does_not_answer_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A portable runner's job service that takes the connection but never answers: one line,
    exit 2, after ``--job_server_timeout`` (a grpc.FutureTimeoutError traceback, after 300 s
    by default)."""
    with socket.create_server(("127.0.0.1", 0)) as silent:  # listens, never accepts
        port = silent.getsockname()[1]
        code = cli.main(["run", "--input", str(EXAMPLES / "triage.jsonl"), "--contracts",
                         str(EXAMPLES / "contracts.yaml"), "--output", str(tmp_path / "out"),
                         "--runner=PortableRunner", f"--job_endpoint=127.0.0.1:{port}",
                         "--environment_type=LOOPBACK", "--job_server_timeout=1"])
    assert code == 2
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.startswith("fanin: error:")] == [
        f"fanin: error: no job service answered at 127.0.0.1:{port} within 1 s "
        "(--job_endpoint, --job_server_timeout)"]
    assert "Traceback" not in err


def test_a_job_endpoint_that_refuses_connections_is_one_line_at_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing listens at ``--job_endpoint``: one line, exit 2, without Beam's wait of
    ``--job_server_timeout`` (300 s of silence by default)."""
    with socket.create_server(("127.0.0.1", 0)) as free:
        port = free.getsockname()[1]  # closed again: nothing listens there
    code = cli.main(["run", "--input", str(EXAMPLES / "triage.jsonl"), "--contracts",
                     str(EXAMPLES / "contracts.yaml"), "--output", str(tmp_path / "out"),
                     "--runner=PortableRunner", f"--job_endpoint=127.0.0.1:{port}"])
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"fanin: error: --job_endpoint 127.0.0.1:{port}: no job service there "
        "(Connection refused)")


def test_a_job_the_runner_fails_is_one_line_exit_1() -> None:
    """A portable runner failing the job (a Flink cluster gone: Beam raises this after its
    job service reports FAILED, ``portable_runner.py``): one line with the runner's reason,
    exit 1; any other error keeps its traceback."""
    error = RuntimeError("Pipeline job-7_1 failed in state FAILED: java.net.ConnectException: "
                         "Connection refused\n\tat sun.nio.ch.Net.pollConnect(Native Method)")
    assert runner_failure(error, ["--runner=FlinkRunner"]) == (
        "the runner failed the job (FAILED): java.net.ConnectException: Connection refused", 1)
    assert runner_failure(RuntimeError("something else"), ["--runner=FlinkRunner"]) is None
    assert runner_failure(KeyError("x"), ["--runner=FlinkRunner"]) is None
