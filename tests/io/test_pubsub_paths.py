"""Pub/Sub paths and resources a run cannot use are refused before it starts,
in one line on stderr with exit 2, saying why (against Google's Pub/Sub emulator)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.emulator import PubSubEmulator

from fanin.cli import main as fanin_main
from fanin.io.pubsub import PublishJson, ReadMessages, validate_pubsub_path


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    code = fanin_main(["run", *argv])
    return code, capsys.readouterr().err.splitlines()


def test_missing_subscription_is_one_line_exit_2(
    pubsub_emulator: PubSubEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = f"projects/{pubsub_emulator.project}/subscriptions/never-created"
    code, err = _run(capsys, "--subscription", missing, "--output", str(tmp_path / "out"))
    assert code == 2
    assert err == [f"fanin: error: subscription {missing} does not exist (asked "
                   f"{pubsub_emulator.host}); create it first"]
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_missing_output_topic_is_one_line_exit_2(
    pubsub_emulator: PubSubEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, subscription = pubsub_emulator.topic_and_subscription("paths")
    missing = f"projects/{pubsub_emulator.project}/topics/no-closes-here"
    code, err = _run(capsys, "--subscription", subscription, "--closes-topic", missing,
                     "--output", str(tmp_path / "out"))
    assert (code, len(err)) == (2, 1)
    assert f"topic {missing} does not exist" in err[0]


@pytest.mark.parametrize(("argv", "reason"), [
    (["--subscription", "projects/P/subscriptions/S"], "project id 'P' is refused by Pub/Sub: "
     "it needs 6-30 lowercase letters"),
    (["--topic", "projects/my-project/topics/T"], "name 'T' is refused by Pub/Sub: it needs "
     "3-255 letters"),
    (["--subscription", "projects/my-project/subscriptions/goog-x"], "(not 'goog')"),
    (["--subscription", "projects/my-project/topics/receipts"], "is not of the form "
     "projects/PROJECT/subscriptions/NAME"),
    (["--subscription", "projects/my-project/subscriptions/receipts", "--late-topic",
      "projects/Upper-Case/topics/late"], "project id 'Upper-Case' is refused"),
])
def test_paths_the_service_refuses_say_why(
    argv: list[str], reason: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _run(capsys, *argv, "--output", str(tmp_path / "out"))
    assert (code, len(err)) == (2, 1)
    assert err[0].startswith("fanin: error: ") and reason in err[0]


def test_valid_paths_pass_and_transforms_check_them() -> None:
    for path in ("projects/my-project/topics/receipts", "projects/example.com:my-proj/topics/a.b",
                 "projects/fanin-emulated/topics/T-1~x%2B"):
        assert validate_pubsub_path(path, "topics") == path
    with pytest.raises(ValueError, match="project id 'P'"):
        ReadMessages(subscription="projects/P/subscriptions/S")
    with pytest.raises(ValueError, match="name 'T'"):
        PublishJson("projects/my-project/topics/T")


def test_no_credentials_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the emulator's address and without Application Default Credentials the
    resource check cannot ask: one line, exit 2 (it was a 31-line traceback, exit 1). The
    absence of credentials is injected: a CI machine on Google Cloud would have some."""
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    def no_credentials(*args: object, **kwargs: object) -> None:
        raise DefaultCredentialsError("Your default credentials were not found.")

    monkeypatch.delenv("PUBSUB_EMULATOR_HOST", raising=False)
    monkeypatch.setattr(google.auth, "default", no_credentials)
    code, err = _run(capsys, "--subscription", "projects/my-project/subscriptions/xyz",
                     "--output", str(tmp_path / "out"))
    assert (code, len(err)) == (2, 1)
    assert err[0].startswith("fanin: error: no Google credentials to reach Pub/Sub")


def test_a_service_that_does_not_answer_is_given_up_on_within_the_timeout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing listens at the emulator's address: the check said "did not answer within 30
    s" after the client's own retries had taken ~51 s; it gives up within its timeout."""
    from fanin.io.pubsub import check_pubsub_resources

    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", "127.0.0.1:1")
    subscription = "projects/p/subscriptions/s"
    started = time.monotonic()
    with pytest.raises(ValueError) as refused:
        check_pubsub_resources(subscription, timeout_s=2)
    waited = time.monotonic() - started
    assert str(refused.value) == (f"Pub/Sub at 127.0.0.1:1 did not answer about subscription "
                                  f"{subscription} within 2 s (RetryError)")
    assert waited < 20, waited  # a bound on the wait, not a speed: it was 51 s
