"""Rebalance allocation strategies as pure functions.

``allocate(group, client_id, queues, clients)`` returns the queues ``client_id`` should consume. Every client
of a group runs the same function on the same (sorted) inputs, so together they split the queues without
talking to each other; the property every strategy keeps is that the union over all clients covers each
eligible queue exactly once. Inputs are sorted here (RocketMQ sorts in the caller), so the result never
depends
on the order a broker returned ids in. A client id not in ``clients`` gets nothing (it has not been seen by
the broker yet; it will get its share at the next rebalance).
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Iterable, Sequence

from broker_sim.common.message import MessageQueue

Allocator = Callable[[str, str, Sequence[MessageQueue], Sequence[str]], list[MessageQueue]]


def _prepare(
    client_id: str, queues: Iterable[MessageQueue], clients: Iterable[str]
) -> tuple[list[MessageQueue], list[str], int]:
    mqs = sorted(set(queues))
    cids = sorted(set(clients))
    index = cids.index(client_id) if client_id in cids else -1
    return mqs, cids, index


def average(
    group: str, client_id: str, queues: Sequence[MessageQueue], clients: Sequence[str]
) -> list[MessageQueue]:
    """Contiguous blocks; the first ``len(queues) % len(clients)`` clients get one extra (RocketMQ
    default)."""
    mqs, cids, index = _prepare(client_id, queues, clients)
    if index < 0 or not mqs:
        return []
    n, c = len(mqs), len(cids)
    mod = n % c
    size = 1 if n <= c else (n // c + 1 if mod > 0 and index < mod else n // c)
    start = index * size if mod > 0 and index < mod else index * size + mod
    count = min(size, n - start)
    return [mqs[(start + i) % n] for i in range(max(0, count))]


def average_by_circle(
    group: str, client_id: str, queues: Sequence[MessageQueue], clients: Sequence[str]
) -> list[MessageQueue]:
    """Deal queues round-robin: client k gets queues k, k + n, k + 2n, ..."""
    mqs, cids, index = _prepare(client_id, queues, clients)
    if index < 0:
        return []
    return mqs[index :: len(cids)]


def java_md5_hash(key: str) -> int:
    """``ConsistentHashRouter.MD5Hash.hash``: the first 4 bytes of MD5(key) as an unsigned big-endian number
    (0 … 2³²−1)."""
    return int.from_bytes(hashlib.md5(key.encode("utf-8")).digest()[:4], "big")


def java_queue_key(mq: MessageQueue) -> str:
    """Java's ``MessageQueue.toString()``, the string the consistent-hash strategy hashes for a queue."""
    return f"MessageQueue [topic={mq.topic}, brokerName={mq.broker_name}, queueId={mq.queue_id}]"


def consistent_hash(virtual_nodes: int = 10) -> Allocator:
    """RocketMQ's ``AllocateMessageQueueConsistentHash`` over ``ConsistentHashRouter``, hashed the same way,
    so broker_sim and Java consumers of one group agree on every queue.

    The ring holds ``virtual_nodes`` points per client, at ``java_md5_hash(f"{client_id}-{i}")``, inserted in
    sorted client order (a later point replaces an earlier one on a hash collision, as ``TreeMap.put``
    does). A queue belongs to the first point at or after ``java_md5_hash(java_queue_key(queue))``, wrapping
    to the ring's first point. Adding or removing a client moves only the queues next to its points.
    """
    if virtual_nodes < 0:
        raise ValueError(f"illegal virtual_nodes: {virtual_nodes} (must be >= 0)")

    def allocate(
        group: str, client_id: str, queues: Sequence[MessageQueue], clients: Sequence[str]
    ) -> list[MessageQueue]:
        mqs, cids, index = _prepare(client_id, queues, clients)
        if index < 0:
            return []
        ring: dict[int, str] = {}
        for cid in cids:
            for i in range(virtual_nodes):
                ring[java_md5_hash(f"{cid}-{i}")] = cid
        if not ring:
            return []
        points = sorted(ring)
        out = []
        for mq in mqs:
            pos = bisect.bisect_left(points, java_md5_hash(java_queue_key(mq)))
            if ring[points[pos % len(points)]] == client_id:
                out.append(mq)
        return out

    return allocate


def machine_room(consumer_idcs: Iterable[str] | None = None) -> Allocator:
    """Only queues on brokers in the consumers' machine rooms (broker name ``"<room>@<broker>"``), averaged.

    ``consumer_idcs`` None means every room. Queues of other rooms are deliberately left to consumers there.
    """
    rooms = None if consumer_idcs is None else frozenset(consumer_idcs)

    def allocate(
        group: str, client_id: str, queues: Sequence[MessageQueue], clients: Sequence[str]
    ) -> list[MessageQueue]:
        mqs, cids, index = _prepare(client_id, queues, clients)
        if index < 0:
            return []
        eligible = [mq for mq in mqs if rooms is None or mq.broker_name.split("@", 1)[0] in rooms]
        per, rem = divmod(len(eligible), len(cids))
        out = eligible[index * per : index * per + per]
        if index < rem:
            out.append(eligible[per * len(cids) + index])
        return out

    return allocate


STRATEGIES: dict[str, Allocator] = {
    "average": average,
    "average_by_circle": average_by_circle,
    "consistent_hash": consistent_hash(),
    "machine_room": machine_room(),
}


def strategy(name: str) -> Allocator:
    """The allocator called ``name`` (one of :data:`STRATEGIES`); ValueError for an unknown name."""
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(
            f"unknown allocation strategy {name!r}; known: {', '.join(sorted(STRATEGIES))}"
        ) from None
