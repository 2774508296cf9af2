"""``reliable sweep``: one round (``--once``) or a long-running sweeper (``--cron`` / ``--interval``).

The sender: broker adapters live outside this package, so the command imports one by name —
``--sender MODULE:FACTORY`` (or ``RELIABLE_SWEEP_SENDER``) names a callable ``factory(rel) -> Sender``. If
the object it returns also has ``max_offset(topic, queue_id)`` (the :class:`~reliable.sender.BrokerProbe`
protocol) it proves losses and feeds the backlog estimate, and if it has ``close()`` that is called on exit.

The database is checked first: missing, unreachable or not at the head revision → one line with the hint to
run ``reliable db upgrade`` (exit 2), never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from reliable import constants as C
from reliable.cli.common import add_db_options, one_line, port, ready_engine, require_db
from reliable.facade import Reliability
from reliable.sender import OutgoingMessage, Sender, SendReceipt
from reliable.sweeper import EmailChannel, SmtpConfig, Sweeper, WebhookChannel, metrics
from reliable.sweeper.backoff import parse_backoff, parse_duration
from reliable.sweeper.channels import Channel, check_reachable, env_flag
from reliable.sweeper.errors import SenderLoadError, SweeperConfigError
from reliable.sweeper.scheduler import make_trigger, run_scheduled


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "sweep",
        help="re-send lost message stubs (once, or on a cron/interval schedule)",
        description="Re-send stubs their consumer group never received, recover stuck ones, give up "
        "(DEAD + notify) when the budget is spent, and purge old log rows.",
    )
    when = p.add_mutually_exclusive_group(required=True)
    when.add_argument("--once", action="store_true", help="run one round and exit")
    when.add_argument("--cron", metavar="EXPR", help='crontab schedule in UTC, e.g. "*/1 * * * *"')
    when.add_argument("--interval", metavar="DURATION", help="fixed interval, e.g. 30s, 5m")
    add_db_options(p, redis=True)
    env = os.environ.get
    p.add_argument(
        "--sender",
        metavar="MODULE:FACTORY",
        default=env(C.ENV_SWEEP_SENDER),
        help=f"import path of factory(rel) -> Sender (env {C.ENV_SWEEP_SENDER})",
    )
    p.add_argument("--batch", type=int, help="stubs per claim (default: setting sweep_batch)")
    p.add_argument("--max-sends", type=int, help="send budget before DEAD (default: setting max_sends)")
    p.add_argument("--max-batches", type=int, help="cap on batches per round (default: until nothing is due)")
    p.add_argument("--stuck-after", metavar="DURATION", help="received, unconfirmed: stuck after this")
    p.add_argument("--log-retention", metavar="DURATION", help="purge settled log rows older than this")
    p.add_argument(
        "--stall-after",
        metavar="DURATION",
        help="alarm when a group's position is still this long while it owes messages (stall_after_s)",
    )
    p.add_argument(
        "--purge-duty-cycle",
        type=float,
        help="share of time the log purge works, (0, 1] (setting purge_duty_cycle)",
    )
    p.add_argument(
        "--backoff",
        metavar="SPEC",
        default=env(C.ENV_SWEEP_BACKOFF),
        help="fixed:1s,5s,… or exp:base=30s,factor=2,cap=1h,jitter=0.2,seed=1 (default: RocketMQ levels)",
    )
    p.add_argument("--backlog-cap", metavar="DURATION", default="1d", help="bound of the backlog estimate")
    p.add_argument(
        "--max-unconfirmed-age",
        metavar="DURATION",
        default="1d",
        help="without a broker probe answer (RabbitMQ), re-send a never-received copy this old",
    )
    p.add_argument(
        "--claim-ttl",
        metavar="DURATION",
        help="claim window: claimed rows are not due for this long (default 5m; a killed sweeper's rows "
        "are due again after it); no row lock is held while sending",
    )
    mail = p.add_argument_group(
        "e-mail notification",
        "Each flag defaults from its RELIABLE_SMTP_* variable and wins over it; the password is read only "
        f"from {C.ENV_SMTP_PASSWORD}, never a flag (`ps` would show it). No host, no e-mail.",
    )
    mail.add_argument(
        "--smtp-host", default=env(C.ENV_SMTP_HOST), help=f"SMTP server (env {C.ENV_SMTP_HOST})"
    )
    mail.add_argument(
        "--smtp-port",
        default=env(C.ENV_SMTP_PORT),
        help=f"default 465 with --smtp-ssl, else 25 (env {C.ENV_SMTP_PORT})",
    )
    # no default here: _smtp() decides, so that a flag can turn off what a variable turned on
    mail.add_argument(
        "--smtp-starttls",
        action=argparse.BooleanOptionalAction,
        help=f"upgrade the connection with STARTTLS (env {C.ENV_SMTP_STARTTLS})",
    )
    mail.add_argument(
        "--smtp-ssl",
        action=argparse.BooleanOptionalAction,
        help=f"connect over TLS from the start (env {C.ENV_SMTP_SSL}); --smtp-starttls alone turns it off",
    )
    mail.add_argument(
        "--smtp-user", default=env(C.ENV_SMTP_USER), help=f"log in as this user (env {C.ENV_SMTP_USER})"
    )
    mail.add_argument(
        "--smtp-from", default=env(C.ENV_SMTP_FROM), help=f"sender address (env {C.ENV_SMTP_FROM})"
    )
    mail.add_argument(
        "--smtp-to",
        action="append",
        default=None,
        help=f"recipient, repeatable; replaces {C.ENV_SMTP_TO} (comma-separated) when given",
    )
    p.add_argument("--webhook", metavar="URL", default=env(C.ENV_WEBHOOK_URL), help="POST JSON notices here")
    p.add_argument(
        "--notify-timeout",
        metavar="DURATION",
        default="10s",
        help="give up on one notice delivery after this long (default 10s)",
    )
    p.add_argument("--metrics-port", type=port, help="serve Prometheus /metrics on 127.0.0.1:PORT")
    p.add_argument(
        "--metrics-textfile",
        metavar="PATH",
        help="with --once: write the metrics to PATH after the round (node_exporter's textfile collector; "
        "PATH ending in .prom)",
    )
    p.set_defaults(func=_sweep)


def load_sender(spec: str | None, rel: Reliability) -> Sender:
    if not spec:
        raise SenderLoadError(f"no sender: pass --sender MODULE:FACTORY or set {C.ENV_SWEEP_SENDER}")
    module_name, colon, attr = spec.partition(":")
    if not colon or not module_name or not attr:
        raise SenderLoadError(f"--sender must look like package.module:factory, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SenderLoadError(f"cannot import sender module {module_name!r}: {exc}") from None
    factory: Callable[[Reliability], object] | None = getattr(module, attr, None)
    if not callable(factory):
        raise SenderLoadError(f"{module_name!r} has no callable {attr!r}")
    try:
        inspect.signature(factory).bind(rel)
    except TypeError:
        raise SenderLoadError(
            f"{spec} is not a sender factory: it must take the Reliability, factory(rel) -> Sender"
        ) from None
    except ValueError:  # no signature to read (some builtins): calling it says
        pass
    sender = factory(rel)
    if not isinstance(sender, Sender):
        raise SenderLoadError(f"{spec} returned {type(sender).__name__}, which has no send(message) method")
    return sender


def _smtp(args: argparse.Namespace) -> SmtpConfig | None:
    """One configuration from the flags, each of which already defaults from its ``RELIABLE_SMTP_*``
    variable: validating the environment alone first refused a host from the environment whose addresses
    came as flags, and building from the flags alone dropped the environment's user (unauthenticated mail
    that a relay requiring a login refuses)."""
    if not args.smtp_host:
        return None
    starttls, use_ssl = _tls_modes(args.smtp_starttls, args.smtp_ssl)
    if args.smtp_port:
        try:
            smtp_port = int(args.smtp_port)
        except ValueError:
            raise SweeperConfigError(
                f"--smtp-port ({C.ENV_SMTP_PORT}) is not a port number: {args.smtp_port!r}"
            ) from None
    else:
        smtp_port = 465 if use_ssl else 25
    to = args.smtp_to if args.smtp_to else (os.environ.get(C.ENV_SMTP_TO) or "").split(",")
    return SmtpConfig(
        host=args.smtp_host,
        port=smtp_port,
        sender=args.smtp_from or "",
        recipients=tuple(a.strip() for a in to if a.strip()),
        starttls=starttls,
        use_ssl=use_ssl,
        user=args.smtp_user or None,
        password=os.environ.get(C.ENV_SMTP_PASSWORD) or None,  # never on the command line: `ps` would show it
        timeout_s=parse_duration(args.notify_timeout),
    )


def _tls_modes(starttls_flag: bool | None, ssl_flag: bool | None) -> tuple[bool, bool]:
    """(STARTTLS, TLS from the start): a flag given wins over its variable, and a mode given as a flag
    turns off the other mode's variable — ``RELIABLE_SMTP_SSL=yes`` with ``--smtp-starttls`` is STARTTLS,
    not a refusal to start ("both modes"), and ``--no-smtp-ssl`` turns the variable off."""
    env = os.environ.get
    starttls = (
        env_flag(env(C.ENV_SMTP_STARTTLS), C.ENV_SMTP_STARTTLS) if starttls_flag is None else starttls_flag
    )
    use_ssl = env_flag(env(C.ENV_SMTP_SSL), C.ENV_SMTP_SSL) if ssl_flag is None else ssl_flag
    if starttls_flag and ssl_flag is None:
        use_ssl = False
    if ssl_flag and starttls_flag is None:
        starttls = False
    return starttls, use_ssl


def build_sweeper(args: argparse.Namespace, rel: Reliability, sender: Sender) -> Sweeper:
    if parse_duration(args.notify_timeout) <= 0:  # every notice would time out at once, nobody told
        raise SweeperConfigError(f"--notify-timeout must be > 0, got {args.notify_timeout!r}")
    channels: list[Channel] = []
    smtp = _smtp(args)
    if smtp is not None:
        channels.append(EmailChannel(smtp))
    if args.webhook:
        channels.append(WebhookChannel(args.webhook, parse_duration(args.notify_timeout)))
    for name in ("batch", "max_sends", "max_batches"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise SweeperConfigError(f"--{name.replace('_', '-')} must be > 0")
    return Sweeper(
        rel,
        sender,
        backoff=parse_backoff(args.backoff) if args.backoff is not None else None,
        max_unconfirmed_age_s=parse_duration(args.max_unconfirmed_age),
        backlog_cap_s=parse_duration(args.backlog_cap),
        channels=channels,
        batch=args.batch,
        max_sends=args.max_sends,
        max_batches=args.max_batches,
        stuck_after_s=parse_duration(args.stuck_after) if args.stuck_after else None,
        log_retention_s=parse_duration(args.log_retention) if args.log_retention is not None else None,
        claim_ttl_s=parse_duration(args.claim_ttl) if args.claim_ttl else None,
        stall_after_s=parse_duration(args.stall_after) if args.stall_after else None,
        purge_duty_cycle=args.purge_duty_cycle,
    )


def _sweep(args: argparse.Namespace) -> int:
    db = require_db(args)
    trigger = None if args.once else make_trigger(cron=args.cron, interval=args.interval)
    if args.metrics_textfile and trigger is not None:
        raise SweeperConfigError(
            "--metrics-textfile is for --once (cron); a long-running sweeper: --metrics-port"
        )
    swlog = logging.getLogger("reliable.sweeper")
    if swlog.getEffectiveLevel() > logging.INFO:
        swlog.setLevel(logging.INFO)  # the one summary line per round is the point of a scheduled sweeper
    ready_engine(db).dispose()
    rel = Reliability(db, redis_url=args.redis or "")
    _warn_if_redis_unreachable(rel, swlog)
    sender: Sender | None = None
    try:
        # every flag checked before the sender starts: a bad one was said after the sender's own start-up
        # (a broker_sim heartbeat warning) made it look like a broker problem
        build_sweeper(args, rel, _NotLoaded())
        sender = load_sender(args.sender, rel)
        sweeper = build_sweeper(args, rel, sender)
        check_channels(sweeper.channels, swlog)
        if args.metrics_port:
            metrics.serve(args.metrics_port)
        if trigger is None:
            try:
                print(sweeper.run_once().line())
            finally:  # a failed round too: its error counter and last round's time are what an alert reads
                if args.metrics_textfile:
                    metrics.write_textfile(args.metrics_textfile)
            sys.stdout.flush()
            return 0
        return run_scheduled(sweeper, trigger, run_now=True)
    finally:
        close = getattr(sender, "close", None)
        if callable(close):
            close()
        rel.close()


def check_channels(channels: Sequence[Channel], log: logging.Logger) -> None:
    """Say at start-up what would otherwise show at the first give-up, maybe weeks later: no channel to
    reach a person but this log (a missing env file looks like that), or a channel's server that does not
    answer (an ERROR, not fatal: its notices stay owed until it does)."""
    if not any(c.name in (C.NOTIFY_CHANNEL_EMAIL, C.NOTIFY_CHANNEL_WEBHOOK) for c in channels):
        log.warning(
            "no e-mail or webhook channel configured (--smtp-host, --webhook; %s, %s): DEAD notices go to "
            "this log only, unless another sweeper of this database has channels (each owes them on its own)",
            C.ENV_SMTP_HOST,
            C.ENV_WEBHOOK_URL,
        )
    for channel in channels:
        problem = check_reachable(channel)
        if problem is not None:
            log.error(
                "notification channel %s does not answer at start-up: %s (its notices wait until it does)",
                channel.name,
                problem,
            )


class _NotLoaded:
    """The sender of the sweeper built only to check the flags; never asked to send."""

    def send(self, message: OutgoingMessage) -> SendReceipt:
        raise AssertionError("a sweeper built to check its flags was asked to send")


def _warn_if_redis_unreachable(rel: Reliability, log: logging.Logger) -> None:
    """One warning when the configured Redis does not answer (a wrong URL, port or password looks the same
    as a Redis that is down): the sweeper still works from the database, but cannot see a worker's live
    lease, so a stuck row may be re-sent while a worker still has it (a duplicate the guards absorb)."""
    if rel.redis is None:
        return
    try:
        rel.redis.ping()
    except Exception as exc:  # any client error: the round goes on without leases, said once here
        log.warning("Redis does not answer (%s): lease checks are skipped until it does", one_line(exc))
