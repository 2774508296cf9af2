"""Counters on an isolated registry and the structured decision line."""

from __future__ import annotations

import logging
import uuid

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy.orm import Session

from reliable import Envelope, Reliability, idempotent_consumer
from reliable.metrics import guard_metrics
from reliable.stores.lease import lease_key
from tests.core.guard_helpers import apply, env, make_rel


def value(reg: CollectorRegistry, name: str, **labels: str) -> float:
    return reg.get_sample_value(name, labels) or 0.0


def test_guard_metrics_is_one_set_per_registry() -> None:
    a, b = CollectorRegistry(), CollectorRegistry()
    assert guard_metrics(a) is guard_metrics(a)
    assert guard_metrics(a) is not guard_metrics(b)


def test_counters_follow_decisions(sqlite_url: str, redis_url: str, key_prefix: str) -> None:
    from tests.conftest import _ensure_clean_schema

    _ensure_clean_schema(sqlite_url)
    rel: Reliability = make_rel(sqlite_url, redis_url, key_prefix, max_attempts=2)
    reg = CollectorRegistry()

    @idempotent_consumer(rel, group="gm", registry=reg)
    def handle(e: Envelope, session: Session) -> None:
        apply(e, session)
        if e.message_id and e.message_id.startswith("bad"):
            raise RuntimeError("x")

    m, bad, held = (f"{t}-{uuid.uuid4().hex[:6]}" for t in ("ok", "bad", "held"))
    try:
        handle(env(m))
        handle(env(m))
        handle(env(bad))
        handle(env(bad))
        handle(env(None))
        assert rel.redis is not None
        rel.redis.set(lease_key(key_prefix, "gm", held), "processing:x", px=10_000)
        handle(env(held))
    finally:
        rel.close()
    msgs = "reliable_messages_total"
    assert value(reg, msgs, group="gm", outcome="SUCCESS", reason="processed") == 1
    assert value(reg, msgs, group="gm", outcome="DUPLICATE", reason="duplicate_done_marker") == 1
    assert value(reg, msgs, group="gm", outcome="RETRY", reason="handler_failed") == 1
    assert value(reg, msgs, group="gm", outcome="DEAD_LETTER", reason="max_attempts") == 1
    assert value(reg, msgs, group="gm", outcome="DEAD_LETTER", reason="missing_message_id") == 1
    assert value(reg, "reliable_duplicates_suppressed_total", group="gm", source="redis") == 1
    assert value(reg, "reliable_handler_failures_total", group="gm") == 2
    assert value(reg, "reliable_lease_conflicts_total", group="gm") == 1


def test_one_structured_line_per_decision(
    sqlite_url: str, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.conftest import _ensure_clean_schema

    _ensure_clean_schema(sqlite_url)
    rel = make_rel(sqlite_url, None, key_prefix)
    handle = idempotent_consumer(rel, group="gl", registry=CollectorRegistry())(apply)
    m = f"log-{uuid.uuid4().hex[:6]}"
    try:
        with caplog.at_level(logging.INFO, logger="reliable.guard"):
            handle(env(m))
            handle(env(None))
    finally:
        rel.close()
    lines = [r for r in caplog.records if r.getMessage().startswith("decision ")]
    assert len(lines) == 2
    ok, dead = lines
    assert f"message_id={m} group=gl outcome=SUCCESS" in ok.getMessage() and ok.levelno == logging.INFO
    assert ok.__dict__["reason"] == "processed" and ok.__dict__["duplicate"] is False
    assert dead.levelno == logging.ERROR and dead.__dict__["reason"] == "missing_message_id"
    assert dead.__dict__["outcome"] == "DEAD_LETTER"
