"""The channels that reach a person besides the log: e-mail over SMTP and a webhook (HTTP POST of JSON).

Why a module of its own: how a notice travels (the protocols, their settings, what counts as accepted) is
separate from which notices are owed and when (:mod:`.owed`, :mod:`.notify`). A channel raises
:class:`NotifyError` for anything that did not reach the other side; the caller keeps the notices owed.

:func:`check_reachable` is the start-up check of ``reliable sweep``: a wrong host or port otherwise showed
only at the first give-up, maybe weeks later, as a WARNING in a round's log.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import smtplib
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from email.message import EmailMessage
from typing import Any, Protocol

from reliable import constants as C
from reliable.sweeper.errors import NotifyError, SweeperConfigError
from reliable.sweeper.notices import DeadNotice, NoticeKind, body, event_name, subject

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

    def connect(self) -> smtplib.SMTP:
        """A connection to the server, greeted (EHLO), upgraded (STARTTLS) and logged in as configured."""
        cfg = self.config
        client: smtplib.SMTP
        if cfg.use_ssl:
            client = smtplib.SMTP_SSL(
                cfg.host, cfg.port, timeout=cfg.timeout_s, context=ssl.create_default_context()
            )
        else:
            client = smtplib.SMTP(cfg.host, cfg.port, timeout=cfg.timeout_s)
        try:
            client.ehlo()
            if cfg.starttls:
                client.starttls(context=ssl.create_default_context())
            if cfg.user:
                client.login(cfg.user, cfg.password or "")
        except BaseException:
            client.close()
            raise
        return client

    def _send(self, title: str, text: str) -> None:
        cfg = self.config
        msg = EmailMessage()
        msg["Subject"] = title
        msg["From"] = cfg.sender
        msg["To"] = ", ".join(cfg.recipients)
        msg.set_content(text)
        try:
            with self.connect() as client:
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
        if not url.lower().startswith(("http://", "https://")):  # the scheme is case-insensitive
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


def check_reachable(channel: Channel) -> str | None:
    """Whether ``channel``'s server answers (an SMTP connect and EHLO, a webhook's TCP connect); ``None``
    when it does, else what failed. Nothing is sent; a channel of another kind is not checked."""
    try:
        if isinstance(channel, EmailChannel):
            channel.connect().close()
        elif isinstance(channel, WebhookChannel):
            parts = urllib.parse.urlsplit(channel.url)
            default = 443 if parts.scheme.lower() == "https" else 80
            address = (parts.hostname or "", parts.port or default)
            socket.create_connection(address, timeout=channel.timeout_s).close()
    except (OSError, smtplib.SMTPException) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
