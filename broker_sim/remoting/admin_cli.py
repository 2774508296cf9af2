"""``broker-sim admin``: mqadmin-style commands against a running ``broker-sim serve``, over the wire with
:class:`~broker_sim.remoting.admin_client.AdminClient`. Each command prints a table (or ``--json``); errors
are raised as one-line exceptions the CLI prints."""

from __future__ import annotations

import argparse
import datetime as dt
import json
from collections.abc import Callable
from typing import Any

from broker_sim.common.errors import BrokerResponseError
from broker_sim.common.message import MessageExt
from broker_sim.common.requests import ResponseCode
from broker_sim.remoting.admin_client import AdminClient

DLQ_PREFIX = "%DLQ%"


def _message_row(m: MessageExt) -> dict[str, Any]:
    return {
        "offsetMsgId": m.offset_msg_id,
        "msgId": m.msg_id,
        "topic": m.topic,
        "queueId": m.queue_id,
        "queueOffset": m.queue_offset,
        "keys": m.properties.get("KEYS", ""),
        "tags": m.properties.get("TAGS", ""),
        "reconsumeTimes": m.reconsume_times,
        "retryTopic": m.properties.get("RETRY_TOPIC", ""),
        "storeTimestamp": m.store_timestamp,
        "body": m.body[:200].decode("utf-8", "replace"),
    }


def _print(
    args: argparse.Namespace, rows: list[dict[str, Any]] | dict[str, Any], columns: list[str] | None = None
) -> None:
    if args.json or isinstance(rows, dict):
        print(json.dumps(rows, indent=2 if isinstance(rows, dict) else None))
        return
    cols = columns or (list(rows[0]) if rows else [])
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) if rows else len(c) for c in cols}
    print("  ".join(c.ljust(widths[c]) for c in cols))
    for r in rows:
        print("  ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols))


def parse_time(text: str) -> int:
    """``--time``: milliseconds since the epoch, ``now``, ``latest`` (-1: the max offset), an ISO time
    (UTC unless it names a zone) or mqadmin's ``yyyy-MM-dd#HH:mm:ss:SSS``."""
    value = text.strip()
    if value.lstrip("-").isdigit():
        return int(value)
    if value == "now":
        return int(dt.datetime.now(dt.UTC).timestamp() * 1000)
    if value == "latest":
        return -1
    try:
        if "#" in value:
            when = dt.datetime.strptime(value, "%Y-%m-%d#%H:%M:%S:%f")
        else:
            when = dt.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(
            f"--time expects milliseconds since the epoch, 'now', 'latest' or a time such as "
            f"2026-01-31T12:00:00, got {text!r}"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1000)


def _cluster_list(admin: AdminClient, args: argparse.Namespace) -> None:
    info = admin.cluster_info()
    brokers = info.get("brokerAddrTable", {})
    rows = []
    for cluster, names in sorted(info.get("clusterAddrTable", {}).items()):
        for name in sorted(names):
            for broker_id, addr in sorted(brokers.get(name, {}).get("brokerAddrs", {}).items()):
                rt = admin.runtime_info(addr)
                rows.append(
                    {
                        "cluster": cluster,
                        "broker": name,
                        "id": broker_id,
                        "addr": addr,
                        "version": rt.get("brokerVersionDesc", ""),
                        "commitLogMaxOffset": rt.get("commitLogMaxOffset", ""),
                        "runtime": rt.get("runtime", ""),
                    }
                )
    _print(args, rows, ["cluster", "broker", "id", "addr", "version", "commitLogMaxOffset", "runtime"])


def _topic(admin: AdminClient, args: argparse.Namespace) -> None:
    if args.action == "create":
        if not 1 <= args.queues <= 1024:
            raise ValueError("--queues must be between 1 and 1024")
        admin.create_topic(args.name, args.queues, args.perm)
        print(f"created {args.name} with {args.queues} queues (perm {args.perm})")
    elif args.action == "list":
        _print(args, [{"topic": t} for t in admin.topic_list()], ["topic"])
    elif args.action == "route":
        _print(args, admin.route(args.name))
    elif args.action == "status":
        rows = [
            {"broker": r["brokerName"], "queue": r["queueId"], "minOffset": r["minOffset"],
             "maxOffset": r["maxOffset"], "lastUpdated": _when(int(r.get("lastUpdateTimestamp", 0)))}
            for r in admin.topic_stats(args.name)
        ]  # fmt: skip
        _print(args, rows, ["broker", "queue", "minOffset", "maxOffset", "lastUpdated"])
    else:
        admin.delete_topic(args.name)
        print(f"deleted {args.name} (broker config, consumer offsets, name server route)")


def _when(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds") if ms > 0 else ""


def _consumer(admin: AdminClient, args: argparse.Namespace) -> None:
    if args.action == "progress":
        progress = admin.consumer_progress(args.group, args.topic)
        rows: list[dict[str, Any]] = [
            {"topic": p.queue.topic, "broker": p.queue.broker_name, "queue": p.queue.queue_id,
             "brokerOffset": p.broker_offset, "consumerOffset": p.consumer_offset, "lag": p.lag,
             "lastConsumed": _when(p.last_timestamp)}
            for p in progress
        ]  # fmt: skip
        cols = ["topic", "broker", "queue", "brokerOffset", "consumerOffset", "lag", "lastConsumed"]
        _print(args, rows, cols)
        if not args.json:
            print(f"total lag: {sum(p.lag for p in progress)}")
    elif args.action == "connection":
        _print(args, admin.consumer_connection(args.group))
    elif args.action == "reset-offset":
        _reset_offset(admin, args)
    elif args.action == "running-info":
        _print(args, admin.running_info(args.group, args.client))
    else:
        _print(args, admin.consume_directly(args.group, args.client, args.id))


def _reset_offset(admin: AdminClient, args: argparse.Namespace) -> None:
    when = parse_time(args.time)
    try:
        rows = admin.reset_offset(args.topic, args.group, when, not args.no_force)
        how = "live consumers reset"
    except BrokerResponseError as exc:
        if exc.code != ResponseCode.CONSUMER_NOT_ONLINE:
            raise
        rows = admin.reset_offline_offset(args.topic, args.group, when)
        how = "group offline: offsets committed on the broker"
    _print(args, [{"broker": r["brokerName"], "queue": r["queueId"], "offset": r["offset"]} for r in rows])
    if not args.json:
        print(f"{args.group} on {args.topic}: {how}")


def _group(admin: AdminClient, args: argparse.Namespace) -> None:
    if args.action == "list":
        rows = list(admin.subscription_groups().values())
        _print(args, rows, ["groupName", "consumeEnable", "consumeBroadcastEnable", "retryQueueNums",
                            "retryMaxTimes"])  # fmt: skip
        return
    if args.retry_max_times is not None and args.retry_max_times < 0:
        raise ValueError("--retry-max-times must be >= 0")
    if args.retry_queues is not None and not 0 <= args.retry_queues <= 64:
        raise ValueError("--retry-queues must be between 0 and 64")
    config = admin.subscription_groups().get(args.group, {"groupName": args.group})
    if args.retry_max_times is not None:
        config["retryMaxTimes"] = args.retry_max_times
    if args.retry_queues is not None:
        config["retryQueueNums"] = args.retry_queues
    if args.consume_enable is not None:
        config["consumeEnable"] = args.consume_enable
    if args.broadcast_enable is not None:
        config["consumeBroadcastEnable"] = args.broadcast_enable
    admin.update_subscription_group(config)
    _print(args, admin.subscription_groups()[args.group])


def _message(admin: AdminClient, args: argparse.Namespace) -> None:
    if args.action == "query":
        _print(args, [_message_row(m) for m in admin.query_by_key(args.topic, args.key, args.max)])
    else:
        _print(args, _message_row(admin.view(args.id)))


def _dlq(admin: AdminClient, args: argparse.Namespace) -> None:
    groups = [t[len(DLQ_PREFIX) :] for t in admin.topic_list() if t.startswith(DLQ_PREFIX)]
    if args.group:
        groups = [g for g in groups if g == args.group]
    rows = []
    for g in sorted(groups):
        rows += [dict(_message_row(m), group=g) for m in admin.read_queue(DLQ_PREFIX + g, 0, args.max)]
    _print(args, rows, ["group", "msgId", "offsetMsgId", "retryTopic", "reconsumeTimes", "keys", "body"])


AREAS: dict[str, Callable[[AdminClient, argparse.Namespace], None]] = {
    "cluster": _cluster_list,
    "topic": _topic,
    "consumer": _consumer,
    "group": _group,
    "message": _message,
    "dlq": _dlq,
}


def run_admin(args: argparse.Namespace) -> int:
    admin = AdminClient(args.namesrv)
    try:
        AREAS[args.area](admin, args)
        return 0
    finally:
        admin.close()
