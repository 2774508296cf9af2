"""The public face: ``@idempotent_consumer`` as DESIGN.md §6 spells it, and the guard's transition table."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from sqlalchemy.orm import Session

import reliable
from reliable import ConsumeResult, Envelope, Reason, idempotent_consumer
from reliable.decision import OUTCOMES, Verdict, judge
from reliable.stores import StubRow
from reliable.types import LogOutcome, StubStatus
from tests.core.guard_helpers import apply, env, make_rel


def test_public_api_and_wrapper(sqlite_url: str, key_prefix: str) -> None:
    from tests.conftest import _ensure_clean_schema

    _ensure_clean_schema(sqlite_url)
    assert reliable.idempotent_consumer is idempotent_consumer
    rel = make_rel(sqlite_url, None, key_prefix)

    @idempotent_consumer(rel, group="g", registry=CollectorRegistry())
    def handle_order(e: Envelope, session: Session) -> None:
        """Apply an order."""
        apply(e, session)

    m = f"d-{uuid.uuid4().hex[:6]}"
    try:
        assert handle_order.__name__ == "handle_order" and handle_order.__doc__ == "Apply an order."
        assert handle_order.group == "g"
        assert handle_order(env(m)) is ConsumeResult.SUCCESS
        d = handle_order.decide(env(m))
        assert (d.result, d.outcome, d.reason, d.duplicate) == (
            ConsumeResult.SUCCESS,
            LogOutcome.DUPLICATE,
            Reason.DUPLICATE_CONFIRMED,
            True,
        )
        assert d.log_id is not None
        assert handle_order.batch([env(m), env(None)]) == [ConsumeResult.SUCCESS, ConsumeResult.DEAD_LETTER]
        assert handle_order.batch([]) == []
    finally:
        rel.close()


def test_bad_group_is_refused(sqlite_url: str, key_prefix: str) -> None:
    rel = make_rel(sqlite_url, None, key_prefix)
    try:
        with pytest.raises(ValueError):
            idempotent_consumer(rel, group="")(apply)
    finally:
        rel.close()


def test_every_reason_has_an_outcome() -> None:
    assert set(OUTCOMES) == set(Reason)
    for result, outcome, dup in OUTCOMES.values():
        assert dup == (outcome is LogOutcome.DUPLICATE)
        assert (result is ConsumeResult.DEAD_LETTER) == (outcome is LogOutcome.DEAD_LETTER)
        assert (result is ConsumeResult.RECONSUME_LATER) == (outcome is LogOutcome.RETRY)


_stub = st.one_of(
    st.none(),
    st.builds(
        StubRow,
        st.sampled_from(list(StubStatus)),
        st.one_of(st.none(), st.sampled_from(["h1", "h2"])),
        st.sampled_from(["g", "other"]),
    ),
)


@given(stub=_stub, claimed=st.booleans(), payload=st.one_of(st.none(), st.sampled_from(["h1", "h2"])))
def test_handler_runs_only_on_an_unconfirmed_matching_stub_of_our_group(
    stub: StubRow | None, claimed: bool, payload: str | None
) -> None:
    v = judge(stub, claimed, "g", payload)
    if claimed:
        assert v is Verdict.RUN_INBOX
        return
    runs = v is Verdict.RUN
    expected = (
        stub is not None
        and stub.consumer_group == "g"
        and stub.status in (StubStatus.PENDING, StubStatus.DEAD)
        and (payload is None or stub.payload_hash is None or stub.payload_hash == payload)
    )
    assert runs == expected
    if stub is not None and stub.status is StubStatus.CONFIRMED and v is not Verdict.DUPLICATE:
        assert v in (Verdict.MISMATCH, Verdict.FOREIGN_GROUP)


def test_hooks_see_every_step_in_order(sqlite_url: str, key_prefix: str) -> None:
    from collections.abc import Sequence

    from reliable import Decision, GuardHooks
    from tests.conftest import _ensure_clean_schema

    _ensure_clean_schema(sqlite_url)
    seen: list[str] = []

    class Recorder(GuardHooks):
        def before_journal(self, envs: Sequence[Envelope]) -> None:
            seen.append(f"before_journal:{len(envs)}")

        def after_journal(self, envs: Sequence[Envelope], log_ids: Sequence[int]) -> None:
            seen.append(f"after_journal:{len(log_ids)}")

        def before_handler(self, env: Envelope) -> None:
            seen.append(f"before_handler:{env.message_id}")

        def after_handler(self, env: Envelope, error: BaseException | None) -> None:
            seen.append(f"after_handler:{type(error).__name__}")

        def after_decision(self, env: Envelope, decision: Decision) -> None:
            seen.append(f"after_decision:{decision.reason.value}")

    rel = make_rel(sqlite_url, None, key_prefix)
    handle = idempotent_consumer(rel, group="g", registry=CollectorRegistry(), hooks=[Recorder()])(apply)
    try:
        handle(env("h1"))
        handle(env("h1"))
    finally:
        rel.close()
    assert seen == [
        "before_journal:1",
        "after_journal:1",
        "before_handler:h1",
        "after_handler:NoneType",
        "after_decision:processed",
        "before_journal:1",
        "after_journal:1",
        "after_decision:duplicate_confirmed",
    ]
