"""Settings precedence (argument > RELIABLE_* environment > default) and rejection of bad values."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reliable import Reliability
from reliable import constants as C
from reliable.errors import ConfigurationError, ReliableError
from reliable.settings import Settings


def test_defaults_come_from_constants() -> None:
    s = Settings.load(environ={})
    assert s.lease_ms == C.DEFAULT_LEASE_MS
    assert s.max_attempts == C.DEFAULT_MAX_ATTEMPTS
    assert s.first_resend_delay_s == C.DEFAULT_FIRST_RESEND_DELAY_S
    assert s.key_prefix == C.DEFAULT_KEY_PREFIX
    assert s.check_payload is True


def test_environment_overrides_default_and_argument_overrides_environment() -> None:
    env = {"RELIABLE_LEASE_MS": "1500", "RELIABLE_MAX_ATTEMPTS": "3", "RELIABLE_CHECK_PAYLOAD": "no"}
    s = Settings.load({"max_attempts": 7}, environ=env)
    assert s.lease_ms == 1500  # from the environment, parsed as int
    assert s.max_attempts == 7  # the argument wins
    assert s.check_payload is False
    assert Settings.load({"max_attempts": None}, environ=env).max_attempts == 3  # None means "not given"


def test_empty_environment_value_means_unset() -> None:
    assert Settings.load(environ={"RELIABLE_LEASE_MS": ""}).lease_ms == C.DEFAULT_LEASE_MS


@pytest.mark.parametrize(
    ("overrides", "env", "message"),
    [
        ({}, {"RELIABLE_LEASE_MS": "abc"}, "lease_ms: cannot read 'abc' as int"),
        ({}, {"RELIABLE_CHECK_PAYLOAD": "maybe"}, "check_payload: cannot read 'maybe' as bool"),
        ({}, {"RELIABLE_FIRST_RESEND_DELAY_S": "soon"}, "first_resend_delay_s"),
        ({"lease_ms": 0}, {}, "lease_ms must be > 0"),
        ({"max_attempts": -1}, {}, "max_attempts must be > 0"),
        ({"stuck_after_s": -0.5}, {}, "stuck_after_s must be >= 0"),
        ({"key_prefix": "a:b"}, {}, "key_prefix"),
        ({"key_prefix": ""}, {}, "key_prefix"),
        ({"lease_ms": True}, {}, "lease_ms"),
        ({"no_such_setting": 1}, {}, "unknown setting(s): no_such_setting"),
        ({}, {"RELIABLE_TOPIC_GROUPS": "orders"}, "write 'orders=billing,audit;payments=ledger'"),
        ({}, {"RELIABLE_TOPIC_GROUPS": "orders="}, "topic 'orders' needs distinct groups"),
        ({}, {"RELIABLE_TOPIC_GROUPS": "orders=a,a"}, "topic 'orders' needs distinct groups"),
        ({}, {"RELIABLE_TOPIC_GROUPS": "orders=bad group"}, "consumer group 'bad group'"),
        ({"default_group": "a:b"}, {}, "consumer group 'a:b'"),
        ({}, {"RELIABLE_TOPIC_GROUPS": "or:ders=billing"}, "topic 'or:ders': 1..127 characters"),
        ({}, {"RELIABLE_TOPIC_GROUPS": f"{'t' * 128}=billing"}, "1..127 characters"),
        # the last entry would win: losses for billing and audit would go undetected
        (
            {},
            {"RELIABLE_TOPIC_GROUPS": "orders=billing,audit;orders=search"},
            "topic 'orders' is named twice",
        ),
        # each used to pass and fail later, untyped, inside the producer's transaction or the sweeper
        ({"first_resend_delay_s": float("inf")}, {}, "first_resend_delay_s must be a finite number"),
        ({}, {"RELIABLE_STUCK_AFTER_S": "nan"}, "stuck_after_s must be a finite number"),
        ({}, {"RELIABLE_DONE_TTL_S": "inf"}, "done_ttl_s: 'inf' is not a whole number of seconds"),
        ({}, {"RELIABLE_LOG_RETENTION_S": "30 days"}, "log_retention_s: not a duration: '30 days' (use e.g."),
        ({}, {"RELIABLE_DONE_TTL_S": "1500ms"}, "done_ttl_s: '1500ms' is not a whole number of seconds"),
        ({"purge_duty_cycle": float("nan")}, {}, "purge_duty_cycle must be a finite number"),
        # 0 is no timeout at all to redis-py: a hung Redis hung the guard instead of being skipped
        ({"redis_socket_timeout_s": 0}, {}, "redis_socket_timeout_s must be > 0"),
    ],
)
def test_bad_values_are_configuration_errors(
    overrides: dict[str, object], env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        Settings.load(overrides, environ=env)
    assert message in str(info.value)
    assert isinstance(info.value, ReliableError)


def test_duration_settings_read_what_the_command_line_reads() -> None:
    """``reliable sweep --log-retention 30d`` works, so ``RELIABLE_LOG_RETENTION_S=30d`` must too."""
    s = Settings.load(
        environ={
            "RELIABLE_LOG_RETENTION_S": "30d",
            "RELIABLE_STUCK_AFTER_S": "15m",
            "RELIABLE_REDIS_SOCKET_TIMEOUT_S": "250ms",
            "RELIABLE_DONE_TTL_S": "2h",
            "RELIABLE_FIRST_RESEND_DELAY_S": "45",
        }
    )
    assert (s.log_retention_s, s.stuck_after_s, s.redis_socket_timeout_s) == (30 * 86400.0, 900.0, 0.25)
    assert s.done_ttl_s == 7200 and isinstance(s.done_ttl_s, int)
    assert s.first_resend_delay_s == 45.0
    assert Settings.load({"stall_after_s": "1h"}, environ={}).stall_after_s == 3600.0
    # what float() read before durations came stays read
    numbers = {
        "RELIABLE_REDIS_SOCKET_TIMEOUT_S": ".5",
        "RELIABLE_STUCK_AFTER_S": "1e3",
        "RELIABLE_DONE_TTL_S": "+5",
    }
    s = Settings.load(environ=numbers)
    assert (s.redis_socket_timeout_s, s.stuck_after_s, s.done_ttl_s) == (0.5, 1000.0, 5)


def test_replace_validates() -> None:
    s = Settings.load(environ={})
    assert s.replace(lease_ms=10).lease_ms == 10
    with pytest.raises(ConfigurationError):
        s.replace(sweep_batch=0)


@given(st.integers(min_value=1, max_value=10**9))
def test_any_positive_int_round_trips_through_the_environment(n: int) -> None:
    assert Settings.load(environ={"RELIABLE_LEASE_MS": str(n)}).lease_ms == n


@given(st.text(alphabet="abc-_.XYZ019", min_size=1, max_size=12))
def test_bool_parsing_accepts_only_the_documented_words(word: str) -> None:
    truthy, falsy = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}
    try:
        value = Settings.load(environ={"RELIABLE_CHECK_PAYLOAD": word}).check_payload
    except ConfigurationError:
        assert word.strip().lower() not in truthy | falsy
    else:
        assert value is (word.strip().lower() in truthy)


def test_facade_reads_settings_and_urls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RELIABLE_DB_URL", f"sqlite:///{tmp_path / 'env.db'}")
    monkeypatch.setenv("RELIABLE_MAX_SENDS", "4")
    monkeypatch.delenv("RELIABLE_REDIS_URL", raising=False)
    with Reliability(max_sends=5, lease_ms=250) as rel:
        assert rel.dialect == "sqlite"
        assert rel.settings.max_sends == 5
        assert rel.settings.lease_ms == 250
        assert rel.redis is None  # no Redis configured: database-only guard
    with Reliability() as rel:
        assert rel.settings.max_sends == 4


def test_facade_without_database_url_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RELIABLE_DB_URL", raising=False)
    with pytest.raises(ConfigurationError, match="RELIABLE_DB_URL"):
        Reliability()
    with pytest.raises(ConfigurationError, match="unknown setting"):
        Reliability("sqlite://", leese_ms=5)
    for url in ("nonsense", "nosuchdb://x/y"):  # SQLAlchemy's ArgumentError / NoSuchModuleError before
        with pytest.raises(ConfigurationError, match="bad database URL"):
            Reliability(url)
    # redis-py's bare ValueError before ("Port could not be cast to integer value as 'abc'")
    for redis_url in ("redis://h:abc/0", "redis+sentinel://[::1/svc", "redis://h:6379/x"):
        with pytest.raises(ConfigurationError, match="bad redis URL"):
            Reliability("sqlite://", redis_url)


def test_topic_groups_from_the_environment_or_an_argument() -> None:
    env = {
        "RELIABLE_TOPIC_GROUPS": " orders = billing, audit ; payments=ledger;",
        "RELIABLE_DEFAULT_GROUP": "g",
    }
    s = Settings.load(environ=env)
    assert s.topic_groups == {"orders": ("billing", "audit"), "payments": ("ledger",)}
    assert (s.groups_for("orders"), s.groups_for("payments"), s.groups_for("other")) == (
        ("billing", "audit"),
        ("ledger",),
        ("g",),
    )
    # an argument wins, as a mapping or in the environment's syntax
    assert Settings.load({"topic_groups": {"t": ["x"]}}, environ=env).topic_groups == {"t": ("x",)}
    assert Settings.load({"topic_groups": "t=y,z"}, environ=env).groups_for("t") == ("y", "z")
    assert Settings.load(environ={}).groups_for("orders") == ()  # nothing configured: the caller must say


def test_group_and_topic_names_follow_the_producer_and_guard_rule() -> None:
    """One vocabulary: RocketMQ's ``%RETRY%billing`` and ``a|b`` and Kafka's dotted names, which the producer
    stages under and the guard consumes as (reliable/names.py, decorator.md), are valid settings too."""
    s = Settings.load(
        {"default_group": "%RETRY%billing", "topic_groups": {"billing.orders": ["a|b", "%DLQ%audit", "x.y"]}},
        environ={},
    )
    assert s.default_group == "%RETRY%billing"
    assert s.groups_for("billing.orders") == ("a|b", "%DLQ%audit", "x.y")
    env = Settings.load(environ={"RELIABLE_TOPIC_GROUPS": "%SYS%t=%RETRY%billing,a|b"})
    assert env.groups_for("%SYS%t") == ("%RETRY%billing", "a|b")


@given(
    st.dictionaries(
        st.from_regex(r"[a-z][a-z0-9_-]{0,8}", fullmatch=True),
        st.lists(st.from_regex(r"[a-z][a-z0-9_-]{0,8}", fullmatch=True), min_size=1, max_size=3, unique=True),
        max_size=4,
    )
)
def test_topic_groups_round_trip_through_the_environment_syntax(mapping: dict[str, list[str]]) -> None:
    text = ";".join(f"{t}={','.join(gs)}" for t, gs in mapping.items())
    loaded = Settings.load(environ={"RELIABLE_TOPIC_GROUPS": text}).topic_groups
    assert loaded == {t: tuple(gs) for t, gs in mapping.items()}
