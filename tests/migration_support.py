"""What the migration tests share: the backends, the schema snapshot a DBA would compare, fresh databases.

Every cycle runs on a database of its own (``services.scratch_database``), never the shared session databases,
which other tests expect at head.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, inspect

from reliable.facade import make_engine
from reliable.models import metadata
from tests import services

TABLES = set(metadata.tables)  # the three contract tables plus whatever later revisions add
KINDS = ["sqlite", "postgres", "mariadb"]


def fresh_databases(tmp_path: Path) -> Callable[[str], AbstractContextManager[str]]:
    """``make(kind)``: a context manager giving the URL of an empty database nobody else uses."""
    counter = iter(range(1000))

    @contextmanager
    def make(kind: str) -> Iterator[str]:
        if kind == "sqlite":
            yield f"sqlite:///{tmp_path / f'fresh{next(counter)}.db'}"
        else:
            with services.scratch_database(kind) as url:
                yield url

    return make


@contextmanager
def engine_for(url: str) -> Iterator[Engine]:
    engine = make_engine(url)
    try:
        yield engine
    finally:
        engine.dispose()


def snapshot(engine: Engine) -> dict[str, Any]:
    """Everything a DBA would compare: tables, columns (type, nullability, default), PK/CK names, indexes."""
    insp = inspect(engine)
    out: dict[str, Any] = {}
    for table in sorted(set(insp.get_table_names()) - {"alembic_version", "reliable_alembic_version"}):
        pk = insp.get_pk_constraint(table)
        out[table] = {
            "columns": [
                (c["name"], str(c["type"]), c["nullable"], str(c.get("default")), c.get("autoincrement"))
                for c in insp.get_columns(table)
            ],
            "pk": (pk.get("name"), tuple(pk["constrained_columns"])),
            "indexes": sorted(
                (
                    i["name"],
                    tuple(str(c) for c in i["column_names"]),
                    bool(i["unique"]),
                    # a partial index's predicate (migration 0007, PostgreSQL)
                    str(i.get("dialect_options", {}).get("postgresql_where")),
                )
                for i in insp.get_indexes(table)
            ),
            "checks": sorted(
                (c["name"], " ".join(str(c["sqltext"]).replace("(", " ").replace(")", " ").split()))
                for c in insp.get_check_constraints(table)
            ),
        }
    return out
