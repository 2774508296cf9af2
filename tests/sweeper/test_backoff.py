"""Backoff policies and duration parsing (property tests) and the schema of migration 0002."""

from __future__ import annotations

import datetime as dt
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import inspect

from reliable import constants as C
from reliable.facade import make_engine
from reliable.migrate import downgrade, upgrade
from reliable.sweeper import ExponentialBackoff, FixedBackoff, parse_backoff, parse_duration
from reliable.sweeper.errors import SweeperConfigError

delays = st.lists(st.floats(min_value=0.001, max_value=1e6, allow_nan=False), min_size=1, max_size=20)


@given(delays, st.integers(min_value=-5, max_value=10_000))
def test_fixed_backoff_walks_the_list_then_repeats_the_last(ds: list[float], n: int) -> None:
    policy = FixedBackoff(tuple(ds))
    expected = ds[min(max(n, 1), len(ds)) - 1]
    assert policy.delay(n) == dt.timedelta(seconds=expected)


@given(
    base=st.floats(min_value=0.001, max_value=1e4),
    factor=st.floats(min_value=1, max_value=10),
    cap=st.floats(min_value=0.001, max_value=1e6),
    jitter=st.floats(min_value=0, max_value=0.99),
    seed=st.integers(min_value=0, max_value=2**32),
    counts=st.lists(st.integers(min_value=1, max_value=5000), min_size=1, max_size=30),
)
def test_exponential_backoff_is_bounded_positive_and_seeded(
    base: float, factor: float, cap: float, jitter: float, seed: int, counts: list[int]
) -> None:
    a = ExponentialBackoff(base, factor, cap, jitter, seed)
    b = ExponentialBackoff(base, factor, cap, jitter, seed)
    for n in counts:
        d = a.delay(n).total_seconds()
        assert d == b.delay(n).total_seconds()  # same seed, same sequence
        raw = (
            cap if (n - 1) * math.log(factor) + math.log(base) >= math.log(cap) else base * factor ** (n - 1)
        )
        raw = min(raw, cap)
        # timedelta keeps microseconds: allow one of rounding
        assert raw * (1 - jitter) - 1e-6 <= d <= raw * (1 + jitter) + 1e-6
        assert d > 0


@given(st.integers(min_value=1, max_value=60))
def test_exponential_without_jitter_doubles_until_the_cap(n: int) -> None:
    policy = ExponentialBackoff(1.0, 2.0, 600.0)
    assert policy.delay(n).total_seconds() == min(600.0, 2.0 ** (n - 1))


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(["ms", "s", "m", "h", "d", ""]))
def test_parse_duration_round_trips(value: int, unit: str) -> None:
    scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "": 1}[unit]
    assert parse_duration(f"{value}{unit}") == pytest.approx(value * scale)


@pytest.mark.parametrize("bad", ["", "abc", "-1s", "5 weeks", "1.2.3s", "s"])
def test_parse_duration_rejects_garbage(bad: str) -> None:
    with pytest.raises(SweeperConfigError):
        parse_duration(bad)


def test_default_is_rocketmq_delay_levels() -> None:
    policy = parse_backoff(C.DEFAULT_BACKOFF)
    assert isinstance(policy, FixedBackoff)
    assert len(policy.delays_s) == 18
    assert (policy.delays_s[0], policy.delays_s[4], policy.delays_s[-1]) == (1, 60, 7200)


@pytest.mark.parametrize(
    "spec",
    ["fixed:", "fixed:0s", "exp:base=0s", "exp:factor=0.5", "exp:jitter=1", "exp:nope=1", "exp:base", "x:1"],
)
def test_bad_backoff_specs(spec: str) -> None:
    with pytest.raises(SweeperConfigError):
        parse_backoff(spec)


def test_migration_0002_is_additive_and_reversible(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        assert "stub_notification" in inspect(engine).get_table_names()
        downgrade(engine, "0001")
        names = set(inspect(engine).get_table_names())
        assert (
            "stub_notification" not in names and {"message_stub", "message_log", "consume_progress"} <= names
        )
        upgrade(engine, "0002")
        cols = {c["name"] for c in inspect(engine).get_columns("stub_notification")}
        assert cols == {
            "message_id",
            "channel",
            "reason",
            "created_at",
            "notified_at",
            "attempts",
            "last_error",
        }
        upgrade(engine)  # 0003 adds the group: one notice per (message, group, channel); 0010 the claim
        cols_now = {c["name"] for c in inspect(engine).get_columns("stub_notification")}
        assert cols_now == cols | {"consumer_group", "claimed_until"}
    finally:
        engine.dispose()


def test_create_schema_matches_models(db_url: str) -> None:
    """No difference between the models (create_schema's intent) and the database at alembic head."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from reliable.models import metadata

    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), metadata)
        mine = [d for d in diff if "stub_notification" in repr(d)]
        assert mine == []
    finally:
        engine.dispose()
