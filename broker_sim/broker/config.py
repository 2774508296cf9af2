"""Broker settings (RocketMQ's ``BrokerConfig`` subset that matters here) and the split of
``Broker(**config)``
keyword arguments between the broker and the storage engine (:class:`broker_sim.store.config.StoreConfig`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from broker_sim.clock import Clock, SystemClock
from broker_sim.common.errors import BrokerConfigError
from broker_sim.store.config import BrokerRole, FlushDiskType, StoreConfig


@dataclass
class BrokerConfig:
    broker_name: str = "broker-a"
    #: 0 = the group's master; > 0 = a slave (then the store's broker_role must be SLAVE)
    broker_id: int = 0
    cluster_name: str = "DefaultCluster"
    #: the address clients reach the broker at; also the store host written into every record (G7)
    broker_addr: str = "127.0.0.1:10911"
    default_topic_queue_nums: int = 8
    auto_create_topic_enable: bool = False
    auto_create_subscription_group: bool = True
    #: topics created when the broker starts: name -> queue count (convenience for tests and demos)
    topics: dict[str, int] = field(default_factory=dict)
    flush_consumer_offset_interval_ms: int = 5000
    flush_delay_offset_interval_ms: int = 10_000
    long_polling_enable: bool = True
    short_polling_time_ms: int = 1000
    channel_expired_ms: int = 120_000
    scan_not_active_channel_interval_ms: int = 10_000
    rebalance_lock_max_live_ms: int = 60_000
    max_reconsume_times: int = 16
    transaction_check_interval_ms: int = 60_000
    transaction_timeout_ms: int = 6000
    transaction_check_max: int = 15
    #: Java parity (G13): a new group's QUERY_CONSUMER_OFFSET answers 0 while the queue's min offset is 0, so
    #: CONSUME_FROM_LAST_OFFSET still reads a young topic from the start. False: answer QUERY_NOT_FOUND, so
    #: the client applies its CONSUME_FROM_* policy.
    query_offset_zero_for_new_group: bool = True
    #: SQL92 subscriptions (``BrokerConfig.enablePropertyFilter``); off by default as in RocketMQ 4.9.8, in
    #: which case they are refused loudly (CHECK_CLIENT_CONFIG and pulls answer SYSTEM_ERROR).
    enable_property_filter: bool = False
    #: ``slaveReadEnable``: pull replies name the node to read from next — a slave
    #: (``whichBrokerWhenConsumeSlowly``) when the reader is further behind than the store's memory share,
    #: else the group's ``brokerId`` (the master). Off (Java's default): every reply names the master.
    slave_read_enable: bool = False
    fault_seed: int = 0
    clock: Clock = field(default_factory=SystemClock)

    def __post_init__(self) -> None:
        _, sep, port = self.broker_addr.rpartition(":")
        if not sep or not port.isdigit():
            raise BrokerConfigError(f"broker_addr must be 'ip:port', got {self.broker_addr!r}")
        if self.default_topic_queue_nums < 1 or self.max_reconsume_times < 0:
            raise BrokerConfigError("default_topic_queue_nums must be >= 1 and max_reconsume_times >= 0")

    @property
    def store_host(self) -> tuple[str, int]:
        host, _, port = self.broker_addr.rpartition(":")
        return host, int(port)


_BROKER_FIELDS = {f.name for f in dataclasses.fields(BrokerConfig)}
_STORE_FIELDS = {f.name for f in dataclasses.fields(StoreConfig) if f.init}


_KINDS: dict[str, tuple[tuple[type, ...], str]] = {
    "int": ((int,), "an integer"),
    "float": ((int, float), "a number"),
    "bool": ((bool,), "true or false"),
    "str": ((str,), "a string"),
}


def _expected(cls: type, name: str) -> tuple[tuple[type, ...], str] | None:
    """The simple type (int, float, bool, str; optionally "| None") a field's annotation names, else None."""
    annotation = {f.name: f.type for f in dataclasses.fields(cls)}.get(name)
    if not isinstance(annotation, str):
        return None
    parts = [part.strip() for part in annotation.split("|")]
    kinds = [_KINDS[part] for part in parts if part in _KINDS]
    if len(kinds) != 1 or len(parts) - ("None" in parts) != 1:
        return None
    types, what = kinds[0]
    return (*types, type(None)) if "None" in parts else types, what


def check_types(cls: type, values: dict[str, Any]) -> None:
    """Refuse a value of the wrong type by name (``max_reconsume_times expects an integer, got 'abc'``)
    before the dataclass compares it with anything."""
    for name, value in values.items():
        expected = _expected(cls, name)
        if expected is None:
            continue
        types, what = expected
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise BrokerConfigError(f"{name} expects {what}, got {value!r}")


def split_config(config: dict[str, Any]) -> tuple[BrokerConfig, StoreConfig]:
    """Route each keyword to BrokerConfig or StoreConfig; an unknown name is a BrokerConfigError."""
    broker_kw = {k: v for k, v in config.items() if k in _BROKER_FIELDS}
    store_kw = {k: v for k, v in config.items() if k in _STORE_FIELDS and k not in _BROKER_FIELDS}
    unknown = set(config) - set(broker_kw) - set(store_kw)
    if unknown:
        raise BrokerConfigError(f"unknown broker/store option(s): {', '.join(sorted(unknown))}")
    if isinstance(store_kw.get("flush_disk_type"), str):
        try:
            store_kw["flush_disk_type"] = FlushDiskType(store_kw["flush_disk_type"])
        except ValueError:
            raise BrokerConfigError(
                f"flush_disk_type must be ASYNC_FLUSH or SYNC_FLUSH, got {store_kw['flush_disk_type']!r}"
            ) from None
    if isinstance(store_kw.get("broker_role"), str):
        try:
            store_kw["broker_role"] = BrokerRole(store_kw["broker_role"])
        except ValueError:
            raise BrokerConfigError(
                f"broker_role must be ASYNC_MASTER, SYNC_MASTER or SLAVE, got {store_kw['broker_role']!r}"
            ) from None
    check_types(BrokerConfig, broker_kw)
    check_types(StoreConfig, store_kw)
    slave = store_kw.get("broker_role") is BrokerRole.SLAVE
    if slave != (broker_kw.get("broker_id", 0) > 0):
        raise BrokerConfigError("broker_id must be 0 for a master and > 0 for a SLAVE (broker_role)")
    try:
        bc = BrokerConfig(**broker_kw)
        store_kw.setdefault("store_host", bc.store_host)
        sc = StoreConfig(**store_kw)
    except (TypeError, ValueError) as exc:
        raise BrokerConfigError(str(exc)) from exc
    return bc, sc
