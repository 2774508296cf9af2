"""Alembic's offline mode (``alembic upgrade|downgrade --sql``): SQL written for a DBA to run, no connection.

Why this file exists: steps that read rows (0006's downgrade folds consume_progress, 0008's downgrade checks
rows before converting) crashed with a traceback on the result that offline mode does not have; MariaDB's
offline upgrade wrote ``utf8mb4_bin`` (blind to trailing spaces) instead of ``utf8mb4_nopad_bin``.
"""

from __future__ import annotations

import io

import pytest
from alembic import command
from alembic.util import CommandError

from reliable.errors import MigrationRefusedError
from reliable.migrate import alembic_config

#: offline mode never connects: nothing needs to listen at these URLs
MARIADB = "mariadb+pymysql://root@127.0.0.1:1/nowhere"
MYSQL = "mysql+pymysql://root@127.0.0.1:1/nowhere"
POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:1/nowhere"


def offline(url: str, action: str, revision: str) -> str:
    cfg = alembic_config(url=url)
    cfg.output_buffer = io.StringIO()
    getattr(command, action)(cfg, revision, sql=True)
    return cfg.output_buffer.getvalue()


def test_mariadb_offline_upgrade_writes_the_exact_collation() -> None:
    sql = offline(MARIADB, "upgrade", "head")
    assert "COLLATE utf8mb4_nopad_bin" in sql and "COLLATE utf8mb4_bin" not in sql


def test_a_mysql_url_offline_upgrade_through_0008_is_refused_with_the_way_out() -> None:
    with pytest.raises(MigrationRefusedError, match="mariadb\\+pymysql") as info:
        offline(MYSQL, "upgrade", "head")
    assert isinstance(info.value, CommandError)  # alembic's own CLI: "FAILED: <line>", no traceback
    assert "COLLATE" not in offline(MYSQL, "upgrade", "0007")  # below 0008 nothing needs the server


@pytest.mark.parametrize(
    ("url", "span", "step"),
    [(POSTGRES, "0009:0005", "0006"), (MARIADB, "0009:0007", "0008"), (MYSQL, "0009:0007", "0008")],
)
def test_an_offline_downgrade_through_a_step_that_reads_rows_is_one_line(
    url: str, span: str, step: str
) -> None:
    with pytest.raises(
        MigrationRefusedError, match=f"downgrade of {step} .*cannot be written as SQL"
    ) as info:
        offline(url, "downgrade", span)
    assert isinstance(info.value, CommandError) and "\n" not in str(info.value)
    # the steps that only change the schema are still written
    assert "properties" in offline(url, "downgrade", "0009:0008")
