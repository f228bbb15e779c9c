"""The output folder of a local run (docs/reliability.md "One run per output folder"):

- a run holds its folder: a second run on it (from any process) is refused in one line, exit
  2, before it checks, deletes or writes anything; once the first ends, the second runs;
- a run that stops before its end leaves a mark that ``fanin query`` / ``fanin report`` warn
  about; Ctrl-C inside a step is one line and exit 130, a failing write one line and exit 1;
- ``--overwrite`` of a folder whose output subfolder is a symbolic link empties the link's
  target and keeps the link.
"""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fanin.cli import main
from fanin.fleet.simulate import CONTRACTS_PATH

EXAMPLE = str(Path(CONTRACTS_PATH).with_name("triage.jsonl"))
KINDS = ("closes", "late", "dead_letter")


def _run(out: Path, *extra: str) -> list[str]:
    return ["run", "--input", EXAMPLE, "--contracts", CONTRACTS_PATH, "--output", str(out),
            *extra]


def _files(out: Path) -> dict[str, bytes]:
    """Every file under ``out`` (through linked folders) by relative path."""
    return {os.path.relpath(os.path.join(root, name), out):
            Path(root, name).read_bytes()
            for root, _, names in os.walk(out, followlinks=True) for name in names}


def test_a_run_on_a_folder_another_process_holds_is_refused_and_changes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(_run(out)) == 0
    before = _files(out)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from fanin.io.output_lock import OutputLock; "
         "OutputLock.acquire(sys.argv[1]); print('held', flush=True); sys.stdin.read()",
         str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        capsys.readouterr()
        assert main(_run(out, "--overwrite")) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"fanin: error: --output {out}: another fanin run is writing there "
                       f"(process {holder.pid}); wait for it to end, or choose another folder"]
        assert _files(out) == {**before, ".fanin-run": _files(out)[".fanin-run"]}
        assert main(["report", str(out)]) == 0
        assert "still writing" in capsys.readouterr().err
    finally:
        holder.communicate("")
    assert main(_run(out, "--overwrite")) == 0  # the holder ended: its lock went with it
    assert _files(out) == before


def _ctrl_c(*_: Any) -> Any:
    """Stands for what the user's Ctrl-C interrupts (a test double: a signal cannot be timed
    against a step without sleeps)."""
    raise KeyboardInterrupt


def test_ctrl_c_inside_a_step_is_one_line_and_exit_130(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from fanin.transforms import join_bounded

    monkeypatch.setattr(join_bounded.CloseGroups, "process", _ctrl_c)
    out = tmp_path / "out"
    assert main(_run(out)) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == \
        f"fanin: interrupted: {out} holds partial outputs (run again with --overwrite)"
    assert main(["query", str(out), "select count(*) from closes"]) == 0
    assert "stopped before its end" in capsys.readouterr().err


def test_ctrl_c_before_the_run_wrote_anything_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Interrupted at submission (nothing written): no claim of partial outputs, no mark."""
    import apache_beam as beam

    monkeypatch.setattr(beam.Pipeline, "run", _ctrl_c)
    out = tmp_path / "out"
    assert main(_run(out)) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        "fanin: interrupted before it wrote anything"
    assert not out.exists()  # as it was: no output folders, nor the folder they were in


def test_a_job_that_fails_before_it_wrote_anything_leaves_no_empty_outputs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """It left empty closes/, late/ and dead_letter/ folders without the mark: ``fanin query``
    then counted 0 closes, as of a finished run with no joins."""
    import apache_beam as beam

    def fails(*_: Any) -> Any:
        raise ValueError("the job failed")

    monkeypatch.setattr(beam.Pipeline, "run", fails)
    out = tmp_path / "out"
    assert main(_run(out)) == 2
    assert not out.exists()
    out.mkdir()  # a folder that held something is left, emptied of what the run made only
    (out / "notes.txt").write_text("mine")
    assert main(_run(out)) == 2
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_ctrl_c_while_it_starts_is_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C before the job is built (Beam's options read, its modules loading): one line,
    exit 130, where it was a traceback."""
    import fanin.cli

    monkeypatch.setattr(fanin.cli, "_unknown_beam_args", _ctrl_c)
    out = tmp_path / "out"
    assert main(_run(out)) == 130
    assert capsys.readouterr().err == "fanin: interrupted\n"
    assert not out.exists()


def test_overwrite_then_a_refusal_at_submission_keeps_the_mark(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--overwrite`` emptied the folders, then the job was refused: the empty folder is not
    a finished run's, and readers are told."""
    import apache_beam as beam

    out = tmp_path / "out"
    assert main(_run(out)) == 0

    def refused(*_: Any) -> Any:
        raise ValueError("the job service refused the job")

    monkeypatch.setattr(beam.Pipeline, "run", refused)
    assert main(_run(out, "--overwrite")) == 2
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    assert "stopped before its end" in capsys.readouterr().err


def test_the_mark_of_a_subscriptions_unfinished_run_says_to_run_it_again(tmp_path: Path) -> None:
    """Its files join an earlier run's, whose messages were acknowledged: --overwrite would
    delete them."""
    from fanin.io.output_lock import OutputLock, state_warning

    OutputLock.acquire(str(tmp_path), continues=True).release()
    assert state_warning(str(tmp_path)) == (
        f"{tmp_path}: the fanin run that wrote this folder stopped before its end (interrupted, "
        "killed or failed); its outputs are partial: the Pub/Sub messages it had received and "
        "not written are missing (the local runner acknowledges a message when it pulls it); "
        "the next run of the subscription receives the rest, and its files join these")


def test_a_subscriptions_next_run_keeps_the_mark_of_the_messages_lost_before_it(
        tmp_path: Path) -> None:
    """The next run finishing deleted the mark: ``fanin query`` no longer warned that the
    failed run's acknowledged messages were missing. ``--overwrite`` (emptied) clears it."""
    from fanin.io.output_lock import OutputLock, folder_state, state_warning

    folder = str(tmp_path)
    OutputLock.acquire(folder, continues=True).release()  # failed or killed
    OutputLock.acquire(folder, continues=True).finish()  # the next run finished
    expected = (f"{folder}: an earlier fanin run on this folder stopped before its end "
                "(interrupted, killed or failed): the Pub/Sub messages it had received and not "
                "written are missing from these outputs (the local runner acknowledges a "
                "message when it pulls it); later runs' files joined these (delete "
                f"{tmp_path / '.fanin-run'} to stop this warning)")
    assert state_warning(folder) == expected
    OutputLock.acquire(folder, continues=True).finish()  # and the one after it
    assert state_warning(folder) == expected
    emptied = OutputLock.acquire(folder, continues=True)
    emptied.mark_changed()  # --overwrite emptied the folder
    emptied.finish()
    assert folder_state(folder) is None
    OutputLock.acquire(folder, continues=False).release()  # a bounded run that failed...
    OutputLock.acquire(folder, continues=False).finish()  # ...run again, finished
    assert folder_state(folder) is None
    OutputLock.acquire(folder, continues=False).release()  # a bounded run that failed, then
    OutputLock.acquire(folder, continues=True).finish()  # a subscription's run: nothing lost
    assert folder_state(folder) is None
    OutputLock.acquire(folder, continues=True).release()
    # --overwrite of a folder whose files were deleted by hand
    OutputLock.acquire(folder, continues=True, overwrite=True).finish()
    assert folder_state(folder) is None


@pytest.mark.parametrize("inside", ["closes/sub", "late", "dead_letter/a/b"])
def test_a_run_into_an_earlier_runs_output_folder_is_refused(
        tmp_path: Path, inside: str, capsys: pytest.CaptureFixture[str]) -> None:
    """It ran: fanin query on the earlier folder then read the nested run's files as its own
    (or refused them), and its --overwrite deleted them."""
    earlier = tmp_path / "earlier"
    assert main(_run(earlier)) == 0
    before = _files(earlier)
    capsys.readouterr()
    assert main(_run(earlier / inside, "--overwrite")) == 2
    kind = inside.split("/")[0]
    assert capsys.readouterr().err == (
        f"fanin: error: --output {earlier / inside} is in {earlier / kind}, an output folder "
        "of an earlier run: fanin query would read its files as that run's, and its "
        "--overwrite delete them; give a folder outside it\n")
    assert _files(earlier) == before
    assert main(_run(tmp_path / "closes" / "fresh")) == 0  # a folder named closes: no outputs


def test_a_busy_folder_is_named_busy_before_any_other_refusal(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The early check of the folder told a second run to pass --overwrite."""
    from fanin.io.output_lock import OutputLock

    out = tmp_path / "out"
    assert main(_run(out)) == 0
    holder = OutputLock.acquire(str(out))
    try:
        capsys.readouterr()
        assert main(_run(out)) == 2
        assert capsys.readouterr().err.strip() == (
            f"fanin: error: --output {out}: another fanin run is writing there (process "
            f"{os.getpid()}); wait for it to end, or choose another folder")
    finally:
        holder.finish()


@pytest.mark.parametrize("mode", [(), ("--replay",)])
def test_a_refused_output_folder_is_one_line_also_for_a_replay(
        tmp_path: Path, mode: tuple[str, ...], capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    """A replay built its plan (a warning, a log line) before the folder was refused."""
    out = tmp_path / "out"
    assert main(_run(out, *mode)) == 0
    (tmp_path / "afile").write_text("")
    capsys.readouterr()
    caplog.clear()
    for target, error in ((out, f"{out} already holds outputs; pass --overwrite to replace "
                                "them"),
                          (tmp_path / "afile" / "x",
                           f"--output: {tmp_path / 'afile'} is a file, not a folder")):
        assert main(_run(target, *mode)) == 2
        assert capsys.readouterr().err.strip() == f"fanin: error: {error}"
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO
            and r.name.startswith("fanin")] == []


def test_a_folder_holding_only_other_files_is_named_with_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It said "already holds outputs; pass --overwrite", which deletes the user's files."""
    out = tmp_path / "out"
    (out / "late").mkdir(parents=True)
    (out / "late" / "notes.txt").write_text("mine\n")
    (out / "late" / "sub").mkdir()
    assert main(_run(out)) == 2
    assert capsys.readouterr().err == (
        f"fanin: error: {out / 'late'} holds files that are not outputs of fanin run (notes.txt "
        "and 1 more), which --overwrite would delete: move them out of it\n")
    assert (out / "late" / "notes.txt").read_text() == "mine\n"


def test_a_named_pipe_where_the_mark_goes_blocks_no_reader(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(_run(out)) == 0
    os.mkfifo(out / ".fanin-run")
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main(_run(out, "--overwrite")) == 2
    assert capsys.readouterr().err.strip() == \
        f"fanin: error: --output {out}: .fanin-run there is not a file; remove it"


@pytest.mark.parametrize(("where", "mode"), [("finalize", ()), ("spill", ()),
                                             ("spill", ("--replay",))])
def test_a_write_the_disk_refuses_is_one_line_and_exit_1(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, mode: tuple[str, ...],
        capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    """The full disk where the finalize moves a shard's file into place (Beam re-raises it as
    a RuntimeError), and inside ``atomic_write`` when a bundle spills (an OSError again); on
    the local streaming runner too, where Beam logged each of its four tries of the bundle
    with a traceback (some 700 lines before the one line)."""
    from fanin.io import files
    from fanin.transforms import write

    def full(*_: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(write if where == "finalize" else files, "atomic_move", full)
    out = tmp_path / "out"
    assert main(_run(out, *mode)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("fanin: error: the job failed reading or writing files: ")
    assert "No space left on device" in err[-1]
    assert [r.getMessage()[:80] for r in caplog.records
            if r.name.startswith("apache_beam") and r.levelno >= logging.WARNING] == []
    if where == "finalize":
        assert main(["report", str(out)]) == 0
        assert "stopped before its end" in capsys.readouterr().err
    else:  # the spill failed before any file was written: the folder is as it was
        assert not out.exists()


def test_overwrite_empties_a_linked_output_folder_and_keeps_the_link(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(_run(out)) == 0
    expected = _files(out)
    elsewhere = tmp_path / "elsewhere"
    (out / "dead_letter").rename(elsewhere)
    os.symlink(elsewhere, out / "dead_letter")
    (elsewhere / "stale.jsonl").write_text('{"old": 1}\n')
    assert main(_run(out, "--overwrite")) == 0, capsys.readouterr().err
    assert (out / "dead_letter").is_symlink()
    assert "stale.jsonl" not in os.listdir(elsewhere)
    assert _files(out) == expected


@pytest.mark.parametrize(("stop", "marked"), [(SystemExit(130), True),
                                               (KeyboardInterrupt(), False)])
def test_a_drain_aborted_by_a_second_signal_keeps_the_mark(
        tmp_path: Path, stop: BaseException, marked: bool) -> None:
    """A subscription run whose drain a second signal aborts (``SystemExit``) wrote no file,
    yet the joins it held were read and acknowledged (and an output topic may hold some of
    their closes): the folder keeps its mark, where it read as a finished run. A run stopped
    otherwise before writing anything leaves the folder unmarked."""
    from fanin.io.output_lock import UNFINISHED, OutputLock, folder_state
    from fanin.pipelines.output_folder import files_in
    from fanin.pipelines.pipeline import _stopped

    out = str(tmp_path / "out")
    lock = OutputLock.acquire(out, continues=True)
    _stopped(stop, None, lock, files_in(out), out, ())
    assert (folder_state(out) == UNFINISHED) is marked


def _record(message: str, *args: object, name: str = "apache_beam.runners.direct.executor",
            error: BaseException | None = None) -> logging.LogRecord:
    return logging.LogRecord(name, logging.WARNING, __file__, 1, message, args,
                             (type(error), error, None) if error else None)


def test_only_a_step_s_file_failure_is_left_out_of_beam_s_log() -> None:
    """The filter that keeps a failed write to one line dropped every Beam warning logged near
    an OSError: a network call's retries, a job service's timeout."""
    from fanin.runners.reported_failures import ReportedFailures

    _reported_by_fanin = ReportedFailures().filter
    step = OSError("cannot write 'o/closes/x.jsonl': No space left on device "
                   "[while running 'Write/closes/WriteFiles']")
    assert not _reported_by_fanin(_record("A task failed with exception: %s", step))
    assert not _reported_by_fanin(_record("a step failed", error=step))
    try:
        raise step
    except OSError:  # the executor's "Giving up after 4 attempts." is logged while handling it
        assert not _reported_by_fanin(_record("Giving up after %s attempts.", 4))
    try:
        raise ConnectionResetError("connection reset by peer")
    except OSError:
        assert _reported_by_fanin(_record("Retry with exponential backoff: %s", "x",
                                          name="apache_beam.utils.retry"))
    assert _reported_by_fanin(_record("timed out waiting for the job service",
                                      error=TimeoutError("deadline")))
    assert _reported_by_fanin(_record("Job failed: %s", RuntimeError(
        "OutOfMemoryError [while running 'Join']")))  # not a file
    assert _reported_by_fanin(_record("%s", step, name="fanin.transforms.write"))  # not Beam's


@pytest.mark.parametrize(("option", "value", "error"), [
    ("--shards", "1001", "--shards must be from 1 to 1000"),
    ("--shards", "0", "--shards must be from 1 to 1000"),
])
def test_a_setting_out_of_range_names_itself(
        tmp_path: Path, option: str, value: str, error: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--shards 1001`` said "--window-s must be > 0 and at most 86400 ..."."""
    assert main(_run(tmp_path / "out", option, value)) == 2
    assert capsys.readouterr().err.strip() == f"fanin: error: {error}"


@pytest.mark.parametrize("victim", ["late/late-all-p0000-s000.jsonl", "closes/close_date=",
                                    "dead_letter"])
def test_overwrite_that_the_system_refuses_for_one_entry_deletes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, victim: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--overwrite`` checked only that each folder was writable: a file another user owns in
    a folder with the sticky bit, or one made immutable (``chattr +i``), could not be deleted,
    so it deleted the outputs before it (the closes: 2.7 MB in the review's run), then
    refused. Now it refuses with every earlier output in place (the system's refusal is
    injected for one entry: a file, a Parquet partition folder, an output folder's first
    entry after others moved), and a run it allows leaves no hidden folder behind."""
    out = tmp_path / "out"
    formats = ("--format", "jsonl", "--format", "parquet")
    assert main(_run(out, *formats)) == 0
    before = _files(out)
    real_rename = os.rename

    def refuses(source: str, target: str) -> None:
        name = os.path.relpath(source, out)
        if name.startswith(victim) and ".fanin-replaced-" in target:
            raise PermissionError(errno.EPERM, "Operation not permitted", source)
        real_rename(source, target)

    monkeypatch.setattr(os, "rename", refuses)
    capsys.readouterr()
    assert main(_run(out, "--overwrite", *formats)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fanin: error: --overwrite: cannot delete "
                                               f"{out / victim}")
    assert err[0].endswith(": Operation not permitted; nothing was deleted")
    assert _files(out) == before  # no mark either: the folder is as it was
    assert sorted(p.name for p in out.rglob(".fanin-*")) == []
    monkeypatch.setattr(os, "rename", real_rename)
    assert main(_run(out, "--overwrite", *formats)) == 0
    assert _files(out) == before
    assert sorted(p.name for p in out.rglob(".fanin-*")) == []


def test_names_the_user_gave_reach_the_terminal_escaped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An output folder's or an input's name holding an escape sequence or a newline was
    printed raw in the summary and the error lines (query's table already escaped them)."""
    out = tmp_path / "o\x1b]0;PWNED\x07\nX"
    assert main(_run(out)) == 0
    done = capsys.readouterr().err.strip().splitlines()[-1]
    assert done.endswith(f"outputs in {tmp_path}/o\\x1b]0;PWNED\\x07\\nX/{{closes,late,"
                         "dead_letter}/")
    missing = tmp_path / "in\u202egol.jsonl"
    assert main(["run", "--input", str(missing), "--output", str(tmp_path / "o2")]) == 2
    assert capsys.readouterr().err == (
        f"fanin: error: input matches no file: {tmp_path}/in\\u202egol.jsonl\n")
    assert main(["simulate", "--joins", "1", "--out", str(tmp_path / "s\x1b[2J.jsonl")]) == 0
    assert capsys.readouterr().out.startswith(f"fanin simulate: wrote {tmp_path}/s\\x1b[2J.jsonl: ")


def test_a_run_refused_once_it_holds_the_folder_removes_the_folder_it_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The input gone between the job's build and the lock (deleted by another program): one
    line, exit 2, and the output folder the run had made was left, empty."""
    import fanin.pipelines.output_folder as output_folder

    def gone(patterns: Any) -> list[str]:
        raise FileNotFoundError(f"input matches no file: {patterns[0]}")

    monkeypatch.setattr(output_folder, "expand_inputs", gone)
    out = tmp_path / "new" / "out"
    assert main(_run(out)) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        f"fanin: error: input matches no file: {EXAMPLE}"
    assert not out.exists()


def test_overwrite_of_a_file_another_user_owns_in_a_sticky_folder_deletes_nothing(
        tmp_path: Path) -> None:
    """The review's case, for real: ``late/`` with the sticky bit and its file owned by
    another user (``nobody``); the run, without root's power over files (``setpriv``), may
    write in every folder but not delete that file. It deleted the closes and the dead letters
    first, then refused."""
    import shutil

    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to drop root's file capabilities"
    out = tmp_path / "out"
    assert main(_run(out)) == 0
    late = out / "late"
    late.chmod(0o1777)
    for path in (late, *late.iterdir()):
        os.chown(path, 65534, -1)
    before = _files(out)
    caps = "-dac_override,-dac_read_search,-fowner"
    done = subprocess.run(
        [setpriv, f"--inh-caps={caps}", f"--bounding-set={caps}",
         str(Path(sys.executable).with_name("fanin")), *_run(out, "--overwrite")],
        capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"fanin: error: --overwrite: cannot delete {late / 'late-all-p0000-s000.jsonl'}: "
        "Operation not permitted; nothing was deleted")
    assert _files(out) == before


def test_a_run_refused_because_another_holds_the_folder_touches_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other run took the folder and made its empty output folders between this run's
    look at the folder and its lock: this run, refused, removed them (a review's injected
    race) while the other still held the folder."""
    from fanin.io import output_lock
    from fanin.pipelines import output_folder

    out = tmp_path / "out"

    def taken_meanwhile(output: str, *args: Any, **kwargs: Any) -> Any:
        for kind in KINDS:  # what the other run made
            (out / kind).mkdir(parents=True)
        raise output_lock.FolderBusy(f"--output {output}: another fanin run is writing there")

    monkeypatch.setattr(output_folder.OutputLock, "acquire", taken_meanwhile)
    assert main(_run(out)) == 2
    assert sorted(p.name for p in out.iterdir()) == sorted(KINDS)


def test_overwrite_empties_a_file_system_mounted_in_an_output_folder(tmp_path: Path) -> None:
    """A file system mounted on a folder inside ``closes/``: its files cannot move into the
    output folder's hidden folder (``Invalid cross-device link``), which refused the run for
    a file it could delete; now they are deleted where they are, and the folder it is mounted
    on stays, empty."""
    import shutil

    if os.geteuid() != 0:
        pytest.skip("mounting a file system needs root")
    out = tmp_path / "out"
    assert main(_run(out)) == 0
    expected = _files(out)
    mounted = out / "closes" / "archive"
    mounted.mkdir()
    mount = shutil.which("mount")
    assert mount, "mount (util-linux) is needed"
    done = subprocess.run([mount, "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mounted)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"this machine does not let root mount a tmpfs: {done.stderr.strip()}")
    try:
        (mounted / "old.jsonl").write_text('{"old": 1}\n')
        (mounted / "deeper").mkdir()
        (mounted / "deeper" / "older.jsonl").write_text('{"old": 2}\n')
        assert main(_run(out, "--overwrite")) == 0
        assert os.path.ismount(mounted) and os.listdir(mounted) == []
        assert _files(out) == expected
    finally:
        subprocess.run(["umount", str(mounted)], check=True)
