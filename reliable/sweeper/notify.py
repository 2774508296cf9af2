"""Telling a person that a stub went DEAD: log (always), e-mail over SMTP, webhook (HTTP POST JSON).

The log line is written in the round that gives up, unconditionally. E-mail and webhook are *owed*: the
give-up transaction inserts one ``stub_notification`` row per configured channel, and every round delivers
what is owed, oldest first, one message per channel per batch (a burst of 200 dead stubs is one e-mail
listing them, not 200). A channel that fails (SMTP refused, webhook 5xx, timeout) leaves its rows owed,
records the error, stops that channel for this round and lets the sweep go on; the next round retries.

Delivery is at-least-once per channel: the rows are marked after the channel accepted, in the transaction
that locked them, so a crash between the two repeats that one notice. Rows are claimed with
``FOR UPDATE SKIP LOCKED`` so two sweepers do not both send them.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import smtplib
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from email.message import EmailMessage
from typing import Any, Protocol

from sqlalchemy import Engine, and_, func, or_, select, update

from reliable import constants as C
from reliable.sweeper.claim import LockMode, lock_mode
from reliable.sweeper.errors import NotifyError, SweeperConfigError
from reliable.sweeper.selection import inbox, notif, stub

log = logging.getLogger("reliable.sweeper")


@dataclass(frozen=True, slots=True)
class DeadNotice:
    """What a person needs to find and fix one dead stub."""

    message_id: str
    topic: str
    consumer_group: str
    send_count: int
    queue_id: int | None
    queue_offset: int | None
    reason: str
    dead_at: str  # ISO-8601 UTC


class Channel(Protocol):
    """A way to reach a person. ``deliver`` raises :class:`NotifyError` when the notices were not accepted."""

    name: str

    def deliver(self, notices: Sequence[DeadNotice]) -> None: ...


@dataclass(frozen=True)
class SmtpConfig:
    """SMTP settings; ``from_env`` reads ``RELIABLE_SMTP_*`` (see reliable/constants.py)."""

    host: str
    sender: str
    recipients: tuple[str, ...]
    port: int = 25
    starttls: bool = False
    use_ssl: bool = False
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    timeout_s: float = C.DEFAULT_NOTIFY_TIMEOUT_S

    def __post_init__(self) -> None:
        if not self.host:
            raise SweeperConfigError("smtp: no host")
        if not self.sender or not self.recipients:
            raise SweeperConfigError("smtp: need a from address and at least one to address")
        if self.starttls and self.use_ssl:
            raise SweeperConfigError("smtp: choose STARTTLS or SSL, not both")
        if not 0 < self.port < 65536:
            raise SweeperConfigError(f"smtp: bad port {self.port}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SmtpConfig | None:
        """``None`` when ``RELIABLE_SMTP_HOST`` is unset (e-mail not configured)."""
        env = os.environ if environ is None else environ
        host = env.get(C.ENV_SMTP_HOST, "")
        if not host:
            return None
        use_ssl = _flag(env.get(C.ENV_SMTP_SSL, ""))
        try:
            port = int(env.get(C.ENV_SMTP_PORT) or (465 if use_ssl else 25))
        except ValueError:
            raise SweeperConfigError(f"{C.ENV_SMTP_PORT} is not a port number") from None
        return cls(
            host=host,
            port=port,
            sender=env.get(C.ENV_SMTP_FROM, ""),
            recipients=tuple(a.strip() for a in env.get(C.ENV_SMTP_TO, "").split(",") if a.strip()),
            starttls=_flag(env.get(C.ENV_SMTP_STARTTLS, "")),
            use_ssl=use_ssl,
            user=env.get(C.ENV_SMTP_USER) or None,
            password=env.get(C.ENV_SMTP_PASSWORD) or None,
        )


def _flag(text: str) -> bool:
    return text.strip().lower() in {"1", "true", "yes", "on"}


def _summary(notices: Sequence[DeadNotice]) -> str:
    lines = [
        f"{len(notices)} message stub(s) went DEAD: the resend sweeper gave up on them.",
        "Fix the cause, then put them back with: reliable stubs revive ID ...",
        "",
    ]
    for n in notices:
        where = f"queue {n.queue_id} offset {n.queue_offset}" if n.queue_offset is not None else "no offset"
        lines.append(
            f"- {n.message_id}  topic={n.topic} group={n.consumer_group} sends={n.send_count} {where}"
            f"  dead_at={n.dead_at}\n  reason: {n.reason}"
        )
    return "\n".join(lines) + "\n"


class EmailChannel:
    name = C.NOTIFY_CHANNEL_EMAIL

    def __init__(self, config: SmtpConfig) -> None:
        self.config = config

    def deliver(self, notices: Sequence[DeadNotice]) -> None:
        cfg = self.config
        msg = EmailMessage()
        msg["Subject"] = f"[reliable] {len(notices)} message stub(s) DEAD"
        msg["From"] = cfg.sender
        msg["To"] = ", ".join(cfg.recipients)
        msg.set_content(_summary(notices))
        try:
            client: smtplib.SMTP
            if cfg.use_ssl:
                client = smtplib.SMTP_SSL(
                    cfg.host, cfg.port, timeout=cfg.timeout_s, context=ssl.create_default_context()
                )
            else:
                client = smtplib.SMTP(cfg.host, cfg.port, timeout=cfg.timeout_s)
            with client:
                if cfg.starttls:
                    client.starttls(context=ssl.create_default_context())
                if cfg.user:
                    client.login(cfg.user, cfg.password or "")
                client.send_message(msg)
        except (OSError, smtplib.SMTPException) as exc:
            raise NotifyError(f"email via {cfg.host}:{cfg.port}: {exc}") from exc


class WebhookChannel:
    """POSTs ``{"event": "reliable.stub.dead", "count": N, "notices": [...]}``; any non-2xx is a failure."""

    name = C.NOTIFY_CHANNEL_WEBHOOK

    def __init__(
        self,
        url: str,
        timeout_s: float = C.DEFAULT_NOTIFY_TIMEOUT_S,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise SweeperConfigError(f"webhook URL must be http(s)://…, got {url!r}")
        self.url, self.timeout_s, self.headers = url, timeout_s, dict(headers or {})

    def deliver(self, notices: Sequence[DeadNotice]) -> None:
        body = json.dumps(
            {"event": "reliable.stub.dead", "count": len(notices), "notices": [asdict(n) for n in notices]}
        ).encode()
        request = urllib.request.Request(
            self.url,
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", **self.headers},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                status = int(response.status)
        except urllib.error.HTTPError as exc:
            raise NotifyError(f"webhook {self.url}: HTTP {exc.code}") from exc
        except (OSError, urllib.error.URLError) as exc:
            raise NotifyError(f"webhook {self.url}: {exc}") from exc
        if not 200 <= status < 300:
            raise NotifyError(f"webhook {self.url}: HTTP {status}")


def log_dead(notice: DeadNotice) -> None:
    """The always-on channel: one ERROR line per dead stub, in the round that gave up."""
    log.error(
        "stub DEAD message_id=%s topic=%s group=%s sends=%d reason=%s",
        notice.message_id,
        notice.topic,
        notice.consumer_group,
        notice.send_count,
        notice.reason,
    )


@dataclass
class NotifyResult:
    #: notices accepted, per channel name
    delivered: dict[str, int] = field(default_factory=dict)
    #: channels whose delivery failed this round (their notices are retried next round)
    failed_channels: list[str] = field(default_factory=list)


def deliver_owed(
    engine: Engine, channels: Sequence[Channel], *, now: dt.datetime, batch: int
) -> NotifyResult:
    """Deliver every owed notice of the configured ``channels``; never raises for a channel failure."""
    result = NotifyResult()
    for channel in channels:
        while True:
            delivered, failed = _deliver_batch(engine, channel, now=now, batch=batch)
            result.delivered[channel.name] = result.delivered.get(channel.name, 0) + delivered
            if failed:
                result.failed_channels.append(channel.name)
                break
            if delivered < batch:
                break
    return result


def _deliver_batch(engine: Engine, channel: Channel, *, now: dt.datetime, batch: int) -> tuple[int, bool]:
    group_row = and_(
        inbox.c.message_id == notif.c.message_id, inbox.c.consumer_group == notif.c.consumer_group
    )
    stmt = (
        select(
            notif.c.message_id,
            notif.c.consumer_group,
            notif.c.reason,
            notif.c.created_at,
            notif.c.attempts,
            stub.c.topic,
            inbox.c.resend_count,
            func.coalesce(inbox.c.queue_id, stub.c.queue_id).label("queue_id"),
            func.coalesce(inbox.c.queue_offset, stub.c.queue_offset).label("queue_offset"),
        )
        .select_from(notif.join(stub, stub.c.message_id == notif.c.message_id).outerjoin(inbox, group_row))
        .where(notif.c.channel == channel.name, notif.c.notified_at.is_(None))
        .order_by(notif.c.created_at)
        .limit(batch)
    )
    with engine.begin() as conn:
        mode = lock_mode(conn)
        if mode is LockMode.SKIP_LOCKED:
            stmt = stmt.with_for_update(skip_locked=True, of=notif)
        elif mode is LockMode.BLOCKING:
            stmt = stmt.with_for_update(of=notif)
        rows = conn.execute(stmt).all()
        if not rows:
            return 0, False
        notices = [
            DeadNotice(
                message_id=r.message_id,
                topic=r.topic,
                consumer_group=r.consumer_group,
                send_count=1 + int(r.resend_count or 0),
                queue_id=r.queue_id,
                queue_offset=r.queue_offset,
                reason=r.reason,
                dead_at=r.created_at.isoformat(),
            )
            for r in rows
        ]
        keys = [(r.message_id, r.consumer_group) for r in rows]
        where = and_(
            notif.c.channel == channel.name,
            or_(*[and_(notif.c.message_id == m, notif.c.consumer_group == g) for m, g in keys]),
        )
        try:
            channel.deliver(notices)
        except NotifyError as exc:
            log.warning(
                "notify via %s failed for %d notice(s), retried next round: %s", channel.name, len(keys), exc
            )
            conn.execute(
                update(notif).where(where).values(attempts=notif.c.attempts + 1, last_error=str(exc)[:2000])
            )
            return 0, True
        conn.execute(
            update(notif).where(where).values(attempts=notif.c.attempts + 1, notified_at=now, last_error=None)
        )
        return len(keys), False


def notification_rows(
    keys: Sequence[tuple[str, str]], reasons: Sequence[str], channels: Sequence[str], now: dt.datetime
) -> list[dict[str, Any]]:
    """The ``stub_notification`` rows owed: one per ``(message_id, consumer_group)`` and channel name."""
    return [
        {
            "message_id": m,
            "consumer_group": g,
            "channel": ch,
            "reason": r,
            "created_at": now,
            "notified_at": None,
            "attempts": 0,
        }
        for (m, g), r in zip(keys, reasons, strict=True)
        for ch in channels
    ]
