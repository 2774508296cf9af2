"""The public face: ``@idempotent_consumer`` as DESIGN.md §6 spells it, and the guard's transition table."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from sqlalchemy import func, select
from sqlalchemy.orm import Session

import reliable
from reliable import ConsumeResult, Envelope, Reason, idempotent_consumer
from reliable.errors import ConfigurationError
from reliable.guard.decision import OUTCOMES
from reliable.types import LogOutcome
from tests.core.guard_helpers import add_stub, apply, env, ledger, make_rel


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


@pytest.mark.parametrize("group", ["", "billing:eu", "bad group", "x" * 256])
def test_bad_group_is_refused(sqlite_url: str, key_prefix: str, group: str) -> None:
    """The producer's rule (reliable.names). ``billing:eu``'s Redis key for message ``o-1`` would be
    ``billing``'s for message ``eu:o-1``, which ``billing`` would then answer from the other group's
    ``done`` marker, its handler never run."""
    rel = make_rel(sqlite_url, None, key_prefix)
    try:
        with pytest.raises(ConfigurationError, match="consumer group"):
            idempotent_consumer(rel, group=group)(apply)
    finally:
        rel.close()


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"redis_retry_after_s": "x"}, "redis_retry_after_s"),  # TypeError on every delivery, Redis down
        ({"redis_retry_after_s": -1}, "redis_retry_after_s"),  # Redis retried on every message
        ({"redis_retry_after_s": float("nan")}, "redis_retry_after_s"),
        ({"durable_journal": "no"}, "durable_journal"),  # a truthy string: taken as yes
    ],
)
def test_bad_guard_options_are_refused_when_decorating(
    sqlite_url: str, key_prefix: str, options: dict[str, Any], said: str
) -> None:
    rel = make_rel(sqlite_url, None, key_prefix)
    try:
        with pytest.raises(ConfigurationError, match=said):
            idempotent_consumer(rel, group="g", **options)
    finally:
        rel.close()


def test_every_reason_has_an_outcome() -> None:
    assert set(OUTCOMES) == set(Reason)
    for result, outcome, dup in OUTCOMES.values():
        assert dup == (outcome is LogOutcome.DUPLICATE)
        assert (result is ConsumeResult.DEAD_LETTER) == (outcome is LogOutcome.DEAD_LETTER)
        assert (result is ConsumeResult.RECONSUME_LATER) == (outcome is LogOutcome.RETRY)


# --- the ledger model: an oracle that knows nothing of judge() -------------------------------------------
# Deliveries of a few ids to two groups, some staged by a producer, some with a tampered body, some whose
# handler raises. The model states only what a user is promised: each group applies each message at most
# once, and only with the producer's body (without a producer: the first body its handler saw); a SUCCESS
# answer means the effect is in the ledger; a handler failure leaves no effect and never answers SUCCESS.

_delivery = st.tuples(
    st.sampled_from(["g1", "g2"]),  # group
    st.sampled_from(["m0", "m1", "m2"]),  # message
    st.sampled_from([b"A", b"B"]),  # body (A is what a producer stages)
    st.booleans(),  # the handler raises
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    staged=st.dictionaries(
        st.sampled_from(["m0", "m1", "m2"]), st.sets(st.sampled_from(["g1", "g2"]), min_size=1)
    ),
    deliveries=st.lists(_delivery, min_size=1, max_size=12),
)
def test_ledger_model_each_group_applies_each_message_once_with_its_body(
    sqlite_url: str, staged: dict[str, set[str]], deliveries: list[tuple[str, str, bytes, bool]]
) -> None:
    from tests.conftest import _ensure_clean_schema

    _ensure_clean_schema(sqlite_url)
    rel = make_rel(sqlite_url, None, f"p{uuid.uuid4().hex[:8]}", max_attempts=1000)
    run = uuid.uuid4().hex[:6]
    effects: list[tuple[str, str, bytes]] = []  # the ledger: (group, message, body applied)

    def handler_for(group: str) -> object:
        def handle(e: Envelope, session: Session) -> None:
            apply(e, session, note=group)
            if e.properties.get("fail") == "1":
                raise RuntimeError("handler failed")
            effects.append((group, str(e.message_id), e.body))

        return idempotent_consumer(rel, group=group, registry=CollectorRegistry())(handle)

    handlers = {g: handler_for(g) for g in ("g1", "g2")}
    reference: dict[tuple[str, str], bytes] = {}  # the body a group may apply
    for m, groups in staged.items():
        add_stub(rel, f"{run}{m}", sorted(groups), body=b"A")
        for g in groups:
            reference[g, m] = b"A"
    try:
        for group, m, body, fails in deliveries:
            e = Envelope(f"{run}{m}", "orders", 0, 0, body, properties={"fail": "1" if fails else "0"})
            before = effects.count((group, f"{run}{m}", body))
            done = any(x[:2] == (group, f"{run}{m}") for x in effects)
            result = handlers[group](e)  # type: ignore[operator]
            applied_now = effects.count((group, f"{run}{m}", body)) - before
            ref = reference.get((group, m))
            if ref is not None and body != ref:  # not the body this group may apply: refused, never acked
                assert (result, applied_now) == (ConsumeResult.DEAD_LETTER, 0)
            elif done:  # applied before: acknowledged, not applied again
                assert (result, applied_now) == (ConsumeResult.SUCCESS, 0)
            elif fails:  # no effect, redelivery wanted; without a producer this body is now the one
                assert (result, applied_now) == (ConsumeResult.RECONSUME_LATER, 0)
                reference.setdefault((group, m), body)
            else:
                assert (result, applied_now) == (ConsumeResult.SUCCESS, 1)
                reference.setdefault((group, m), body)
            if result is ConsumeResult.SUCCESS:
                assert any(x == (group, f"{run}{m}", reference[group, m]) for x in effects)
        # the invariant over the whole run: at most one effect per (group, message), with its reference body
        for group, mid, body in effects:
            assert effects.count((group, mid, body)) == 1
            assert body == reference[group, mid.removeprefix(run)]
        assert len({(g, mid) for g, mid, _ in effects}) == len(effects)
        with rel.engine.connect() as conn:
            rows = conn.execute(
                select(ledger.c.note, ledger.c.message_id, func.count())
                .where(ledger.c.message_id.like(f"{run}%"))
                .group_by(ledger.c.note, ledger.c.message_id)
            ).all()
        assert {(r[0], r[1]): r[2] for r in rows} == {(g, mid): 1 for g, mid, _ in effects}
    finally:
        rel.close()


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
