"""``broker-sim namesrv`` / ``broker-sim broker`` / ``broker-sim serve --brokers N --slaves M``: help,
one-line errors, and a whole cluster from one command."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from broker_sim.cli import main
from broker_sim.remoting.admin_client import AdminClient
from broker_sim.remoting.serve_process import ServeProcess
from tests.waiting import wait_until


@pytest.mark.parametrize("argv", [["namesrv"], ["broker"]])
def test_help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--help"])
    assert exc.value.code == 0 and "usage: broker-sim" in capsys.readouterr().out


def _bad(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err and err.count("\n") == 1
    return code, err


def test_bad_cluster_options_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(tmp_path / "s")
    broker = ["broker", "--store", store, "--namesrv", "127.0.0.1:1"]
    code, err = _bad([*broker, "--role", "SLAVE", "--id", "0"], capsys)
    assert code == 1 and "--id 0" in err and "slave" in err
    code, err = _bad([*broker, "--id", "2"], capsys)
    assert code == 1 and "--id 2" in err and "master" in err
    code, err = _bad([*broker, "--role", "BOSS"], capsys)
    assert code == 2 and "--role" in err
    code, err = _bad(["broker", "--store", store, "--namesrv", "nohost"], capsys)
    assert code == 2 and "--namesrv" in err and "HOST:PORT" in err
    code, err = _bad(["serve", "--store", store, "--brokers", "0"], capsys)
    assert code == 1 and "--brokers" in err
    code, err = _bad(["serve", "--store", store, "--set", "broker_role=BOSS"], capsys)
    assert code == 1 and "broker_role must be ASYNC_MASTER, SYNC_MASTER or SLAVE" in err
    assert not (tmp_path / "s").exists()


@pytest.mark.slow
def test_serve_runs_a_whole_cluster_and_stops_it(tmp_path: Path) -> None:
    proc = ServeProcess(tmp_path / "c", "--brokers", "2", "--slaves", "1", "--replication", "sync")
    with proc:
        admin = AdminClient(proc.namesrv)
        try:
            table = admin.cluster_info()["brokerAddrTable"]
            assert {n: sorted(d["brokerAddrs"]) for n, d in table.items()} == {
                "broker-a": ["0", "1"],
                "broker-b": ["0", "1"],
            }
            brokers = [a for d in table.values() for a in d["brokerAddrs"].values()]
        finally:
            admin.close()
        assert proc.stop(signal.SIGTERM) == 0
    children = [p for p in Path("/proc").iterdir() if p.name.isdigit()]

    def orphans() -> list[str]:
        found = []
        for p in children:
            try:
                cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if str(tmp_path) in cmd and p.name != str(os.getpid()):
                found.append(cmd)
        return found

    assert wait_until(lambda: orphans() == [], timeout=30), orphans()
    assert len(brokers) == 4
