"""A ``--group`` (or ``retire GROUP``) that names no consumer group is a typo, not "0 rows": one line that
says so and names the groups there are, exit 2. ``stubs retire bilingg --yes`` printed "voided 0 open
row(s)" and the operator went home while the real group's rows kept being re-sent and given up on."""

from __future__ import annotations

import pytest

from reliable import Reliability
from reliable.cli import main
from reliable.types import StubStatus
from tests.sweeper.helpers import add_stub, get_inbox, set_progress


def _err(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    return err


def test_a_group_nobody_has_is_said_with_the_groups_there_are(
    sqlite_rel: Reliability, sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    add_stub(sqlite_rel, "dead-1", groups=["billing", "audit"], status=StubStatus.DEAD)
    set_progress(sqlite_rel, 10, group="billing")
    db = ["--db", sqlite_url]
    for argv in (
        ["stubs", "retire", "bilingg", "--yes"],
        ["stubs", "retire", "bilingg"],
        ["stubs", "list", "--group", "bilingg"],
        ["stubs", "revive", "dead-1", "--group", "bilingg"],
        ["stubs", "void", "dead-1", "--group", "bilingg"],
    ):
        err = _err(capsys, *argv, *db)
        assert "no consumer group 'bilingg'" in err and "billing" in err, err
    assert get_inbox(sqlite_rel, "dead-1", "billing").status is StubStatus.DEAD  # nothing changed
    assert get_inbox(sqlite_rel, "dead-1", "audit").status is StubStatus.DEAD


def test_a_group_with_rows_but_none_open_is_not_a_typo(
    sqlite_rel: Reliability, sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    add_stub(sqlite_rel, "done-1", groups=["old"], status=StubStatus.CONFIRMED)
    assert main(["stubs", "retire", "old", "--yes", "--db", sqlite_url]) == 0
    assert "retired group old: voided 0 open row(s)" in capsys.readouterr().out
    assert main(["stubs", "list", "--group", "old", "--status", "DEAD", "--db", sqlite_url]) == 0
    assert "(0 row(s))" in capsys.readouterr().out
