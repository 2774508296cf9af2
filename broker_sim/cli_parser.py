"""The command line of ``broker-sim``: every command, option and argument type, and the one-line errors for
bad ones (exit status 2).

Why apart from :mod:`broker_sim.cli`: the parser is most of the command's text and changes with every new
option or admin action, while running the commands (building a server config, starting it) changes with the
server; ``--help`` text and validation read best in one place.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, NoReturn

DEFAULT_NAMESRV = "127.0.0.1:9876"


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line (the option, what it expects, the --help hint), not the usage
    block followed by the error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def port_number(text: str) -> int:
    """A TCP port for ``--namesrv-port`` / ``--broker-port`` (0: any free port)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number 0-65535, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 0-65535, got {value}")
    return value


def host_port(text: str) -> str:
    """A ``HOST:PORT`` address for ``--namesrv``."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT such as {DEFAULT_NAMESRV}, got {text!r}")
    return text


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="broker-sim", description="A file-backed broker that behaves like RocketMQ 4.x.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser(
        "serve",
        help="run a name server and a broker over one store directory",
        description="Run a name server and a broker (RocketMQ remoting protocol) in one process.",
    )
    s.add_argument("--store", required=True, type=Path, help="store directory (created if missing)")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    s.add_argument(
        "--announce-host",
        metavar="HOST",
        help="address registered with the name servers for clients to connect to (RocketMQ brokerIP1; "
        "default: --host, or this machine's address when --host is 0.0.0.0)",
    )
    s.add_argument(
        "--namesrv-port", type=port_number, default=9876, help="name server port (0: any free port)"
    )
    s.add_argument("--broker-port", type=port_number, default=10911, help="broker port (0: any free port)")
    s.add_argument("--broker-name", default="broker-a")
    s.add_argument(
        "--grpc-port",
        type=port_number,
        help="also serve RocketMQ 5.x gRPC (MessagingService) on this port (0: any free port); needs grpcio "
        "and the protocol modules of rocketmq-python-client (see BROKER_SIM_RMQ5_PROTOCOL)",
    )
    s.add_argument(
        "--grpc-group",
        action="append",
        default=[],
        metavar="NAME:OPTIONS",
        help="5.x consumer group policy, e.g. 'orders:fifo,max_attempts=3,backoff=1s;5s' (repeatable)",
    )
    s.add_argument(
        "--brokers",
        type=int,
        default=1,
        help="broker groups (broker-a, broker-b, …); above 1, or with --slaves, every broker and the name "
        "server run as child processes on free ports",
    )
    s.add_argument("--slaves", type=int, default=0, help="slaves per broker group (default 0)")
    s.add_argument(
        "--replication",
        choices=["sync", "async"],
        default="async",
        help="masters acknowledge once a slave has the message (sync, SYNC_MASTER) or at once (async)",
    )
    _broker_options(s)
    return _build_rest(p, sub)


def _broker_options(s: argparse.ArgumentParser) -> None:
    """Options every command that runs a broker takes (``serve``, ``broker``)."""
    s.add_argument("--flush", choices=["SYNC_FLUSH", "ASYNC_FLUSH"], help="flush mode of the commit log")
    s.add_argument(
        "--auto-create-topics", action="store_true", help="create unknown topics on first send (TBW102)"
    )
    s.add_argument(
        "--acl",
        default=os.environ.get("BROKER_SIM_ACL", ""),
        metavar="AK:SK[,AK:SK]",
        help="enable the ACL check with these access keys (env BROKER_SIM_ACL)",
    )
    s.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other Broker option, e.g. --set max_reconsume_times=2 (repeatable)",
    )
    s.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    s.add_argument(
        "--fault-signals",
        action="store_true",
        help="test harnesses only: SIGUSR1 simulates a power cut (unflushed ASYNC_FLUSH data is lost, the "
        "abort file stays, exit status 137; the next start runs crash recovery)",
    )
    s.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="stop cleanly (as on SIGTERM) when the process that started this one exits",
    )


def _build_rest(p: argparse.ArgumentParser, sub: Any) -> argparse.ArgumentParser:
    n = sub.add_parser(
        "namesrv",
        help="run a name server only (brokers register with it)",
        description="Run a name server: brokers started with 'broker-sim broker --namesrv' register with it.",
    )
    n.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    n.add_argument("--port", type=port_number, default=9876, help="name server port (0: any free port)")
    n.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    n.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="stop cleanly (as on SIGTERM) when the process that started this one exits",
    )

    b = sub.add_parser(
        "broker",
        help="run a broker only, registering with one or more name servers",
        description="Run one broker of a cluster; it registers with every --namesrv every 30 s.",
    )
    b.add_argument(
        "--namesrv",
        required=True,
        type=host_port,
        action="append",
        metavar="HOST:PORT",
        help="a name server to register with (repeatable)",
    )
    b.add_argument("--store", required=True, type=Path, help="store directory (created if missing)")
    b.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    b.add_argument(
        "--announce-host",
        metavar="HOST",
        help="address registered with the name servers for clients to connect to (RocketMQ brokerIP1; "
        "default: --host, or this machine's address when --host is 0.0.0.0)",
    )
    b.add_argument("--name", default="broker-a", help="brokerName: the broker group (default broker-a)")
    b.add_argument("--cluster", default="DefaultCluster", help="cluster name (default DefaultCluster)")
    b.add_argument("--port", type=port_number, default=10911, help="broker port (0: any free port)")
    b.add_argument(
        "--role",
        choices=["ASYNC_MASTER", "SYNC_MASTER", "SLAVE"],
        default="ASYNC_MASTER",
        help="ASYNC_MASTER acknowledges at once, SYNC_MASTER once a slave has the message; SLAVE replicates",
    )
    b.add_argument(
        "--id", type=int, default=None, help="brokerId: 0 for a master (default), 1.. for a slave (default 1)"
    )
    b.add_argument(
        "--ha-port", type=port_number, default=0, help="a master's replication (HA) port (0: any free port)"
    )
    b.add_argument(
        "--master-ha",
        type=host_port,
        default=None,
        help="a slave's master HA address (default: learnt from the name server)",
    )
    _broker_options(b)

    a = sub.add_parser(
        "admin",
        help="administer a running broker-sim (like mqadmin)",
        description="Administer a running broker-sim over the network.",
    )
    a.add_argument(
        "--namesrv",
        type=host_port,
        default=os.environ.get("BROKER_SIM_NAMESRV", DEFAULT_NAMESRV),
        help=f"name server address (env BROKER_SIM_NAMESRV, default {DEFAULT_NAMESRV})",
    )
    a.add_argument("--json", action="store_true", help="print JSON instead of a table")
    asub = a.add_subparsers(dest="area", required=True, metavar="AREA")

    cluster = asub.add_parser("cluster", help="brokers of the cluster").add_subparsers(
        dest="action", required=True
    )
    cluster.add_parser("list", help="every broker: cluster, name, address, version, commit-log size, uptime")

    topic = asub.add_parser("topic", help="create, list, route, inspect and delete topics").add_subparsers(
        dest="action", required=True
    )
    tc = topic.add_parser("create", help="create or update a topic")
    tc.add_argument("name")
    tc.add_argument("--queues", type=int, default=4, help="read and write queue count (default 4)")
    tc.add_argument("--perm", type=int, default=6, help="permission bits: 2 write, 4 read (default 6)")
    topic.add_parser("list", help="list topics")
    tr = topic.add_parser("route", help="show a topic's route")
    tr.add_argument("name")
    ts = topic.add_parser("status", help="per queue: min offset, max offset, last write")
    ts.add_argument("name")
    td = topic.add_parser("delete", help="delete a topic on the broker and the name server")
    td.add_argument("name")

    consumer = asub.add_parser("consumer", help="consumer groups").add_subparsers(
        dest="action", required=True
    )
    cp = consumer.add_parser("progress", help="per queue: broker offset, consumer offset, lag")
    cp.add_argument("group")
    cp.add_argument("--topic", help="only this topic")
    cc = consumer.add_parser("connection", help="the group's live clients and subscriptions")
    cc.add_argument("group")
    cr = consumer.add_parser(
        "reset-offset",
        help="move the group's offsets on a topic to a point in time",
        description="Move GROUP's offsets on --topic to the first message stored at or after --time. Live "
        "consumers are told to restart from there; for an offline group the offsets are committed directly.",
    )
    cr.add_argument("group")
    cr.add_argument("--topic", required=True)
    cr.add_argument(
        "--time",
        required=True,
        help="ms since the epoch, 'now', 'latest', 2026-01-31T12:00:00 (UTC) or yyyy-MM-dd#HH:mm:ss:SSS",
    )
    cr.add_argument("--no-force", action="store_true", help="only move offsets back, never forward")
    ci = consumer.add_parser("running-info", help="ask one consumer client for its state")
    ci.add_argument("group")
    ci.add_argument("client", help="client id (see 'consumer connection')")
    cd = consumer.add_parser(
        "consume-directly", help="have one consumer client run its listener on a message"
    )
    cd.add_argument("group")
    cd.add_argument("client", help="client id (see 'consumer connection')")
    cd.add_argument("--id", required=True, help="the message's offsetMsgId")

    group = asub.add_parser("group", help="subscription groups").add_subparsers(dest="action", required=True)
    group.add_parser("list", help="every subscription group's settings")
    gu = group.add_parser("update", help="create or update a subscription group")
    gu.add_argument("group")
    gu.add_argument("--retry-max-times", type=int, help="messages go to %%DLQ%% after this many retries")
    gu.add_argument("--retry-queues", type=int, help="queues of the group's %%RETRY%% topic")
    gu.add_argument(
        "--consume-enable", action=argparse.BooleanOptionalAction, help="allow the group to consume"
    )
    gu.add_argument(
        "--broadcast-enable", action=argparse.BooleanOptionalAction, help="allow broadcasting consumption"
    )

    message = asub.add_parser("message", help="find messages").add_subparsers(dest="action", required=True)
    mq = message.add_parser("query", help="messages of a topic by key (index lookup)")
    mq.add_argument("--topic", required=True)
    mq.add_argument("--key", required=True)
    mq.add_argument("--max", type=int, default=32)
    mv = message.add_parser("view", help="one message by its broker message id (offsetMsgId)")
    mv.add_argument("--id", required=True)

    dlq = asub.add_parser("dlq", help="dead-letter queues").add_subparsers(dest="action", required=True)
    dl = dlq.add_parser("list", help="dead-lettered messages per group")
    dl.add_argument("--group", help="only this consumer group")
    dl.add_argument("--max", type=int, default=50, help="messages shown per group (default 50)")
    return p
