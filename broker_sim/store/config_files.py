"""The broker's JSON tables in ``config/``, in RocketMQ's shapes, written so a crash never leaves a broken
file: write ``name.tmp``, fsync it, copy the current file to ``name.bak`` (also via temp + fsync + rename),
rename the temp over the file, fsync the directory. Loading falls back to ``.bak`` when the file is missing
or unreadable.

Shapes (what RocketMQ 4.x writes)::

    topics.json             {"topicConfigTable": {name: {"topicName", "readQueueNums", "writeQueueNums",
                              "perm", "topicFilterType", "topicSysFlag", "order"}}, "dataVersion": {...}}
    subscriptionGroup.json  {"subscriptionGroupTable": {group: {"groupName", "consumeEnable", ...,
                              "retryQueueNums", "retryMaxTimes", ...}}, "dataVersion": {...}}
    consumerOffset.json     {"offsetTable": {"topic@group": {"0": 12, "1": 7}}}
    delayOffset.json        {"offsetTable": {"1": 0, "3": 42}}        (delay level → schedule-queue offset)

RocketMQ's fastjson writes integer map keys unquoted (``{0:12}``), which is not JSON; we write quoted keys
(fastjson reads both) and accept unquoted ones when loading.
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path
from typing import Any

from broker_sim.store.errors import ConfigFileError
from broker_sim.store.mapped_file import fsync_dir

TOPICS = "topics.json"
SUBSCRIPTION_GROUPS = "subscriptionGroup.json"
CONSUMER_OFFSETS = "consumerOffset.json"
DELAY_OFFSETS = "delayOffset.json"
_UNQUOTED_INT_KEY = re.compile(r"([{,]\s*)(-?\d+)(\s*:)")


def _write_durably(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


#: one writer at a time: two threads saving one file would share its ``.tmp`` name
_SAVE_LOCK = threading.Lock()


def save_json(path: Path, obj: Any) -> None:
    """Atomically replace ``path`` with ``obj`` as JSON, keeping the previous version in ``path.bak``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(obj, indent=2, sort_keys=False).encode("utf-8")
    with _SAVE_LOCK:
        if path.exists():
            _write_durably(path.with_name(path.name + ".bak"), path.read_bytes())
        _write_durably(path, data)
        fsync_dir(path.parent)


def _parse(raw: bytes) -> Any:
    text = raw.decode("utf-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return json.loads(_UNQUOTED_INT_KEY.sub(r'\1"\2"\3', text))


def load_json(path: Path) -> Any | None:
    """The content of ``path``, else of ``path.bak``; None when neither exists. Raises ConfigFileError
    when what exists cannot be parsed."""
    errors: list[str] = []
    for candidate in (path, path.with_name(path.name + ".bak")):
        try:
            raw = candidate.read_bytes()
        except FileNotFoundError:
            continue
        if not raw.strip():
            errors.append(f"{candidate.name}: empty")
            continue
        try:
            return _parse(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            errors.append(f"{candidate.name}: {exc}")
    if errors:
        raise ConfigFileError(f"cannot read {path}: " + "; ".join(errors))
    return None


def _table(config_dir: Path, name: str, key: str) -> dict[str, Any]:
    obj = load_json(config_dir / name)
    if obj is None:
        return {}
    if not isinstance(obj, dict) or not isinstance(obj.get(key, {}), dict):
        raise ConfigFileError(f"{config_dir / name} has no {key!r} object")
    table: dict[str, Any] = obj.get(key, {})
    return table


def data_version(now_ms: int, counter: int) -> dict[str, int]:
    return {"timestamp": now_ms, "counter": counter}


# --------------------------------------------------------------------------------------- typed helpers
def load_topics(config_dir: Path) -> dict[str, dict[str, Any]]:
    """topic name → TopicConfig dict (``topicName``, ``readQueueNums``, ``writeQueueNums``, ``perm``, …)."""
    return _table(config_dir, TOPICS, "topicConfigTable")


def save_topics(
    config_dir: Path, table: dict[str, dict[str, Any]], version: dict[str, int] | None = None
) -> None:
    save_json(config_dir / TOPICS, {"topicConfigTable": table, "dataVersion": version or data_version(0, 0)})


def topic_config(
    name: str, queues: int = 8, perm: int = 6, order: bool = False, sys_flag: int = 0
) -> dict[str, Any]:
    """A TopicConfig in RocketMQ's JSON shape."""
    return {"topicName": name, "readQueueNums": queues, "writeQueueNums": queues, "perm": perm,
            "topicFilterType": "SINGLE_TAG", "topicSysFlag": sys_flag, "order": order}  # fmt: skip


def load_subscription_groups(config_dir: Path) -> dict[str, dict[str, Any]]:
    return _table(config_dir, SUBSCRIPTION_GROUPS, "subscriptionGroupTable")


def save_subscription_groups(
    config_dir: Path, table: dict[str, dict[str, Any]], version: dict[str, int] | None = None
) -> None:
    obj = {"subscriptionGroupTable": table, "dataVersion": version or data_version(0, 0)}
    save_json(config_dir / SUBSCRIPTION_GROUPS, obj)


def subscription_group_config(
    group: str, retry_queue_nums: int = 1, retry_max_times: int = 16
) -> dict[str, Any]:
    """A SubscriptionGroupConfig in RocketMQ's JSON shape (defaults as RocketMQ's)."""
    return {
        "groupName": group,
        "consumeEnable": True,
        "consumeFromMinEnable": True,
        "consumeBroadcastEnable": True,
        "retryQueueNums": retry_queue_nums,
        "retryMaxTimes": retry_max_times,
        "brokerId": 0,
        "whichBrokerWhenConsumeSlowly": 1,
        "notifyConsumerIdsChangedEnable": True,
    }


def load_consumer_offsets(config_dir: Path) -> dict[str, dict[int, int]]:
    """``"topic@group"`` → {queueId: next offset to consume}."""
    table = _table(config_dir, CONSUMER_OFFSETS, "offsetTable")
    try:
        return {k: {int(q): int(o) for q, o in v.items()} for k, v in table.items()}
    except (AttributeError, TypeError, ValueError) as exc:
        raise ConfigFileError(f"{config_dir / CONSUMER_OFFSETS}: malformed offsetTable ({exc})") from exc


def save_consumer_offsets(config_dir: Path, table: dict[str, dict[int, int]]) -> None:
    obj = {"offsetTable": {k: {str(q): o for q, o in sorted(v.items())} for k, v in table.items()}}
    save_json(config_dir / CONSUMER_OFFSETS, obj)


def load_delay_offsets(config_dir: Path) -> dict[int, int]:
    """delay level (1..18) → offset reached in its ``SCHEDULE_TOPIC_XXXX`` queue (level − 1)."""
    table = _table(config_dir, DELAY_OFFSETS, "offsetTable")
    try:
        return {int(level): int(off) for level, off in table.items()}
    except (TypeError, ValueError) as exc:
        raise ConfigFileError(f"{config_dir / DELAY_OFFSETS}: malformed offsetTable ({exc})") from exc


def save_delay_offsets(config_dir: Path, table: dict[int, int]) -> None:
    save_json(config_dir / DELAY_OFFSETS, {"offsetTable": {str(k): v for k, v in sorted(table.items())}})
