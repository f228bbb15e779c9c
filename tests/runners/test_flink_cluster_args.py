"""``fanin flink-cluster``'s numeric options are checked when parsed: bad use is one line and
exit code 2, and nothing starts, stops or is asked (no Flink is needed or started here)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from fanin.cli import main as fanin_main
from fanin.runners import flink_cluster


@pytest.fixture(autouse=True)
def nothing_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Starting, stopping or asking a cluster fails the test."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("flink-cluster acted on bad options")

    monkeypatch.setattr(flink_cluster, "start", refuse)
    monkeypatch.setattr(flink_cluster, "stop", refuse)
    monkeypatch.setattr(flink_cluster.Cluster, "overview", refuse)


@pytest.mark.parametrize("argv", [
    ["start", "--slots", "-1"],
    ["start", "--slots", "0"],
    ["start", "--slots", "99999999999999999999"],
    ["start", "--slots", "two"],
    ["start", "--timeout-s", "-5"],
    ["start", "--timeout-s", "0"],
    ["start", "--timeout-s", "nan"],
    ["start", "--timeout-s", "inf"],
    ["start", "--rest-port", "70000"],
    ["start", "--rest-port", "65534"],  # its RPC and blob ports would pass 65535
    ["start", "--rest-port", "0"],
    ["start", "--pool-port", "65536"],
    ["status", "--rest-port", "-1"],
    ["stop", "--pool-port", "0"],
])
def test_bad_numbers_are_one_line_and_exit_2(argv: list[str], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "fc"
    with pytest.raises(SystemExit) as exited:
        fanin_main(["flink-cluster", *argv, "--dir", str(folder)])
    assert exited.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("fanin: error: argument --") and "Traceback" not in captured.err
    assert argv[1] in lines[0]
    assert captured.out == ""
    assert not folder.exists()


@pytest.mark.parametrize(("argv", "named"), [
    (["start", "--pool-port", "8082"], "--pool-port 8082 is one of the cluster's own ports "
                                       "(--rest-port and the next two: 8081-8083)"),
    (["stop", "--rest-port", "9000", "--pool-port", "9000"], "--pool-port 9000 is one of"),
    (["start", "--dir", "/dev/null"], "--dir '/dev/null' is not a folder"),
    (["start", "--dir", "/dev/null/x"], "--dir '/dev/null/x' is not a folder"),
    (["status", "--dir", ""], "--dir '' is not a folder"),
])
def test_options_that_clash_are_one_line_and_exit_2(argv: list[str], named: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A pool on the JobManager's RPC port: start said ready while its pool had failed to
    bind; a --dir that is a file: exit 1 and "[Errno 20] Not a directory"."""
    assert fanin_main(["flink-cluster", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"fanin: error: {named}") and captured.out == ""
    assert len(captured.err.splitlines()) == 1


def test_the_bounds_themselves_are_accepted() -> None:
    parser = argparse.ArgumentParser(prog="fanin")
    flink_cluster.add_subcommand(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["flink-cluster", "start", "--rest-port", "65533", "--pool-port",
                              "65535", "--slots", "1", "--timeout-s", "0.5"])
    assert (args.rest_port, args.pool_port, args.slots, args.timeout_s) == (65533, 65535, 1, 0.5)
    low = parser.parse_args(["flink-cluster", "status", "--rest-port", "1", "--pool-port", "1"])
    assert (low.rest_port, low.pool_port, low.slots, low.timeout_s) == (1, 1, 2, 90.0)
