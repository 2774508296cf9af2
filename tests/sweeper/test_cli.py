"""``reliable sweep``, ``reliable stubs`` and ``jobs/resend.py``: in-process and as a scheduled subprocess."""

from __future__ import annotations

import datetime as dt
import itertools
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from broker_sim.common.net import listen_port
from reliable import Reliability
from reliable.cli import build_parser, main
from reliable.cli.sweep import _smtp
from reliable.models import utcnow
from reliable.sweeper import SmtpConfig, metrics
from reliable.sweeper.errors import SweeperConfigError
from reliable.types import StubStatus
from tests.sweeper.helpers import add_inbox_without_stub, add_stub, get_inbox, set_inbox
from tests.sweeper.senders import MEMORY

ROOT = Path(__file__).resolve().parents[2]
#: these tests run the real command with the real clock
PAST = utcnow() - dt.timedelta(minutes=1)


def test_sweep_once_resends_and_prints_the_summary(
    sqlite_rel: Reliability, sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    add_stub(sqlite_rel, "cli-lost", resend_at=None)
    add_stub(sqlite_rel, "cli-due", resend_at=PAST)
    before = len(MEMORY.sent)
    argv = ["sweep", "--once", "--db", sqlite_url, "--sender", "tests.sweeper.senders:memory_sender"]
    assert main([*argv, "--backoff", "exp:base=1m,factor=2,cap=1h,jitter=0.1,seed=3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("sweep round: selected=1 resent=1 ")
    assert [m.message_id for m in MEMORY.sent[before:]] == ["cli-due"]
    assert get_inbox(sqlite_rel, "cli-due").resend_count == 1


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--sender", "nope.module:make"], "cannot import sender module"),
        (["--sender", "tests.sweeper.senders"], "must look like"),
        (["--sender", "tests.sweeper.senders:not_a_sender"], "has no send(message)"),
        (["--sender", "tests.sweeper.senders:memory_sender", "--backoff", "fixed:1s,zz"], "not a duration"),
        (["--sender", "tests.sweeper.senders:memory_sender", "--backoff", "linear:1s"], "unknown backoff"),
        (["--sender", "tests.sweeper.senders:memory_sender", "--batch", "0"], "--batch must be > 0"),
        (["--sender", "tests.sweeper.senders:memory_sender", "--webhook", "mailto:x"], "webhook URL"),
        # each ran a normal round before: no backoff at all, every notice timing out at once
        (["--sender", "tests.sweeper.senders:memory_sender", "--backoff", ""], "unknown backoff"),
        (["--sender", "tests.sweeper.senders:memory_sender", "--notify-timeout", "0s"], "--notify-timeout"),
        # accepted, then every round's purge failed ("date value out of range") and no summary was printed
        (["--sender", "tests.sweeper.senders:memory_sender", "--log-retention", "3000000d"], "log_retention"),
        # a sender spec that is a function but no sender factory: a TypeError traceback's last line
        (["--sender", "os:getcwd"], "os:getcwd"),
        (
            [
                "--sender",
                "tests.sweeper.senders:memory_sender",
                "--smtp-host",
                "127.0.0.1",
                "--smtp-port",
                "x",
            ],
            "RELIABLE_SMTP_PORT",
        ),
    ],
)
def test_bad_input_is_one_line(
    sqlite_rel: Reliability,
    sqlite_url: str,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    message: str,
) -> None:
    assert main(["sweep", "--once", "--db", sqlite_url, *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("reliable: error:") and message in err


def test_a_redis_that_does_not_answer_is_said_once_and_the_round_still_runs(
    sqlite_rel: Reliability, sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A wrong port or password looks like a Redis that is down: the sweeper works from the database, but
    cannot see a worker's lease — an operator is told once, instead of a silent exit 0."""
    argv = ["sweep", "--once", "--db", sqlite_url, "--sender", "tests.sweeper.senders:memory_sender"]
    with caplog.at_level("WARNING", logger="reliable.sweeper"):
        assert main([*argv, "--redis", f"redis://127.0.0.1:{listen_port()}/0"]) == 0
    assert [r.getMessage() for r in caplog.records if "Redis does not answer" in r.getMessage()] != []


def test_bad_cron_and_missing_sender_are_one_line(
    sqlite_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RELIABLE_SWEEP_SENDER", raising=False)
    assert main(["sweep", "--cron", "61 * * * *", "--db", sqlite_url, "--sender", "x:y"]) == 2
    assert "bad cron expression" in capsys.readouterr().err
    assert main(["sweep", "--once", "--db", sqlite_url, "--sender", ""]) == 2
    assert "no sender" in capsys.readouterr().err


class AuthInbox:
    """aiosmtpd handler and authenticator: keeps every accepted message and every login, accepts only
    ``alice``/``secret`` (a relay that requires a login refuses mail from anyone else)."""

    def __init__(self) -> None:
        self.logins: list[str] = []
        self.messages: list[tuple[str, list[str]]] = []

    def __call__(
        self, server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any
    ) -> AuthResult:
        if isinstance(auth_data, LoginPassword) and (auth_data.login, auth_data.password) == (
            b"alice",
            b"secret",
        ):
            self.logins.append(auth_data.login.decode())
            return AuthResult(success=True)
        return AuthResult(success=False, handled=False)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        if not session.authenticated:
            return "530 5.7.0 Authentication required"
        self.messages.append((envelope.mail_from, list(envelope.rcpt_tos)))
        return "250 OK"


@pytest.fixture
def auth_smtp() -> Iterator[tuple[int, AuthInbox]]:
    inbox = AuthInbox()
    smtp_port = listen_port()
    controller = Controller(
        inbox, hostname="127.0.0.1", port=smtp_port, authenticator=inbox, auth_require_tls=False
    )
    controller.start()
    try:
        yield smtp_port, inbox
    finally:
        controller.stop()


@pytest.mark.parametrize(
    ("env", "flags"),
    [
        # the host in the environment, the addresses as flags: refused before ("need a from address")
        (
            {
                "RELIABLE_SMTP_HOST": "127.0.0.1",
                "RELIABLE_SMTP_PORT": "{port}",
                "RELIABLE_SMTP_USER": "alice",
            },
            ["--smtp-from", "sweeper@example.org", "--smtp-to", "ops@example.org"],
        ),
        # docs/operations.md's unit: host and addresses as flags, the login from the environment — sent
        # without logging in before, and refused by every relay that requires one
        (
            {"RELIABLE_SMTP_USER": "alice"},
            [
                *("--smtp-host", "127.0.0.1", "--smtp-port", "{port}"),
                *("--smtp-from", "sweeper@example.org", "--smtp-to", "ops@example.org"),
            ],
        ),
        # the variable asks for TLS from the start, the flag turns it off (there was no flag to do that)
        (
            {"RELIABLE_SMTP_SSL": "yes", "RELIABLE_SMTP_USER": "alice"},
            [
                *("--smtp-host", "127.0.0.1", "--smtp-port", "{port}", "--no-smtp-ssl"),
                *("--smtp-from", "sweeper@example.org", "--smtp-to", "ops@example.org"),
            ],
        ),
        # a flag wins over its variable
        (
            {
                "RELIABLE_SMTP_HOST": "127.0.0.1",
                "RELIABLE_SMTP_PORT": "1",
                "RELIABLE_SMTP_USER": "mallory",
                "RELIABLE_SMTP_FROM": "env@example.org",
                "RELIABLE_SMTP_TO": "nobody@example.org",
            },
            [
                *("--smtp-port", "{port}", "--smtp-user", "alice", "--smtp-from", "sweeper@example.org"),
                *("--smtp-to", "ops@example.org"),
            ],
        ),
    ],
)
def test_smtp_flags_and_environment_combine_and_the_login_happens(
    sqlite_rel: Reliability,
    sqlite_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    auth_smtp: tuple[int, AuthInbox],
    env: dict[str, str],
    flags: list[str],
) -> None:
    smtp_port, inbox = auth_smtp
    for name in list(os.environ):
        if name.startswith("RELIABLE_SMTP_"):
            monkeypatch.delenv(name)
    env = {"RELIABLE_SMTP_PASSWORD": "secret", **env}
    for name, value in env.items():
        monkeypatch.setenv(name, value.format(port=smtp_port))
    add_stub(sqlite_rel, "cli-doomed", resend_at=PAST)  # the producer's send spent a budget of one
    argv = ["sweep", "--once", "--db", sqlite_url, "--sender", "tests.sweeper.senders:memory_sender"]
    rc = main([*argv, "--max-sends", "1", *(f.format(port=smtp_port) for f in flags)])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert " dead=1 " in out.out and " notified=1 " in out.out and "notify_failures=0" in out.out
    assert inbox.logins == ["alice", "alice"]  # the start-up check of the channel, then the e-mail
    assert inbox.messages == [("sweeper@example.org", ["ops@example.org"])]


@pytest.mark.parametrize(
    ("env", "flags", "modes"),
    [
        ({}, [], (False, False)),
        ({"RELIABLE_SMTP_SSL": "yes"}, [], (False, True)),
        ({"RELIABLE_SMTP_SSL": "yes"}, ["--no-smtp-ssl"], (False, False)),
        ({"RELIABLE_SMTP_SSL": "yes"}, ["--smtp-starttls"], (True, False)),  # was: refused, "both modes"
        ({"RELIABLE_SMTP_STARTTLS": "yes"}, ["--smtp-ssl"], (False, True)),
        ({"RELIABLE_SMTP_STARTTLS": "yes"}, ["--no-smtp-starttls"], (False, False)),
        ({}, ["--smtp-starttls"], (True, False)),
    ],
)
def test_an_smtp_tls_flag_wins_over_the_variables(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], flags: list[str], modes: tuple[bool, bool]
) -> None:
    for name in list(os.environ):
        if name.startswith("RELIABLE_SMTP_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    parser = build_parser()
    mail = ["--smtp-host", "mail.example.org", "--smtp-from", "a@b.c", "--smtp-to", "ops@example.org"]
    args = parser.parse_args(["sweep", "--once", "--db", "sqlite://", *mail, *flags])
    cfg = _smtp(args)
    assert cfg is not None and (cfg.starttls, cfg.use_ssl) == modes
    assert cfg.port == (465 if modes[1] else 25)


@pytest.mark.parametrize("name", ["RELIABLE_SMTP_STARTTLS", "RELIABLE_SMTP_SSL"])
def test_an_smtp_tls_variable_that_is_not_yes_or_no_is_refused_not_read_as_no(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], sqlite_url: str, name: str
) -> None:
    """``required`` was read as "no": the sweeper then logged in without TLS, the password in clear text."""
    for var in list(os.environ):
        if var.startswith("RELIABLE_SMTP_"):
            monkeypatch.delenv(var)
    monkeypatch.setenv(name, "required")
    mail = ["--smtp-host", "mail.example.org", "--smtp-from", "a@b.c", "--smtp-to", "ops@example.org"]
    argv = ["sweep", "--once", "--db", sqlite_url, "--sender", "tests.sweeper.senders:memory_sender", *mail]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{name}: cannot read 'required' as yes/no" in err
    with pytest.raises(SweeperConfigError, match="cannot read 'required' as yes/no"):
        SmtpConfig.from_env({"RELIABLE_SMTP_HOST": "h", name: "required"})


def test_stubs_list_show_revive(
    sqlite_rel: Reliability, sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    add_stub(
        sqlite_rel,
        "dead-1",
        groups=["billing", "audit"],
        status=StubStatus.DEAD,
        send_count=8,
        last_error="DEAD: never received",
    )
    add_stub(sqlite_rel, "live-1")
    assert main(["stubs", "list", "--status", "dead", "--db", sqlite_url]) == 0
    out = capsys.readouterr().out
    assert "dead-1" in out and "live-1" not in out and "(2 row(s))" in out
    assert main(["stubs", "list", "--status", "dead", "--group", "audit", "--db", sqlite_url]) == 0
    assert "(1 row(s))" in capsys.readouterr().out
    long_group, long_topic = "payments-reconciliation-eu-west", "orders.v2.created-by-checkout"
    add_stub(sqlite_rel, "dead-2", groups=[long_group], topic=long_topic, status=StubStatus.DEAD)
    assert main(["stubs", "list", "--status", "dead", "--db", sqlite_url]) == 0
    listed = capsys.readouterr().out  # whole, as a person copies them into `stubs revive --group …`
    assert f" {long_group} " in listed and f" {long_topic} " in listed
    assert main(["stubs", "show", "dead-1", "--db", sqlite_url]) == 0
    out = capsys.readouterr().out
    assert "status          DEAD" in out and "group audit" in out and "group billing" in out
    assert out.count("deliveries        0") == 2
    assert main(["stubs", "revive", "dead-1", "live-1", "--db", sqlite_url]) == 2
    assert "only DEAD rows can be revived; no DEAD row for: live-1" in capsys.readouterr().err
    assert main(["stubs", "show", "nope", "--db", sqlite_url]) == 2
    assert "no such stub: nope" in capsys.readouterr().err
    assert main(["stubs", "revive", "dead-1", "--group", "audit", "--db", sqlite_url]) == 0
    assert "revived 1 row(s)" in capsys.readouterr().out
    assert get_inbox(sqlite_rel, "dead-1", "audit").status is StubStatus.PENDING
    assert get_inbox(sqlite_rel, "dead-1", "billing").status is StubStatus.DEAD


def test_stubs_void_and_retire(
    sqlite_rel: Reliability, sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The runbook's "the message must not be processed any more", and a group taken out of service, from
    the command line."""
    add_stub(sqlite_rel, "dead-1", groups=["billing", "audit"], status=StubStatus.DEAD)
    add_stub(sqlite_rel, "done-1", status=StubStatus.CONFIRMED)
    assert main(["stubs", "void", "dead-1", "done-1", "--group", "audit", "--db", sqlite_url]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such row of group audit for: done-1" in err
    assert main(["stubs", "void", "dead-1", "--group", "audit", "--db", sqlite_url]) == 0
    assert "voided 1 row(s)" in capsys.readouterr().out
    assert get_inbox(sqlite_rel, "dead-1", "audit").status is StubStatus.VOIDED
    assert get_inbox(sqlite_rel, "dead-1", "billing").status is StubStatus.DEAD
    for i in range(3):
        add_stub(sqlite_rel, f"old-{i}", groups=["old"])
    assert main(["stubs", "retire", "old", "--db", sqlite_url]) == 0
    assert "group old has 3 open row(s); run again with --yes" in capsys.readouterr().out
    assert get_inbox(sqlite_rel, "old-0", "old").status is StubStatus.PENDING  # a dry run changes nothing
    assert main(["stubs", "retire", "old", "--yes", "--db", sqlite_url]) == 0
    assert "retired group old: voided 3 open row(s)" in capsys.readouterr().out
    assert {get_inbox(sqlite_rel, f"old-{i}", "old").status for i in range(3)} == {StubStatus.VOIDED}


def test_a_row_given_up_because_its_stub_is_gone_can_be_found_and_read_by_the_person_told(
    sqlite_rel: Reliability, sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The notice names a message whose stub is gone: ``stubs list`` and ``stubs show`` must still show its
    group's row and why it went DEAD, and ``revive`` must say why it cannot help."""
    day_ago = utcnow() - dt.timedelta(days=2)
    add_inbox_without_stub(sqlite_rel, "cli-orphan", created_at=day_ago, resend_at=PAST)
    argv = ["sweep", "--once", "--db", sqlite_url, "--sender", "tests.sweeper.senders:memory_sender"]
    assert main([*argv, "--max-unconfirmed-age", "1d"]) == 0
    assert "dead=1" in capsys.readouterr().out
    assert main(["stubs", "list", "--status", "dead", "--db", sqlite_url]) == 0
    [line] = [x for x in capsys.readouterr().out.splitlines() if x.startswith("cli-orphan")]
    assert line.split()[1:5] == ["billing", "DEAD", "1", "-"] and "DEAD: no message_stub row" in line
    assert main(["stubs", "show", "cli-orphan", "--db", sqlite_url]) == 0
    out = capsys.readouterr().out
    assert "stub            none" in out and "group billing" in out
    assert "last_error        DEAD: no message_stub row: nothing to re-send; unconfirmed since" in out
    assert main(["stubs", "revive", "cli-orphan", "--db", sqlite_url]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such stub: cli-orphan (cli-orphan: group rows without a stub" in err


def test_stubs_list_shows_and_filters_by_the_broker_group_of_the_newest_copy(
    sqlite_rel: Reliability, sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a RocketMQ cluster queue 3 is one queue per broker group: the list says which, and filters by it.
    A group whose newest copy is a targeted resend is where that resend landed, not where the producer
    sent."""
    add_stub(sqlite_rel, "on-a", broker_name="broker-a", queue_id=3, queue_offset=40)
    add_stub(sqlite_rel, "moved", broker_name="broker-a", queue_id=3, queue_offset=41)
    set_inbox(sqlite_rel, "moved", queue_id=1, queue_offset=7, broker_name="broker-b")
    add_stub(sqlite_rel, "plain", queue_id=3, queue_offset=42)  # no broker groups (Kafka, one broker)

    def listed(*extra: str) -> dict[str, list[str]]:
        assert main(["stubs", "list", *extra, "--db", sqlite_url]) == 0
        lines = capsys.readouterr().out.splitlines()
        header = lines[0].split()
        assert header[5:8] == ["BROKER", "Q", "OFFSET"]
        return {line.split()[0]: line.split()[5:8] for line in lines[1:-1]}

    assert listed() == {
        "on-a": ["broker-a", "3", "40"],
        "moved": ["broker-b", "1", "7"],
        "plain": ["-", "3", "42"],
    }
    assert listed("--broker-name", "broker-b").keys() == {"moved"}
    assert listed("--broker-name", "broker-a").keys() == {"on-a"}
    assert listed("--broker-name", "").keys() == {"plain"}


SENDER = ["--sender", "tests.sweeper.senders:memory_sender"]


@pytest.fixture
def unmigrated_sqlite(tmp_path: Path) -> str:
    """A database at revision 0002: what a deployment has before running this version's migration."""
    from reliable.facade import make_engine
    from reliable.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = make_engine(url)
    upgrade(engine, "0002")
    engine.dispose()
    return url


@pytest.mark.parametrize(
    "command",
    [
        ["sweep", "--once", *SENDER],
        ["stubs", "list"],
        ["stubs", "show", "m-1"],
        ["stubs", "revive", "m-1"],
        ["stubs", "void", "m-1"],
        ["stubs", "retire", "old", "--yes"],
    ],
    ids=["sweep", "stubs-list", "stubs-show", "stubs-revive", "stubs-void", "stubs-retire"],
)
@pytest.mark.parametrize("database", ["missing-file", "empty-file", "unmigrated", "postgres-missing-db"])
def test_missing_or_unmigrated_database_is_one_line_with_the_upgrade_hint(
    command: list[str],
    database: str,
    tmp_path: Path,
    unmigrated_sqlite: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if database == "missing-file":
        url = f"sqlite:///{tmp_path / 'nowhere' / 'x.db'}"
    elif database == "empty-file":
        (tmp_path / "empty.db").write_bytes(b"")
        url = f"sqlite:///{tmp_path / 'empty.db'}"
    elif database == "unmigrated":
        url = unmigrated_sqlite
    else:
        from tests.services import service_url

        url = service_url("postgres").rsplit("/", 1)[0] + "/reliable_no_such_db"
    assert main([*command, "--db", url]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("reliable: error:"), err
    assert "run `reliable db upgrade --db URL` first" in err
    if database == "missing-file":
        assert not (tmp_path / "nowhere").exists()  # not created as a side effect


def test_metrics_are_served(sqlite_rel: Reliability) -> None:
    port = listen_port()
    metrics.serve(port)
    metrics.ROUNDS.inc()
    deadline = time.monotonic() + 10
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                body = r.read().decode()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
    assert "reliable_sweeper_rounds_total" in body and "reliable_sweeper_resent_total" in body


@pytest.mark.slow
def test_scheduled_sweeper_runs_rounds_without_overlap_and_stops_on_sigterm(
    sqlite_rel: Reliability, sqlite_url: str, tmp_path: Path
) -> None:
    add_stub(sqlite_rel, "always-failing", resend_at=PAST)
    journal = tmp_path / "sends.log"
    env = {
        **os.environ,
        "RELIABLE_TEST_SEND_LOG": str(journal),
        "RELIABLE_TEST_SEND_DELAY_S": "0.3",
        "PYTHONPATH": str(ROOT),
    }
    cmd = [
        sys.executable,
        "-m",
        "jobs.resend",
        "--interval",
        "100ms",  # shorter than a round (300 ms): max_instances=1 + coalesce must keep rounds apart
        "--db",
        sqlite_url,
        "--sender",
        "tests.sweeper.senders:slow_failing_sender",
        "--backoff",
        "fixed:50ms",
        "--max-sends",
        "1000000",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while journal.read_text().count("end") < 4 if journal.exists() else True:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no rounds"
            time.sleep(0.05)  # polling a file written by another process
        # stop in the middle of a round: wait for a start without its end
        while True:
            lines = journal.read_text().splitlines()
            if lines and lines[-1].startswith("start"):
                break
            assert time.monotonic() < deadline
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    events = [line.split() for line in journal.read_text().splitlines()]
    assert events[-1][0] == "end", "the round in flight was finished before exiting"
    spans = [(float(a[1]), float(b[1])) for a, b in zip(events[::2], events[1::2], strict=True)]
    assert all(a[0] == "start" and b[0] == "end" for a, b in zip(events[::2], events[1::2], strict=True))
    assert all(prev_end <= next_start for (_, prev_end), (next_start, _) in itertools.pairwise(spans))
    assert err.count("sweep round: selected=1 resent=0 send_failures=1") >= 4
    assert "stopping after the current round" in err and "sweeper: stopped" in err
