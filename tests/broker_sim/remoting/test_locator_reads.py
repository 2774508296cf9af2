"""Where a client's reads of a broker group go around a master's power cut, when the name server notices the
cut a moment after the client does (its connection to the broker closes on its own schedule; under load that
moment is long enough for a route refresh to fall in it).

What a user needs (the sweeper's probe reads offsets this way): once the master is back, reads go to it —
not to its slave, which a power cut leaves ahead of the restarted master with a copy that no longer moves.
A master that failed and is still listed (hung) is read after its slave, as before.
"""

from __future__ import annotations

from collections.abc import Mapping

from broker_sim.common.requests import ResponseCode
from broker_sim.remoting.bodies import dump_json
from broker_sim.remoting.broker_directory import SUSPECT_S, BrokerDirectory
from broker_sim.remoting.command import RemotingCommand
from broker_sim.remoting.locator import BrokerLocator

MASTER, SLAVE = "127.0.0.1:26501", "127.0.0.1:26502"


class NameServer:
    """A name server's cluster info as the test sets it (``listed``: broker-a's nodes by broker id)."""

    def __init__(self) -> None:
        self.listed: dict[int, str] = {0: MASTER, 1: SLAVE}
        self.asked = 0

    def invoke(self, addr: str, cmd: RemotingCommand) -> RemotingCommand:
        self.asked += 1
        table = {"broker-a": {"brokerAddrs": {str(i): a for i, a in self.listed.items()}}}
        return RemotingCommand(code=ResponseCode.SUCCESS, body=dump_json({"brokerAddrTable": table}))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def request(code: int, fields: Mapping[str, object] | None) -> RemotingCommand:
    return RemotingCommand.request(code, fields)


def locator(ns: NameServer, clock: Clock) -> BrokerLocator:
    loc = BrokerLocator("127.0.0.1:26500", ns.invoke, request)
    loc.directory = BrokerDirectory(clock)  # the suspect window on the test's clock
    return loc


def test_a_restarted_master_is_read_again_though_a_refresh_listed_it_while_it_was_down() -> None:
    ns, clock = NameServer(), Clock()
    loc = locator(ns, clock)
    assert loc.broker("broker-a", read=True) == MASTER
    loc.directory.forget(MASTER)  # a request to it failed: the power cut
    # the name server has not seen the master's connection close yet: it lists it still
    assert loc.broker("broker-a", read=True) == SLAVE
    ns.listed = {1: SLAVE}  # now it has
    clock.now += 1
    assert loc.broker("broker-a", read=True) == SLAVE
    ns.listed = {0: MASTER, 1: SLAVE}  # restarted, registered again, well inside SUSPECT_S
    clock.now += 1
    assert clock.now - 1000.0 < SUSPECT_S
    assert loc.broker("broker-a", read=True) == MASTER


def test_a_hung_master_the_name_server_keeps_listing_is_read_after_its_slave() -> None:
    ns, clock = NameServer(), Clock()
    loc = locator(ns, clock)
    assert loc.broker("broker-a", read=True) == MASTER
    loc.directory.forget(MASTER)  # it stopped answering; the name server lists it for its 120 s expiry
    for _ in range(3):
        clock.now += 1
        assert loc.broker("broker-a", read=True) == SLAVE
    clock.now += SUSPECT_S
    assert loc.broker("broker-a", read=True) == MASTER  # tried again once the window is over


def test_reads_of_a_healthy_master_do_not_ask_the_name_server() -> None:
    ns, clock = NameServer(), Clock()
    loc = locator(ns, clock)
    loc.broker("broker-a", read=True)
    asked = ns.asked
    for _ in range(5):
        assert loc.broker("broker-a", read=True) == MASTER
    assert ns.asked == asked
