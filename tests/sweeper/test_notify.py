"""Give-up notices over a real SMTP server (aiosmtpd) and a real HTTP webhook receiver, failing first."""

from __future__ import annotations

import datetime as dt
import http.server
import json
import logging
import threading
from collections.abc import Iterator
from email import message_from_bytes
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from sqlalchemy import insert, select, text

from broker_sim.common.net import listen_port
from reliable import Reliability
from reliable.models import StubNotification
from reliable.sweeper import EmailChannel, FixedBackoff, SmtpConfig, Sweeper, WebhookChannel, revive
from reliable.sweeper.channels import Channel
from reliable.sweeper.errors import NotifyError, SweeperConfigError
from reliable.sweeper.notices import DeadNotice
from reliable.sweeper.notify import deliver_owed
from reliable.types import StubStatus
from tests.scripted_server import ScriptedServer
from tests.sweeper.helpers import T0, Clock, QueueSender, add_stub, get_stub, set_progress


class Inbox:
    """aiosmtpd handler that keeps every message it accepted."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(
            {
                "from": envelope.mail_from,
                "to": list(envelope.rcpt_tos),
                "msg": message_from_bytes(envelope.content),
            }
        )
        return "250 OK"


class Webhook:
    """A real HTTP server in a thread; answers 500 to the first ``fail_first`` posts."""

    def __init__(self, fail_first: int) -> None:
        self.posts: list[tuple[int, dict[str, Any]]] = []
        self.fail_first = fail_first
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status = 500 if len(hook.posts) < hook.fail_first else 204
                hook.posts.append((status, body))
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    hook = Webhook(fail_first=1)
    yield hook
    hook.close()


def test_dead_stub_gives_exactly_one_email_and_one_webhook_even_when_both_fail_first(
    rel: Reliability, sender: QueueSender, clock: Clock, webhook: Webhook
) -> None:
    port = listen_port()  # nothing listens yet: the first e-mail attempt is refused
    inbox = Inbox()
    email = EmailChannel(
        SmtpConfig(
            host="127.0.0.1",
            port=port,
            sender="sweeper@example.org",
            recipients=("ops@example.org",),
            timeout_s=5,
        )
    )
    sweeper = Sweeper(
        rel,
        sender,
        backoff=FixedBackoff((10.0,)),
        clock=clock,
        channels=[email, WebhookChannel(webhook.url, 5)],
    )
    add_stub(rel, "doomed", send_count=3, topic="orders")
    add_stub(rel, "fine", send_count=1)

    first = sweeper.run_once()
    assert (first.dead, first.resent, first.notified, first.notify_failures) == (1, 1, 0, 2)
    assert get_stub(rel, "doomed").status is StubStatus.DEAD
    assert [s for s, _ in webhook.posts] == [500]
    with rel.engine.connect() as conn:
        rows = {r.channel: r for r in conn.execute(select(StubNotification.__table__))}
    assert rows.keys() == {"email", "webhook", "log"}  # the log line went out at once; its row remembers it
    logged = rows.pop("log")
    assert logged.notified_at is not None and logged.attempts == 0
    assert all(r.notified_at is None and r.attempts == 1 and r.last_error for r in rows.values())

    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        clock.advance(1)
        second = sweeper.run_once()
        clock.advance(1)
        third = sweeper.run_once()
    finally:
        controller.stop()
    assert (second.notified, second.notify_failures) == (2, 0)
    assert (third.notified, third.notify_failures, third.dead) == (0, 0, 0)
    assert len(inbox.messages) == 1
    mail = inbox.messages[0]
    assert mail["to"] == ["ops@example.org"] and mail["from"] == "sweeper@example.org"
    assert "1 message stub(s) DEAD" in mail["msg"]["Subject"]
    assert "doomed" in mail["msg"].get_payload() and "fine" not in mail["msg"].get_payload()
    assert [s for s, _ in webhook.posts] == [500, 204]
    body = webhook.posts[1][1]
    assert body["event"] == "reliable.stub.dead" and [n["message_id"] for n in body["notices"]] == ["doomed"]
    assert body["notices"][0]["send_count"] == 3


def two_send_sweeper(rel: Reliability, sender: QueueSender, clock: Clock, *channels: Channel) -> Sweeper:
    """A budget of the producer's send plus one resend, 10 s apart."""
    return Sweeper(
        rel, sender, max_sends=2, backoff=FixedBackoff((10.0,)), clock=clock, channels=list(channels)
    )


def test_revived_stub_that_dies_again_is_reported_again(
    rel: Reliability, sender: QueueSender, clock: Clock, webhook: Webhook
) -> None:
    webhook.fail_first = 0
    sweeper = two_send_sweeper(rel, sender, clock, WebhookChannel(webhook.url, 5))
    add_stub(rel, "twice", send_count=2)
    assert sweeper.run_once().dead == 1
    revive(rel.engine, ["twice"], now=clock.now)
    assert sweeper.run_once().resent == 1  # the new budget (the producer's send + 1 resend)
    receipt = sender.receipts[-1]
    set_progress(rel, receipt.queue_offset, queue_id=receipt.queue_id)  # the group passed the copy: lost
    clock.advance(60)
    assert sweeper.run_once().dead == 1
    assert [len(b["notices"]) for _, b in webhook.posts] == [1, 1]


def test_many_dead_stubs_are_batched_into_one_message_per_channel(
    rel: Reliability, sender: QueueSender, clock: Clock, webhook: Webhook
) -> None:
    webhook.fail_first = 0
    for i in range(12):
        add_stub(rel, f"d{i:02d}", send_count=3)
    summary = Sweeper(rel, sender, batch=5, clock=clock, channels=[WebhookChannel(webhook.url, 5)]).run_once()
    assert (summary.dead, summary.notified) == (12, 12)
    assert [len(b["notices"]) for _, b in webhook.posts] == [5, 5, 2]


def test_dead_notices_name_the_broker_group_of_the_newest_copy_in_every_channel(
    rel: Reliability, clock: Clock, webhook: Webhook, caplog: pytest.LogCaptureFixture
) -> None:
    """On a RocketMQ cluster ``queue 3`` exists once per broker group: a person must know which broker to
    look at. A copy the sweeper re-sent is where that resend landed (broker-b), not where the producer sent
    (broker-a); a broker without groups is not given a made-up one."""
    webhook.fail_first = 0
    inbox = Inbox()
    port = listen_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    email = EmailChannel(
        SmtpConfig("127.0.0.1", "s@example.org", ("ops@example.org",), port=port, timeout_s=5)
    )
    sender = QueueSender(queues=1, start=70, broker_name="broker-b")
    sweeper = two_send_sweeper(rel, sender, clock, email, WebhookChannel(webhook.url, 5))
    caplog.set_level(logging.ERROR, logger="reliable.sweeper")
    try:
        add_stub(rel, "moved", broker_name="broker-a", queue_id=3, queue_offset=40)
        add_stub(rel, "plain", send_count=2, queue_id=2, queue_offset=41)  # spent: DEAD at once
        set_progress(rel, 50, queue_id=3, broker_name="broker-a")  # the group passed both copies: lost
        set_progress(rel, 50, queue_id=2)
        first = sweeper.run_once()
        assert (first.resent, first.dead) == (1, 1)
        set_progress(rel, 80, queue_id=0, broker_name="broker-b")  # broker-b's queue 0 passed the resend
        clock.advance(60)
        assert sweeper.run_once().dead == 1
    finally:
        controller.stop()

    posted = {n["message_id"]: n for _, b in webhook.posts for n in b["notices"]}
    assert {m: (n["broker_name"], n["queue_id"], n["queue_offset"]) for m, n in posted.items()} == {
        "plain": ("", 2, 41),
        "moved": ("broker-b", 0, 70),
    }
    texts = [m["msg"].get_payload(decode=True).decode() for m in inbox.messages]
    assert any("- moved  topic=orders broker=broker-b group=billing" in t for t in texts)
    assert any("- plain  topic=orders group=billing" in t for t in texts)
    logged = [r.getMessage() for r in caplog.records if "stub DEAD" in r.getMessage()]
    assert [line.split(" reason=")[0] for line in logged] == [
        "stub DEAD message_id=plain topic=orders group=billing sends=2 queue=2 offset=41",
        "stub DEAD message_id=moved topic=orders broker=broker-b group=billing sends=2 queue=0 offset=70",
    ]


def test_smtp_config_from_env_and_validation() -> None:
    env = {
        "RELIABLE_SMTP_HOST": "mail.example.org",
        "RELIABLE_SMTP_SSL": "yes",
        "RELIABLE_SMTP_USER": "u",
        "RELIABLE_SMTP_PASSWORD": "p",
        "RELIABLE_SMTP_FROM": "a@example.org",
        "RELIABLE_SMTP_TO": "b@example.org, c@example.org",
    }
    cfg = SmtpConfig.from_env(env)
    assert cfg is not None
    assert (cfg.port, cfg.use_ssl, cfg.recipients, cfg.user) == (
        465,
        True,
        ("b@example.org", "c@example.org"),
        "u",
    )
    assert "p" not in repr(cfg).split("user='u'")[1]
    assert SmtpConfig.from_env({}) is None
    with pytest.raises(SweeperConfigError):
        SmtpConfig.from_env({**env, "RELIABLE_SMTP_TO": ""})
    with pytest.raises(SweeperConfigError):
        SmtpConfig.from_env({**env, "RELIABLE_SMTP_STARTTLS": "1"})
    with pytest.raises(SweeperConfigError):
        WebhookChannel("ftp://x")


@pytest.mark.parametrize(
    "reply",
    [
        b"HTTP/1.1 302 Found\r\nLocation: /moved\r\nContent-Length: 0\r\n\r\n",  # urllib re-sent it as a GET
        b"HELLO, this is not HTTP\r\n\r\n",  # BadStatusLine escaped the channel and failed the whole round
    ],
    ids=["redirect", "not-http"],
)
def test_a_webhook_that_answers_with_a_redirect_or_no_http_has_not_been_told(reply: bytes) -> None:
    server = ScriptedServer(reply)
    try:
        channel = WebhookChannel(server.url(path="/hook"), timeout_s=5)
        notice = DeadNotice("m", "orders", "billing", 3, 0, 7, "DEAD: gone", "2026-11-28T00:00:00")
        with pytest.raises(NotifyError):
            channel.deliver([notice])
        assert len(server.requests) == 1 and server.requests[0].startswith(b"POST /hook")
    finally:
        server.close()


def test_a_webhook_url_the_client_cannot_use_is_refused_at_start() -> None:
    with pytest.raises(SweeperConfigError, match="webhook URL"):
        WebhookChannel("http://hooks.example:abc/x")


class _Receiver:
    """A webhook receiver in a thread: refuses the events in ``refuse`` with 422, accepts the rest; with
    ``hold``, each request waits for ``release`` (a slow receiver) after setting ``arrived``."""

    def __init__(self, refuse: tuple[str, ...] = (), hold: bool = False) -> None:
        self.events: list[str] = []
        self.arrived, self.release = threading.Event(), threading.Event()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                event = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["event"]
                receiver.events.append(event)
                if hold:
                    receiver.arrived.set()
                    receiver.release.wait(30)
                self.send_response(422 if event in refuse else 204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def _owe(rel: Reliability, message_id: str, group: str, reason: str, created_at: dt.datetime) -> None:
    with rel.engine.begin() as conn:
        conn.execute(
            insert(StubNotification).values(
                message_id=message_id, consumer_group=group, channel="webhook", reason=reason,
                created_at=created_at, attempts=0,
            )
        )  # fmt: skip


def test_a_kind_of_notice_the_receiver_refuses_does_not_hold_back_the_others(rel: Reliability) -> None:
    """The receiver answers 422 to never-consumed alarms. The older alarm row used to end the channel's
    round before the DEAD notice behind it, every round, for ever: that give-up was never posted."""
    receiver = _Receiver(refuse=("reliable.queue.never_consumed",))
    try:
        add_stub(rel, "dead-1")
        _owe(rel, "waiting-1", "billing", "NEVER_CONSUMED topic=orders queue=3: subscribe it", T0)
        _owe(rel, "dead-1", "billing", "DEAD: never received after 3 send(s)", T0 + dt.timedelta(seconds=1))
        for minutes in range(3):
            at = Clock(T0 + dt.timedelta(minutes=minutes))
            deliver_owed(rel.engine, [WebhookChannel(receiver.url)], clock=at, batch=10)
        assert receiver.events.count("reliable.stub.dead") == 1
        with rel.engine.connect() as conn:
            owed = (
                conn.execute(
                    select(StubNotification.message_id).where(StubNotification.notified_at.is_(None))
                )
                .scalars()
                .all()
            )
        assert owed == ["waiting-1"]  # still owed, tried again each round
    finally:
        receiver.close()


@pytest.mark.mariadb
def test_a_slow_receiver_does_not_hold_the_messages_rows_on_mariadb(mariadb_url: str) -> None:
    """MariaDB has no FOR UPDATE OF: the owed rows' join locked the message's stub and inbox rows for as long
    as the HTTP call took, so another group's guard confirming that message waited on the receiver."""
    from tests.conftest import _ensure_clean_schema

    _ensure_clean_schema(mariadb_url)
    receiver = _Receiver(hold=True)
    with Reliability(mariadb_url, redis_url="") as rel:
        try:
            add_stub(rel, "m-slow", groups=["billing", "audit"])
            _owe(rel, "m-slow", "audit", "DEAD: never received after 3 send(s)", T0)
            notifying = threading.Thread(
                target=deliver_owed, args=(rel.engine, [WebhookChannel(receiver.url, timeout_s=30)]),
                kwargs={"clock": lambda: T0, "batch": 10},
            )  # fmt: skip
            notifying.start()
            assert receiver.arrived.wait(30)
            with rel.engine.connect() as conn:  # billing's guard confirming the message meanwhile
                conn.execute(text("SET SESSION innodb_lock_wait_timeout = 1"))
                conn.execute(
                    text(
                        "UPDATE message_inbox SET status = 'CONFIRMED' "
                        "WHERE message_id = 'm-slow' AND consumer_group = 'billing'"
                    )
                )
                conn.execute(
                    text("UPDATE message_stub SET updated_at = updated_at WHERE message_id = 'm-slow'")
                )
                conn.commit()
            receiver.release.set()
            notifying.join(30)
            assert receiver.events == ["reliable.stub.dead"]
        finally:
            receiver.close()
