"""``reliable db upgrade|downgrade|current``: exit codes, one-line errors, flags and environment."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

from broker_sim.common.net import listen_port
from reliable.cli import main
from reliable.facade import make_engine
from reliable.migrate import alembic_config, current
from reliable.models import metadata
from tests import services

HEAD = ScriptDirectory.from_config(alembic_config()).get_current_head()
RELIABLE = str(Path(sys.executable).parent / "reliable")


@pytest.fixture(autouse=True)
def _no_env_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RELIABLE_DB_URL", raising=False)
    monkeypatch.delenv("RELIABLE_DEBUG", raising=False)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_upgrade_current_downgrade_cycle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    # a file that does not exist is a mistyped path: said, not created and printed as an empty database
    code, _, err = run(capsys, "db", "current", "--db", url)
    assert code != 0 and "no database file" in err and not (tmp_path / "cli.db").exists()
    assert run(capsys, "db", "upgrade", "--db", url) == (0, f"database at revision {HEAD}\n", "")
    assert run(capsys, "db", "upgrade", "--db", url)[0] == 0  # idempotent
    assert run(capsys, "db", "current", "--db", url) == (0, f"{HEAD}\n", "")
    engine = make_engine(url)
    assert {"message_stub", "message_log", "consume_progress"} <= set(inspect(engine).get_table_names())
    code, _, err = run(capsys, "db", "downgrade", "base", "--db", url)  # destructive: asked for
    assert code == 2 and "--yes" in err
    assert current(engine) == HEAD
    assert run(capsys, "db", "downgrade", "base", "--yes", "--db", url) == (
        0,
        "database at revision base\n",
        "",
    )
    assert set(inspect(engine).get_table_names()) <= {"reliable_alembic_version"}
    engine.dispose()


def test_a_database_a_newer_reliable_migrated_and_an_upgrade_backwards_are_said_not_ignored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A revision this reliable does not know: every command advised `reliable db upgrade`, which then said
    "Can't locate revision". An upgrade to a revision below the database's did nothing, and said it was
    done."""
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    assert run(capsys, "db", "upgrade", "--db", url)[0] == 0
    code, out, err = run(capsys, "db", "upgrade", "0005", "--db", url)
    assert code == 2 and out == "" and "below the database's" in err and "downgrade" in err
    assert run(capsys, "db", "current", "--db", url) == (0, f"{HEAD}\n", "")
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE reliable_alembic_version SET version_num = '9999'"))
    engine.dispose()
    for argv in (["db", "upgrade"], ["stubs", "list"]):
        code, out, err = run(capsys, *argv, "--db", url)
        assert code != 0 and err.count("\n") == 1 and "does not know" in err and "newer reliable" in err


def test_database_url_from_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELIABLE_DB_URL", f"sqlite:///{tmp_path / 'env.db'}")
    assert run(capsys, "db", "upgrade")[0] == 0
    assert run(capsys, "db", "current") == (0, f"{HEAD}\n", "")


@pytest.mark.parametrize(
    ("argv", "code", "needle"),
    [
        (["db", "upgrade"], 2, "no database: pass --db URL or set RELIABLE_DB_URL"),
        (["db", "upgrade", "--db", "nonsense://x"], 2, "bad database URL"),
        (
            ["db", "upgrade", "9999", "--db", "sqlite:///TMP/x.db"],
            2,
            "Can't locate revision identified by '9999'",
        ),
        (["db", "downgrade", "nope", "--yes", "--db", "sqlite:///TMP/x.db"], 2, "nope"),
        (["db", "current", "--db", "mysql://root@127.0.0.1/x"], 2, "write mysql+pymysql://"),
        (["stubs", "list", "--db", "garbage"], 2, "bad database URL"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], code: int, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    got, out, err = run(capsys, *(a.replace("TMP", str(tmp_path)) for a in argv))
    assert got == code
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("reliable: error: ") and needle in err


def test_unreachable_database_is_one_line_and_nonzero(capsys: pytest.CaptureFixture[str]) -> None:
    port = listen_port()  # nothing listens there
    got, _, err = run(capsys, "db", "current", "--db", f"postgresql+psycopg://postgres@127.0.0.1:{port}/x")
    assert got != 0
    assert err.count("\n") == 1 and "reliable: error:" in err and "Traceback" not in err


@pytest.mark.parametrize("action", [["upgrade"], ["downgrade", "base", "--yes"], ["current"]])
def test_a_database_that_cannot_be_opened_is_one_line_and_exit_2(
    action: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A SQLite file in a directory that does not exist (upgrade creates the file, not the directory) and a
    server that does not answer: one line naming the reason and exit 2, as ``reliable sweep`` says it —
    ``db upgrade`` exited 1 with the driver's raw OperationalError."""
    for url in (
        f"sqlite:///{tmp_path / 'no-such-dir' / 'x.db'}",
        f"postgresql+psycopg://postgres@127.0.0.1:{listen_port()}/x",
    ):
        if action == ["current"] and url.startswith("sqlite"):
            continue  # said before any connection: "no database file"
        got, out, err = run(capsys, "db", *action, "--db", url)
        assert (got, out) == (2, ""), err
        assert err.count("\n") == 1 and err.startswith("reliable: error: cannot open the database (")
        assert "check --db" in err
    assert not (tmp_path / "no-such-dir").exists()


def test_missing_action_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["db"])
    assert exit_info.value.code == 2
    assert "ACTION" in capsys.readouterr().err
    for argv in (["db", "--help"], ["db", "upgrade", "--help"], ["db", "downgrade", "--help"]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 0
        out = capsys.readouterr().out
        assert "--db URL" in out or "upgrade" in out


def test_installed_entry_point_against_postgres() -> None:
    """The console script, in a process of its own, on a fresh database of a real server."""
    env = {k: v for k, v in os.environ.items() if k not in ("RELIABLE_DB_URL", "RELIABLE_DEBUG")}
    with services.scratch_database("postgres") as url:
        up = subprocess.run([RELIABLE, "db", "upgrade", "--db", url], env=env, capture_output=True, text=True)
        assert (up.returncode, up.stdout) == (0, f"database at revision {HEAD}\n"), up.stderr
        cur = subprocess.run(
            [RELIABLE, "db", "current", "--db", url], env=env, capture_output=True, text=True
        )
        assert (cur.returncode, cur.stdout) == (0, f"{HEAD}\n")
    bad = subprocess.run([RELIABLE, "db", "upgrade"], env=env, capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr == "reliable: error: no database: pass --db URL or set RELIABLE_DB_URL\n"


def test_export_of_a_database_without_the_schema_is_one_line_and_leaves_no_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Like every other command: a hint instead of a driver error, and nothing half-written in ``--to``."""
    pytest.importorskip("pyarrow")
    db = tmp_path / "empty.db"
    make_engine(f"sqlite:///{db}").connect().close()  # the file exists, the tables do not
    got, out, err = run(capsys, "export", "--db", f"sqlite:///{db}", "--to", str(tmp_path / "out"))
    assert (got, out) == (2, "")
    assert "has no reliable schema" in err and "reliable db upgrade" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_tables_without_a_recorded_revision_are_said_with_the_way_out(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``metadata.create_all`` (or a lost version table): ``db current`` printed an empty database and
    ``db upgrade`` failed "table message_stub already exists", with no hint. Said now, and ``db stamp``
    records the revision."""
    with contextlib.ExitStack() as stack:
        url = (
            f"sqlite:///{tmp_path / 'made.db'}"
            if kind == "sqlite"
            else stack.enter_context(services.scratch_database("postgres"))
        )
        engine = make_engine(url)
        stack.callback(engine.dispose)
        metadata.create_all(engine)
        for argv in (["current"], ["upgrade"], ["downgrade", "base", "--yes"]):
            code, out, err = run(capsys, "db", *argv, "--db", url)
            assert (code, out) == (2, ""), err
            assert err.count("\n") == 1 and "no schema revision is recorded" in err and "db stamp" in err
        code, _, err = run(capsys, "stubs", "list", "--db", url)
        assert code == 2 and "db stamp" in err
        code, _, err = run(capsys, "db", "stamp", "nope", "--db", url)
        assert code == 2 and err.count("\n") == 1 and "nope" in err
        code, out, err = run(capsys, "db", "stamp", "head", "--db", url)
        assert (code, out, err) == (0, f"database stamped at revision {HEAD} (no table changed)\n", "")
        assert run(capsys, "db", "upgrade", "--db", url) == (0, f"database at revision {HEAD}\n", "")
        assert run(capsys, "db", "current", "--db", url) == (0, f"{HEAD}\n", "")


def test_a_sqlite_uri_filename_is_the_file_it_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``sqlite:///file:/path/x.db?mode=ro&uri=true`` (read-only) was refused: ``file:/path…`` was looked for
    as a path, by every command and by ``reliable reconcile``."""
    from reliable.cli.reconcile import _check_sqlite
    from reliable.reconcile.errors import InputError

    db = tmp_path / "ro db.db"
    assert run(capsys, "db", "upgrade", "--db", f"sqlite:///{db}")[0] == 0
    for uri in (f"file:{db}?mode=ro&uri=true", f"file://{str(db).replace(' ', '%20')}?mode=ro&uri=true"):
        assert run(capsys, "db", "current", "--db", f"sqlite:///{uri}") == (0, f"{HEAD}\n", "")
        code, _, err = run(capsys, "stubs", "list", "--db", f"sqlite:///{uri}")
        assert code == 0, err
        _check_sqlite(f"sqlite:///{uri}")
    missing = f"sqlite:///file:{tmp_path / 'nope.db'}?mode=ro&uri=true"
    code, _, err = run(capsys, "db", "current", "--db", missing)
    assert code == 2 and f"no database file {tmp_path / 'nope.db'}:" in err
    with pytest.raises(InputError, match=r"nope\.db"):
        _check_sqlite(missing)
