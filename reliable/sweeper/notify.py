"""Telling a person: log (always), e-mail over SMTP, webhook (HTTP POST JSON).

What is told — a stub gone DEAD, a queue never consumed, a group that stopped consuming — and its text per
kind are in :mod:`.notices`; this module owes and delivers. The log line is written in the round that
raises the notice, unconditionally. E-mail and webhook are *owed*: the
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
import http.client
import json
import logging
import os
import smtplib
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from email.message import EmailMessage
from typing import Any, Protocol

from sqlalchemy import ColumnElement, Connection, Engine, and_, case, func, or_, select, update

from reliable import constants as C
from reliable.sweeper.claim import LockMode, lock_mode
from reliable.sweeper.errors import NotifyError, SweeperConfigError
from reliable.sweeper.notices import DeadNotice, NoticeKind, body, dead_line, event_name, parse_tag, subject
from reliable.sweeper.selection import inbox, notif, stub

log = logging.getLogger("reliable.sweeper")


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
        use_ssl = env_flag(env.get(C.ENV_SMTP_SSL, ""), C.ENV_SMTP_SSL)
        try:
            port = int(env.get(C.ENV_SMTP_PORT) or (465 if use_ssl else 25))
        except ValueError:
            raise SweeperConfigError(f"{C.ENV_SMTP_PORT} is not a port number") from None
        return cls(
            host=host,
            port=port,
            sender=env.get(C.ENV_SMTP_FROM, ""),
            recipients=tuple(a.strip() for a in env.get(C.ENV_SMTP_TO, "").split(",") if a.strip()),
            starttls=env_flag(env.get(C.ENV_SMTP_STARTTLS, ""), C.ENV_SMTP_STARTTLS),
            use_ssl=use_ssl,
            user=env.get(C.ENV_SMTP_USER) or None,
            password=env.get(C.ENV_SMTP_PASSWORD) or None,
        )


def env_flag(text: str | None, name: str = "") -> bool:
    """A yes/no environment variable: ``1``, ``true``, ``yes``, ``on`` / ``0``, ``false``, ``no``, ``off``;
    unset or empty is no. Anything else is refused: ``RELIABLE_SMTP_STARTTLS=required`` was read as "no",
    and the login went out in clear text."""
    word = (text or "").strip().lower()
    if word in {"1", "true", "yes", "on"}:
        return True
    if word in {"", "0", "false", "no", "off"}:
        return False
    raise SweeperConfigError(f"{name or 'a yes/no variable'}: cannot read {text!r} as yes/no (use yes or no)")


class EmailChannel:
    name = C.NOTIFY_CHANNEL_EMAIL

    def __init__(self, config: SmtpConfig) -> None:
        self.config = config

    def deliver(self, notices: Sequence[DeadNotice]) -> None:
        for kind, same in by_kind(notices):
            self._send(subject(kind, same), body(kind, same))

    def _send(self, title: str, text: str) -> None:
        cfg = self.config
        msg = EmailMessage()
        msg["Subject"] = title
        msg["From"] = cfg.sender
        msg["To"] = ", ".join(cfg.recipients)
        msg.set_content(text)
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
    """POSTs ``{"event": …, "count": N, "notices": [...]}`` per kind (``reliable.stub.dead``,
    ``reliable.queue.never_consumed``, ``reliable.group.stalled``); any non-2xx is a failure."""

    name = C.NOTIFY_CHANNEL_WEBHOOK

    def __init__(
        self,
        url: str,
        timeout_s: float = C.DEFAULT_NOTIFY_TIMEOUT_S,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise SweeperConfigError(f"webhook URL must be http(s)://…, got {url!r}")
        try:
            parts = urllib.parse.urlsplit(url)
            parts.port  # noqa: B018 — raises ValueError for a port that is not a number
        except ValueError as exc:
            raise SweeperConfigError(f"webhook URL {url!r}: {exc}") from None
        if not parts.hostname:
            raise SweeperConfigError(f"webhook URL {url!r} names no host")
        self.url, self.timeout_s, self.headers = url, timeout_s, dict(headers or {})

    def deliver(self, notices: Sequence[DeadNotice]) -> None:
        for kind, same in by_kind(notices):
            self._post(
                {
                    "event": event_name(kind),
                    "count": len(same),
                    "notices": [asdict(n) | {"kind": n.kind.value} for n in same],
                }
            )

    def _post(self, payload: dict[str, Any]) -> None:
        request = urllib.request.Request(
            self.url,
            data=json.dumps(payload).encode(),
            method="POST",
            headers={"Content-Type": "application/json", **self.headers},
        )
        try:
            with _NO_REDIRECTS.open(request, timeout=self.timeout_s) as response:
                status = int(response.status)
        except urllib.error.HTTPError as exc:
            raise NotifyError(f"webhook {self.url}: HTTP {exc.code}") from exc
        except (OSError, urllib.error.URLError, http.client.HTTPException, ValueError) as exc:
            # a reply that is not HTTP, a URL the client cannot use: this channel failed, the round goes on
            raise NotifyError(f"webhook {self.url}: {type(exc).__name__}: {exc}") from exc
        if not 200 <= status < 300:
            raise NotifyError(f"webhook {self.url}: HTTP {status}")


class _Refuse3xx(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer, not a delivery: urllib would follow a 301/302/303 with a GET without the
    body, and a 200 to that GET looked like the notice was delivered."""

    def redirect_request(
        self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> None:
        raise urllib.error.HTTPError(req.full_url, code, f"redirect to {newurl} not followed", headers, fp)


_NO_REDIRECTS = urllib.request.build_opener(_Refuse3xx)


def by_kind(notices: Sequence[DeadNotice]) -> list[tuple[NoticeKind, list[DeadNotice]]]:
    """``notices`` split by kind, kinds in order of first appearance (one message per kind)."""
    out: dict[NoticeKind, list[DeadNotice]] = {}
    for n in notices:
        out.setdefault(n.kind, []).append(n)
    return list(out.items())


def log_dead(notice: DeadNotice) -> None:
    """The always-on channel: one ERROR line per dead stub, in the round that gave up."""
    log.error("%s", dead_line(notice))


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
    """One batch of ``channel``'s owed rows, the least-tried first, then the oldest: one delivery per kind;
    returns (rows delivered, whether a delivery failed).

    A kind that fails does not hold back the others (a receiver refusing ``never_consumed`` events kept
    every later DEAD notice from being posted, for ever), and a row that keeps failing sorts behind fresh
    ones. Only the ``stub_notification`` rows are locked while the channel works: the message's position is
    read without a lock — MariaDB has no ``FOR UPDATE OF``, and held the message's stub and inbox rows for
    the length of the HTTP or SMTP call, so its groups' guards waited on them."""
    owed = (
        select(notif.c.message_id, notif.c.consumer_group, notif.c.reason, notif.c.created_at)
        .where(notif.c.channel == channel.name, notif.c.notified_at.is_(None))
        .order_by(notif.c.attempts, notif.c.created_at)
        .limit(batch)
    )
    with engine.begin() as conn:
        mode = lock_mode(conn)
        if mode is LockMode.SKIP_LOCKED:
            owed = owed.with_for_update(skip_locked=True)
        elif mode is LockMode.BLOCKING:
            owed = owed.with_for_update()
        rows = conn.execute(owed).all()
        if not rows:
            return 0, False
        where_are = _positions(conn, channel.name, [(r.message_id, r.consumer_group) for r in rows])
        delivered, failed = 0, False
        for kind, notices in by_kind(
            [_notice(r, where_are.get((r.message_id, r.consumer_group))) for r in rows]
        ):
            keys = [(n.message_id, n.consumer_group) for n in notices]
            where = and_(notif.c.channel == channel.name, keys_in(keys))
            try:
                channel.deliver(notices)
            except NotifyError as exc:
                log.warning(
                    "notify via %s failed for %d %s notice(s), retried next round: %s",
                    channel.name,
                    len(keys),
                    kind.value,
                    exc,
                )
                conn.execute(
                    update(notif)
                    .where(where)
                    .values(attempts=notif.c.attempts + 1, last_error=str(exc)[:2000])
                )
                failed = True
                continue
            conn.execute(
                update(notif)
                .where(where)
                .values(attempts=notif.c.attempts + 1, notified_at=now, last_error=None)
            )
            delivered += len(keys)
        return delivered, failed


def keys_in(keys: Sequence[tuple[str, str]]) -> ColumnElement[bool]:
    """The ``stub_notification`` rows of these ``(message_id, consumer_group)`` keys."""
    return or_(*[and_(notif.c.message_id == m, notif.c.consumer_group == g) for m, g in keys])


def _positions(conn: Connection, channel: str, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], Any]:
    """Where each owed notice's message is (its topic, the group's newest copy), read without a lock."""
    group_row = and_(
        inbox.c.message_id == notif.c.message_id, inbox.c.consumer_group == notif.c.consumer_group
    )
    stmt = (
        select(
            notif.c.message_id,
            notif.c.consumer_group,
            stub.c.topic,
            inbox.c.resend_count,
            func.coalesce(inbox.c.queue_id, stub.c.queue_id).label("queue_id"),
            func.coalesce(inbox.c.queue_offset, stub.c.queue_offset).label("queue_offset"),
            # the newest copy's broker group: a targeted resend's (on the inbox row), else the producer's
            case((inbox.c.queue_offset.is_not(None), inbox.c.broker_name), else_=stub.c.broker_name).label(
                "broker_name"
            ),
        )
        # outer joins: a stall's rows are keyed by their queue, not by a message (notices.stall_key)
        .select_from(
            notif.outerjoin(stub, stub.c.message_id == notif.c.message_id).outerjoin(inbox, group_row)
        )
        .where(notif.c.channel == channel, keys_in(keys))
    )
    return {(r.message_id, r.consumer_group): r for r in conn.execute(stmt)}


def _notice(r: Any, at: Any) -> DeadNotice:
    """A notice from an owed row (``at``: its message's position, :func:`_positions`): its kind from the
    reason's tag, a queue-level row's topic and queue too."""
    tag = parse_tag(r.reason)
    return DeadNotice(
        message_id=r.message_id,
        topic=tag.queue.topic if tag is not None else ((at.topic if at is not None else None) or ""),
        consumer_group=r.consumer_group,
        send_count=0 if tag is not None else 1 + int((at.resend_count if at is not None else 0) or 0),
        queue_id=tag.queue.queue_id if tag is not None else (at.queue_id if at is not None else None),
        queue_offset=tag.watermark if tag is not None else (at.queue_offset if at is not None else None),
        reason=r.reason,
        dead_at=r.created_at.isoformat(),
        kind=NoticeKind.DEAD if tag is None else tag.kind,
        broker_name=tag.queue.broker_name
        if tag is not None
        else ((at.broker_name if at is not None else "") or ""),
    )


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


def told_rows(
    keys: Sequence[tuple[str, str]], reasons: Sequence[str], channels: Sequence[str], now: dt.datetime
) -> list[dict[str, Any]]:
    """:func:`notification_rows` owed on ``channels``, plus each key's ``log`` row written delivered: the log
    line goes out at once, and that row is what tells later rounds that a person was told."""
    logged = notification_rows(keys, reasons, [C.NOTIFY_CHANNEL_LOG], now)
    for row in logged:
        row["notified_at"] = now
    return notification_rows(keys, reasons, channels, now) + logged
