"""What a person typing ``reliable …`` wrong sees: one line, a pointer to ``--help``, exit 2.

Why this file exists: argparse printed 12–15 lines of usage before its error; ``--older-than -5d`` was read
as an unknown option; ``reliable sweep`` started the sender (a broker_sim heartbeat warning) before it
checked its own flags; ``db upgrade --db sqlite://`` migrated an in-memory database and said it was done.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from reliable.cli import main
from reliable.facade import Reliability
from tests.sweeper.helpers import QueueSender

#: the sweeps whose sender factory ran (the factory below)
LOADED: list[str] = []


def recording_sender(rel: Reliability) -> QueueSender:
    """A ``--sender`` factory that notes it was called (as a broker's sender connects when made)."""
    LOADED.append(rel.engine.url.render_as_string())
    return QueueSender()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RELIABLE_DB_URL", "RELIABLE_DEBUG", "RELIABLE_SWEEP_SENDER", "RELIABLE_REDIS_URL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def head_db(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    url = f"sqlite:///{tmp_path / 'head.db'}"
    assert main(["db", "upgrade", "--db", url]) == 0
    capsys.readouterr()
    return url


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    assert info.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(
    ("argv", "help_of"),
    [
        (["--nope"], "reliable"),
        (["db"], "reliable db"),
        (["db", "upgrade", "--what"], "reliable"),
        (["stubs", "list", "--limit", "abc", "--db", "sqlite:///x.db"], "reliable stubs list"),
        (["sweep", "--interval"], "reliable sweep"),
    ],
)
def test_a_usage_error_is_one_line_with_a_pointer_to_help(
    argv: list[str], help_of: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = usage_error(capsys, *argv)
    assert err.startswith(f"{help_of}: error: ") and err.endswith(f"(see `{help_of} --help`)\n")


@pytest.mark.parametrize(
    "argv",
    [
        ["stubs", "prune", "--older-than", "-5d"],
        [
            "sweep",
            "--once",
            "--max-unconfirmed-age",
            "-1",
            "--sender",
            "tests.test_cli_usage:recording_sender",
        ],
        ["sweep", "--interval", "-1s", "--sender", "tests.test_cli_usage:recording_sender"],
    ],
)
def test_a_negative_duration_is_a_value_refused_in_one_line(
    argv: list[str], head_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    LOADED.clear()
    assert main([*argv, "--db", head_db]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "must not be negative" in err, err
    assert LOADED == []


@pytest.mark.parametrize(
    "flag", [["--stall-after", "0"], ["--purge-duty-cycle", "2"], ["--batch", "0"], ["--backoff", "nope"]]
)
def test_sweep_checks_its_flags_before_it_starts_the_sender(
    flag: list[str], head_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    LOADED.clear()
    argv = ["sweep", "--once", "--db", head_db, "--sender", "tests.test_cli_usage:recording_sender", *flag]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("reliable: error: ")
    assert LOADED == []  # the sender was never made
    assert main(argv[: argv.index("--sender") + 2]) == 0  # the same sweep without the bad flag runs
    assert len(LOADED) == 1


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "sqlite:///file:m?mode=memory&uri=true"])
def test_an_upgrade_of_an_in_memory_database_is_refused(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    for action in (["upgrade"], ["stamp", "head"]):
        assert main(["db", *action, "--db", url]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and "in memory: nothing would be saved" in err
