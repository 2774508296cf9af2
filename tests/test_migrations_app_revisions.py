"""An application whose own Alembic revisions are numbered 0001, 0002… shares the database with reliable.

Why this file exists: reliable took any row of the shared ``alembic_version`` whose id is one of its own
revision ids for its own revision of before (see reliable/migrate.py). An application numbering its
revisions the same way lost its row — and on a database where nothing else was left, its ``alembic_version``
table — while reliable's schema was never created ("at revision 0002" with no table of its own).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

from reliable.cli import main
from reliable.migrate import alembic_config, current
from reliable.models import metadata
from tests.migration_support import KINDS, engine_for, fresh_databases

HEAD = ScriptDirectory.from_config(alembic_config()).get_current_head()


@pytest.fixture
def fresh(tmp_path: Path) -> Callable[[str], AbstractContextManager[str]]:
    return fresh_databases(tmp_path)


@pytest.mark.parametrize("kind", KINDS)
def test_an_application_numbering_its_revisions_like_reliable_keeps_its_row_and_gets_reliable(
    kind: str, fresh: Callable[[str], AbstractContextManager[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    with fresh(kind) as url, engine_for(url) as engine:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER)"))
            conn.execute(text("INSERT INTO orders VALUES (1, 42)"))
            conn.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)"))
            conn.execute(text("INSERT INTO alembic_version VALUES ('0002')"))
        assert current(engine) is None  # the application's revision is not reliable's
        assert main(["db", "current", "--db", url]) == 0
        assert capsys.readouterr().out == "base (empty)\n"
        assert main(["db", "upgrade", "--db", url]) == 0
        assert capsys.readouterr().out == f"database at revision {HEAD}\n"
        assert current(engine) == HEAD
        assert set(metadata.tables) <= set(inspect(engine).get_table_names())
        with engine.connect() as conn:
            assert conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == ["0002"]
            assert conn.execute(text("SELECT id, total FROM orders")).all() == [(1, 42)]
