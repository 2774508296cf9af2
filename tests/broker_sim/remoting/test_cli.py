"""``broker-sim serve`` / ``broker-sim admin``: behaviour, one-line errors, graceful SIGTERM."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from broker_sim import Message, Producer
from broker_sim.cli import main
from broker_sim.remoting.client_transport import RemotingTransport
from broker_sim.remoting.serve_process import ServeProcess
from tests.broker_sim.remoting.conftest import FAST_DELAYS, ServerFactory, running_broker
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["serve"],
        ["admin"],
        ["admin", "topic"],
        ["admin", "topic", "create"],
        ["admin", "consumer"],
        ["admin", "message"],
        ["admin", "message", "query"],
        ["admin", "dlq"],
        ["admin", "dlq", "list"],
        ["admin", "cluster", "list"],
        ["admin", "topic", "status"],
        ["admin", "topic", "delete"],
        ["admin", "consumer", "progress"],
        ["admin", "consumer", "connection"],
        ["admin", "consumer", "reset-offset"],
        ["admin", "consumer", "running-info"],
        ["admin", "consumer", "consume-directly"],
        ["admin", "group", "update"],
        ["admin", "group", "list"],
    ],
)
def test_help_everywhere(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--help"])
    assert exc.value.code == 0
    assert "usage: broker-sim" in capsys.readouterr().out


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_admin_commands(serve: ServerFactory, capsys: pytest.CaptureFixture[str]) -> None:
    srv = serve(topics={"T": 2}, max_reconsume_times=0, message_delay_level=FAST_DELAYS)
    broker = running_broker(srv)
    ns = ["admin", "--namesrv", srv.namesrv_address]
    assert run_cli([*ns, "topic", "create", "Orders", "--queues", "3"], capsys)[0] == 0
    code, out, _ = run_cli([*ns, "--json", "topic", "list"], capsys)
    assert code == 0 and {"topic": "Orders"} in json.loads(out) and {"topic": "T"} in json.loads(out)
    code, out, _ = run_cli([*ns, "topic", "route", "Orders"], capsys)
    assert json.loads(out)["queueDatas"][0]["writeQueueNums"] == 3

    producer = Producer(srv.namesrv_address, "PG")
    sent = [producer.send(Message("T", f"b{i}".encode(), keys=f"key{i}")) for i in range(6)]
    producer.shutdown()
    broker.update_consumer_offset("CG", "T", 0, 1)
    # consume queues are built asynchronously from the commit log: wait until both queues show the sends
    assert wait_until(lambda: sum(p.broker_offset for p in broker.consumer_progress("CG", "T")) == 6)
    code, out, _ = run_cli([*ns, "--json", "consumer", "progress", "CG"], capsys)
    rows = {(r["topic"], r["queue"]): r for r in json.loads(out)}
    q0 = rows[("T", 0)]
    assert (q0["consumerOffset"], q0["lag"]) == (1, q0["brokerOffset"] - 1)
    code, out, _ = run_cli([*ns, "consumer", "progress", "CG"], capsys)
    assert "lag" in out.splitlines()[0] and out.splitlines()[-1].startswith("total lag: ")

    code, out, _ = run_cli([*ns, "--json", "message", "query", "--topic", "T", "--key", "key4"], capsys)
    (row,) = json.loads(out)
    assert (row["body"], row["msgId"]) == ("b4", sent[4].msg_id)
    code, out, _ = run_cli([*ns, "message", "view", "--id", sent[2].offset_msg_id], capsys)
    assert json.loads(out)["body"] == "b2"
    assert (
        json.loads(run_cli([*ns, "--json", "message", "query", "--topic", "T", "--key", "nope"], capsys)[1])
        == []
    )

    # a message sent back with max_reconsume_times=0 goes straight to the DLQ
    from broker_sim.common.message import decode_offset_msg_id
    from broker_sim.common.requests import ConsumerSendMsgBackRequest

    broker.consumer_send_msg_back(
        ConsumerSendMsgBackRequest("CG", decode_offset_msg_id(sent[1].offset_msg_id)[1])
    )
    code, out, _ = run_cli([*ns, "--json", "dlq", "list"], capsys)
    (dead,) = json.loads(out)
    assert (dead["group"], dead["body"], dead["retryTopic"]) == ("CG", "b1", "T")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["topic", "route", "Missing"], "No topic route info"),
        (["message", "view", "--id", "xyz"], "bad message id"),
        (["topic", "create", "bad name!"], "error"),
        (["topic", "create", "T2", "--queues", "0"], "--queues"),
    ],
)
def test_admin_errors_are_one_line(
    serve: ServerFactory, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    srv = serve()
    code, out, err = run_cli(["admin", "--namesrv", srv.namesrv_address, *argv], capsys)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("broker-sim: error:") and message in err


def test_unreachable_name_server(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["admin", "--namesrv", "127.0.0.1:1", "topic", "list"], capsys)
    assert code == 1 and err.count("\n") == 1 and "cannot connect" in err


def test_serve_rejects_bad_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["serve", "--store", str(tmp_path / "s"), "--set", "no_such_option=1"], capsys)
    assert code == 1 and "no_such_option" in err and err.count("\n") == 1
    code, _, err = run_cli(["serve", "--store", str(tmp_path / "s"), "--set", "novalue"], capsys)
    assert code == 1 and "KEY=VALUE" in err
    code, _, err = run_cli(["serve", "--store", str(tmp_path / "s"), "--acl", "nokey"], capsys)
    assert code == 1 and "accessKey:secretKey" in err


def _bad(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run the CLI as a new user would; argparse failures exit through SystemExit."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    return code, err


def test_port_out_of_range_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``serve --namesrv-port 99999`` used to die with a 14-line OverflowError traceback."""
    code, err = _bad(["serve", "--store", str(tmp_path / "s"), "--namesrv-port", "99999"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "--namesrv-port" in err and "0-65535" in err and "--help" in err
    code, err = _bad(["serve", "--store", str(tmp_path / "s"), "--broker-port", "ten"], capsys)
    assert code == 2 and err.count("\n") == 1 and "--broker-port" in err


def test_set_value_of_the_wrong_type_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--set max_reconsume_times=abc`` used to answer "'<' not supported between instances of 'str' and
    'int'"."""
    code, err = _bad(["serve", "--store", str(tmp_path / "s"), "--set", "max_reconsume_times=abc"], capsys)
    assert code == 1 and err.count("\n") == 1
    assert "--set" in err and "max_reconsume_times" in err and "integer" in err and "'abc'" in err
    code, err = _bad(["serve", "--store", str(tmp_path / "s"), "--set", "enable_property_filter=yes"], capsys)
    assert code == 1 and "enable_property_filter expects true or false" in err
    assert not (tmp_path / "s").exists()  # refused before anything was created


def test_admin_bad_namesrv_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """``admin --namesrv notanaddress`` used to answer "invalid literal for int()"."""
    code, err = _bad(["admin", "--namesrv", "notanaddress", "topic", "list"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "--namesrv" in err and "HOST:PORT" in err and "'notanaddress'" in err


def test_serve_shuts_down_cleanly_on_sigterm(tmp_path: Path) -> None:
    store = tmp_path / "store"
    server = ServeProcess(store, "--set", 'topics={"T": 1}', log_level="INFO")
    with server:
        assert (store / "abort").exists()  # running: an unclean stop now would trigger recovery
        t = RemotingTransport(server.namesrv)
        t.update_consumer_offset("G", "T", 0, 7)  # oneway: wait until the broker has it, then stop
        assert wait_until(lambda: t.query_consumer_offset("G", "T", 0) == 7)
        t.close()
        assert server.stop(signal.SIGTERM) == 0
        err = server.communicate()
    assert not (store / "abort").exists()
    offsets = json.loads((store / "config" / "consumerOffset.json").read_text())
    assert offsets["offsetTable"]["T@G"] in ({"0": 7}, {0: 7})
    assert "connection from" in err and "stopped" in err and "Traceback" not in err
