"""``broker-sim``: run the simulator as a network server, and administer it like ``mqadmin``.

    broker-sim serve --store DIR [--namesrv-port 9876] [--broker-port 10911] [--flush SYNC_FLUSH] ...
    broker-sim namesrv [--port 9876]
    broker-sim broker --store DIR --namesrv HOST:PORT [--namesrv HOST:PORT] --name broker-b [--port 10921]
    broker-sim admin [--namesrv HOST:PORT] topic create|list|route ...
    broker-sim admin cluster list
    broker-sim admin topic status|delete NAME
    broker-sim admin consumer progress|connection GROUP
    broker-sim admin consumer reset-offset GROUP --topic T --time 2026-01-31T12:00:00
    broker-sim admin group update GROUP --retry-max-times 3
    broker-sim admin message query --topic T --key K | message view --id ID
    broker-sim admin dlq list [--group G]

Errors are one line on stderr: exit status 1 for a failure, 2 for bad arguments (the line names the option,
what it expects, and where ``--help`` is); no tracebacks, because these commands are used from shell scripts
and CI logs. What each command accepts is :mod:`broker_sim.cli_parser`; this module runs them.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from broker_sim.cli_parser import build_parser
from broker_sim.errors import BrokerSimError


def _config_value(raw: str) -> Any:
    """``--set key=value`` values: JSON when it parses (numbers, booleans), else the string."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _broker_config(args: argparse.Namespace) -> dict[str, Any]:
    """The Broker options of ``--set``, ``--flush`` and ``--auto-create-topics``, checked before any port
    is bound."""
    from broker_sim.broker.config import split_config

    config: dict[str, Any] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        config[key.replace("-", "_")] = _config_value(value)
    if args.flush:
        config["flush_disk_type"] = args.flush
    if args.auto_create_topics:
        config["auto_create_topic_enable"] = True
    try:
        split_config(dict(config))
    except BrokerSimError as exc:
        raise ValueError(f"--set: {exc}") from exc
    return config


def _serve_cluster(args: argparse.Namespace) -> int:
    """``serve --brokers N --slaves M``: the name server and every broker as child processes."""
    from broker_sim.remoting.cluster_process import serve_cluster

    extra = [f"--set={item}" for item in args.set]
    if args.auto_create_topics:
        extra.append("--auto-create-topics")
    serve_cluster(
        args.store,
        brokers=args.brokers,
        slaves=args.slaves,
        replication=args.replication,
        flush=args.flush or "ASYNC_FLUSH",
        extra=tuple(extra),
        log_level=args.log_level,
    )
    return 0


def _serve(args: argparse.Namespace) -> int:
    """``serve`` (name server + broker), ``namesrv`` (name server only) and ``broker`` (broker only)."""
    from broker_sim.remoting.acl import parse_accounts
    from broker_sim.remoting.serve import BrokerSimServer, ServeConfig

    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    if args.command == "serve":
        if args.brokers < 1 or args.slaves < 0:
            raise ValueError("--brokers must be at least 1 and --slaves at least 0")
        if args.brokers > 1 or args.slaves > 0:
            if args.grpc_port is not None:
                raise ValueError("--grpc-port serves one broker: not with --brokers/--slaves")
            return _serve_cluster(args)
    grpc_port: int | None = getattr(args, "grpc_port", None)
    from broker_sim.grpc.policy import GroupPolicy

    grpc_groups: dict[str, GroupPolicy] = {}
    for name, policy in map(GroupPolicy.parse, getattr(args, "grpc_group", None) or []):
        if name in grpc_groups:  # the last one won, silently
            raise ValueError(
                f"--grpc-group {name!r} given twice: give its options once (NAME:fifo,max_attempts=3)"
            )
        grpc_groups[name] = policy
    if grpc_groups and grpc_port is None:  # ignored, silently
        raise ValueError("--grpc-group sets a 5.x consumer group's policy: it needs --grpc-port")
    if grpc_port is not None:
        from broker_sim.grpc.protocol import load_protocol

        load_protocol()  # a missing protocol module is a one-line error before any port is bound
    broker_opts: dict[str, Any] = {}
    if args.command == "broker":
        slave = args.role == "SLAVE"
        broker_id = args.id if args.id is not None else int(slave)
        if slave != (broker_id > 0):
            raise ValueError(f"--id {broker_id}: a master has id 0, a slave an id above 0")
        broker_opts = {"broker_role": args.role, "broker_id": broker_id}
        if slave:
            broker_opts["ha_master_address"] = args.master_ha or ""
        else:
            broker_opts["ha_listen_port"] = args.ha_port
    if args.command == "namesrv":
        config = ServeConfig(
            store_dir=Path("."),
            host=args.host,
            namesrv_port=args.port,
            run_broker=False,
            exit_with_parent=args.exit_with_parent,
        )
    else:
        is_broker = args.command == "broker"
        config = ServeConfig(
            store_dir=args.store,
            host=args.host,
            namesrv_port=0 if is_broker else args.namesrv_port,
            broker_port=args.port if is_broker else args.broker_port,
            broker_name=args.name if is_broker else args.broker_name,
            cluster=args.cluster if is_broker else "DefaultCluster",
            acl_accounts=parse_accounts(args.acl),
            broker_config={**_broker_config(args), **broker_opts},
            fault_signals=args.fault_signals,
            exit_with_parent=args.exit_with_parent,
            run_namesrv=not is_broker,
            namesrv_addrs=list(args.namesrv) if is_broker else [],
            grpc_port=grpc_port,
            grpc_groups=grpc_groups,
            announce_host=args.announce_host,
        )
    server = BrokerSimServer(config)
    server.install_stop_signals()  # before start(): a SIGTERM right after the ports open still stops cleanly
    server.start()
    # One machine-readable line on stdout, so scripts and tests using port 0 learn the addresses.
    grpc = f" grpc={server.grpc.address}" if server.grpc is not None else ""
    print(
        f"broker-sim ready namesrv={server.namesrv_address} broker={server.broker_address}{grpc}", flush=True
    )
    server.serve_forever()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command in ("serve", "namesrv", "broker"):
            return _serve(args)
        from broker_sim.remoting.admin_cli import run_admin

        return run_admin(args)
    except KeyboardInterrupt:
        return 130
    except (BrokerSimError, OSError, ValueError) as exc:
        print(f"broker-sim: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
