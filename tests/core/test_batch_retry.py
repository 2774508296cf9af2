"""A batch whose retry (with savepoints) leaves a single delivery must not take the one-statement fast path.

The fast path confirms the stub (or claims the inbox row) *before* the handler and relies on a handler
failure rolling back the whole transaction; inside a SAVEPOINT only the handler's writes roll back, so a
confirmed-then-failed delivery would be committed as done without its effect.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy.orm import Session

from reliable import Envelope, Reliability, idempotent_consumer
from reliable.guard.decision import Reason
from reliable.types import StubStatus
from tests.conftest import _ensure_clean_schema
from tests.core.guard_helpers import add_stub, applied, apply, env, make_rel, stub_status

GROUP = "retry"


@pytest.fixture(params=["sqlite", "postgres", "mariadb"])
def rel(request: pytest.FixtureRequest, redis_url: str, key_prefix: str) -> Iterator[Reliability]:
    url = str(request.getfixturevalue(f"{request.param}_url"))
    _ensure_clean_schema(url)
    r = make_rel(url, redis_url, key_prefix, max_attempts=5)
    yield r
    r.close()


@pytest.mark.parametrize("with_stubs", [True, False])
def test_last_survivor_of_a_batch_retry_that_fails_is_not_confirmed(
    rel: Reliability, with_stubs: bool
) -> None:
    a, b = env(f"ra-{with_stubs}"), env(f"rb-{with_stubs}")
    if with_stubs:
        add_stub(rel, a.message_id or "", GROUP)
        add_stub(rel, b.message_id or "", GROUP)
    calls: dict[str | None, int] = {}

    def handler(e: Envelope, session: Session) -> None:
        calls[e.message_id] = calls.get(e.message_id, 0) + 1
        if e.message_id == a.message_id or calls[e.message_id] == 2:
            raise RuntimeError("flaky")  # a always; b on its retry inside the savepoint pass
        apply(e, session)

    handle = idempotent_consumer(rel, group=GROUP)(handler)
    db, da = handle.decide_batch([b, a])  # b runs first, then a fails and the batch is retried
    assert calls == {a.message_id: 1, b.message_id: 2}
    assert da.reason is Reason.HANDLER_FAILED
    assert db.reason is Reason.HANDLER_FAILED
    assert applied(rel, b.message_id) == 0
    expected = StubStatus.PENDING if with_stubs else None
    assert stub_status(rel, b.message_id or "") is expected
    # and the redelivery processes it once
    assert handle.decide(b).reason is Reason.PROCESSED
    assert applied(rel, b.message_id) == 1
