"""The TCP server and client connection against hostile and ordinary peers (real sockets on loopback)."""

from __future__ import annotations

import gc
import json
import random
import socket
import struct
import threading
import weakref
from collections.abc import Iterator
from functools import partial

import pytest

from broker_sim.common.errors import RequestTimeoutError, TransportError
from broker_sim.remoting.acl import AclGuard, sign, signature
from broker_sim.remoting.client import RemotingConnection
from broker_sim.remoting.codes import ResponseCode
from broker_sim.remoting.frame import MAX_FRAME_BYTES, FrameDecoder, RemotingCommand, encode
from broker_sim.remoting.header import Fields
from broker_sim.remoting.server import DEFERRED, Connection, Deferred, Handler, RemotingServer

ECHO, FAIL, BAD_FIELD, HOLD, RELEASE, ONEWAY, SILENT = 900, 901, 902, 903, 904, 905, 906


class Handlers:
    def __init__(self) -> None:
        self.oneway_seen = threading.Event()
        self.held: list[tuple[RemotingCommand, Connection]] = []
        self.held_event = threading.Event()

    def table(self) -> dict[int, Handler]:
        return {
            ECHO: lambda cmd, conn: cmd.reply(0, ext_fields=cmd.ext_fields, body=cmd.body),
            FAIL: self.fail,
            BAD_FIELD: lambda cmd, conn: cmd.reply(0, ext_fields={"n": Fields(cmd.ext_fields).num("n")}),
            HOLD: self.hold,
            RELEASE: self.release,
            ONEWAY: self.oneway,
            SILENT: lambda cmd, conn: None,
        }

    @staticmethod
    def fail(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        raise RuntimeError("handler bug")

    def hold(self, cmd: RemotingCommand, conn: Connection) -> Deferred:
        self.held.append((cmd, conn))
        self.held_event.set()
        return DEFERRED

    def release(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        for held, held_conn in self.held:
            held_conn.send(held.reply(0, "released"))
        self.held.clear()
        return cmd.reply(0)

    def oneway(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        self.oneway_seen.set()
        return cmd.reply(0, "must not be sent")


@pytest.fixture
def handlers() -> Handlers:
    return Handlers()


@pytest.fixture
def server(handlers: Handlers) -> Iterator[RemotingServer]:
    srv = RemotingServer(handlers.table(), "127.0.0.1", 0, name="test", workers=8)
    srv.start()
    yield srv
    srv.shutdown()


@pytest.fixture
def client(server: RemotingServer) -> Iterator[RemotingConnection]:
    conn = RemotingConnection(server.address)
    yield conn
    conn.close()


def raw_exchange(address: str, data: bytes, timeout: float = 5.0) -> bytes:
    """Send raw bytes, half-close, return whatever the server sends before closing."""
    host, _, port = address.rpartition(":")
    chunks = []
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except OSError:
            pass  # the server may refuse a bad length before the rest of the bytes arrive, and close first
    return b"".join(chunks)


def assert_alive(address: str) -> None:
    conn = RemotingConnection(address)
    try:
        assert conn.invoke(RemotingCommand.request(ECHO, {"k": "v"}), 5).ext_fields == {"k": "v"}
    finally:
        conn.close()


def test_echo_and_unsupported_code(client: RemotingConnection) -> None:
    rep = client.invoke(RemotingCommand.request(ECHO, {"a": 1}, b"body"), 5)
    assert (rep.code, rep.ext_fields, rep.body, rep.is_response) == (0, {"a": "1"}, b"body", True)
    rep = client.invoke(RemotingCommand.request(777), 5)
    assert rep.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert rep.remark == "request type 777 not supported"


def test_handler_errors_become_replies(client: RemotingConnection, server: RemotingServer) -> None:
    rep = client.invoke(RemotingCommand.request(FAIL), 5)
    assert rep.code == ResponseCode.SYSTEM_ERROR and "handler bug" in (rep.remark or "")
    rep = client.invoke(RemotingCommand.request(BAD_FIELD, {"n": "x"}), 5)
    assert rep.code == ResponseCode.SYSTEM_ERROR and "'n'" in (rep.remark or "")
    rep = client.invoke(RemotingCommand.request(BAD_FIELD), 5)
    assert rep.code == ResponseCode.SYSTEM_ERROR and "lacks" in (rep.remark or "")
    assert server.stats.handler_errors == 1


def test_oneway_gets_no_reply(server: RemotingServer, handlers: Handlers) -> None:
    frames = encode(RemotingCommand.request(ONEWAY, oneway=True)) + encode(
        RemotingCommand(code=ECHO, opaque=42)
    )
    host, _, port = server.address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(frames)
        dec = FrameDecoder()
        got: list[RemotingCommand] = []
        while not got:
            got += dec.feed(s.recv(4096))
    assert handlers.oneway_seen.is_set()
    assert [c.opaque for c in got] == [42]  # only the echo's reply came back


def test_deferred_reply_does_not_block_the_connection(client: RemotingConnection, handlers: Handlers) -> None:
    results: list[RemotingCommand | BaseException] = []
    done = threading.Event()

    def on_reply(r: RemotingCommand | BaseException) -> None:
        results.append(r)
        done.set()

    client.invoke_async(RemotingCommand.request(HOLD), on_reply, 10)
    assert handlers.held_event.wait(5)
    assert client.invoke(RemotingCommand.request(ECHO), 5).code == 0  # same socket, while HOLD is pending
    assert not done.is_set()
    client.invoke(RemotingCommand.request(RELEASE), 5)
    assert done.wait(5)
    assert isinstance(results[0], RemotingCommand) and results[0].remark == "released"


def test_request_timeout(client: RemotingConnection) -> None:
    with pytest.raises(RequestTimeoutError):
        client.invoke(RemotingCommand.request(SILENT), 0.2)
    assert client.invoke(RemotingCommand.request(ECHO), 5).code == 0  # connection still usable


@pytest.mark.parametrize(
    "garbage",
    [
        struct.pack(">i", -1),
        struct.pack(">i", 2) + b"xx",
        struct.pack(">i", MAX_FRAME_BYTES + 1) + b"\x00" * 1000,
        struct.pack(">ii", 10, 6) + b"{nope}",
        struct.pack(">ii", 8, 4) + b"null",
        struct.pack(">ii", 100, 4) + b"{}",  # truncated: fewer bytes than declared, then EOF
        struct.pack(">ii", 20, (9 << 24) | 4) + b"{}" * 8,
    ],
    ids=["negative", "too-short", "over-16MiB", "bad-json", "json-null", "truncated", "bad-serialize-type"],
)
def test_bad_frames_close_only_that_connection(server: RemotingServer, garbage: bytes) -> None:
    assert raw_exchange(server.address, garbage) == b""  # no reply, connection closed
    assert_alive(server.address)


def test_request_with_bad_fields_is_answered_not_dropped(server: RemotingServer) -> None:
    header = json.dumps({"code": ECHO, "opaque": 9, "extFields": {"nested": {"x": 1}}}).encode()
    frame = struct.pack(">ii", 4 + len(header), len(header)) + header
    # a nested extFields value is a malformed frame: connection closed, server fine
    assert raw_exchange(server.address, frame) == b""
    assert_alive(server.address)


def test_byte_mutation_storm_over_tcp(server: RemotingServer) -> None:
    """Mutated frames on fresh connections: the server never dies and keeps answering."""
    rng = random.Random(1234)
    base = encode(RemotingCommand.request(ECHO, {"topic": "T", "queueId": 3}, b"payload" * 4))
    for _ in range(60):
        frame = bytearray(base)
        for _ in range(rng.randint(1, 5)):
            frame[rng.randrange(len(frame))] = rng.randrange(256)
        if rng.random() < 0.3:
            frame = frame[: rng.randrange(len(frame))]
        raw_exchange(server.address, bytes(frame))
    assert_alive(server.address)
    assert server.stats.frame_errors > 0


def test_shutdown_fails_waiting_requests(handlers: Handlers) -> None:
    srv = RemotingServer(handlers.table(), "127.0.0.1", 0, name="test-shutdown")
    srv.start()
    conn = RemotingConnection(srv.address)
    box: list[RemotingCommand | BaseException] = []
    done = threading.Event()

    def on_reply(reply: RemotingCommand | BaseException) -> None:
        box.append(reply)
        done.set()

    conn.invoke_async(RemotingCommand.request(HOLD), on_reply, 30)
    assert handlers.held_event.wait(5)
    srv.shutdown()
    assert done.wait(5)
    assert isinstance(box[0], TransportError)
    with pytest.raises(TransportError):
        conn.invoke(RemotingCommand.request(ECHO), 2)
    conn.close()


def test_acl(handlers: Handlers) -> None:
    srv = RemotingServer(handlers.table(), "127.0.0.1", 0, name="acl", guard=AclGuard({"ak": "sk"}))
    srv.start()
    conn = RemotingConnection(srv.address)
    try:
        ok = sign(RemotingCommand.request(ECHO, {"topic": "T", "queueId": 1}, b"b"), "ak", "sk")
        assert conn.invoke(ok, 5).code == 0
        assert conn.invoke(RemotingCommand.request(ECHO), 5).code == ResponseCode.NO_PERMISSION
        wrong_secret = sign(RemotingCommand.request(ECHO, {"topic": "T"}), "ak", "other")
        assert conn.invoke(wrong_secret, 5).code == ResponseCode.NO_PERMISSION
        unknown = sign(RemotingCommand.request(ECHO, {"topic": "T"}), "nobody", "sk")
        assert conn.invoke(unknown, 5).code == ResponseCode.NO_PERMISSION
        tampered = sign(RemotingCommand.request(ECHO, {"topic": "T"}, b"b"), "ak", "sk")
        tampered.body = b"c"
        assert conn.invoke(tampered, 5).code == ResponseCode.NO_PERMISSION
        assert srv.stats.acl_denied == 4
    finally:
        conn.close()
        srv.shutdown()


def test_signature_matches_a_frame_captured_from_the_cpp_client() -> None:
    fields = {"AccessKey": "", "OnsChannel": "ALIYUN", "topic": "ProbeTopic"}
    assert signature("", fields) == "r2KscApgmp4mTbXF2/WzOmrUVqw="


@pytest.mark.parametrize("inline", [True, False], ids=["reader-thread", "worker-pool"])
def test_pipelined_requests_in_one_write_are_all_answered(handlers: Handlers, inline: bool) -> None:
    """A client with 64 requests in flight (async sends) writes them back to back: each gets its reply."""
    srv = RemotingServer(handlers.table(), "127.0.0.1", 0, name="pipe", inline_codes={ECHO} if inline else ())
    srv.start()
    try:
        frames = [encode(RemotingCommand(code=ECHO, opaque=1000 + i, body=b"x" * 1024)) for i in range(64)]
        host, _, port = srv.address.rpartition(":")
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(b"".join(frames))
            dec = FrameDecoder()
            got: list[RemotingCommand] = []
            while len(got) < 64:
                got += dec.feed(s.recv(65536))
        assert sorted(c.opaque for c in got) == list(range(1000, 1064))
        assert all(c.is_response and c.body == b"x" * 1024 for c in got)
    finally:
        srv.shutdown()


def test_requests_before_a_bad_frame_are_answered_before_the_close(handlers: Handlers) -> None:
    """The server reads the good request and the garbage after it in one read: the good one is still
    answered, then the connection is closed for the bad frame."""
    srv = RemotingServer(handlers.table(), "127.0.0.1", 0, name="good-bad", inline_codes={ECHO})
    srv.start()
    try:
        good = encode(RemotingCommand(code=ECHO, opaque=77, ext_fields={"k": "v"}))
        got = FrameDecoder().feed(raw_exchange(srv.address, good + struct.pack(">ii", 10, 6) + b"{nope}"))
        assert [(c.opaque, c.ext_fields) for c in got] == [(77, {"k": "v"})]
        assert srv.stats.frame_errors == 1
    finally:
        srv.shutdown()


def test_a_short_timeout_after_a_long_one_still_fires(client: RemotingConnection) -> None:
    """The client's timer sleeps until the earliest deadline: a 30 s request (a held pull) must not keep a
    0.2 s request behind it from timing out."""
    client.invoke_async(RemotingCommand.request(SILENT), lambda r: None, 30)
    outcome: list[BaseException] = []
    finished = threading.Event()

    def short() -> None:
        try:
            client.invoke(RemotingCommand.request(SILENT), 0.2)
        except BaseException as exc:
            outcome.append(exc)
        finished.set()

    threading.Thread(target=short, daemon=True).start()
    assert finished.wait(15), "the 0.2 s request waited for the 30 s one's deadline"
    assert isinstance(outcome[0], RequestTimeoutError)


def test_an_answered_request_frees_what_its_callback_holds(client: RemotingConnection) -> None:
    """The timeout heap keeps an entry until the deadline passes or it is pruned; an answered request's
    entry must not keep its callback's objects (a send's Future, message, result) alive that long — at
    10,000 sends/s and a 3 s timeout that is 30,000 sends' worth of objects for every GC pass to walk."""

    class Payload:
        pass

    payload = Payload()
    ref = weakref.ref(payload)
    done = threading.Event()

    def answered(held: Payload, reply: RemotingCommand | BaseException) -> None:
        done.set()  # ``held`` stands for what a real callback keeps

    # the callback (the partial, which holds the payload) is referenced by nothing but the request
    client.invoke_async(RemotingCommand.request(ECHO), partial(answered, payload), 60)
    assert done.wait(5)
    del payload
    gc.collect()
    assert ref() is None
