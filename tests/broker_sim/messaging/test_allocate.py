"""Rebalance strategies: table tests for 1 → 2 → 3 consumers over 8 queues, and properties of every
strategy."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_sim.client.allocate import (
    STRATEGIES,
    Allocator,
    average,
    average_by_circle,
    consistent_hash,
    machine_room,
    strategy,
)
from broker_sim.common.message import MessageQueue

Q8 = [MessageQueue("T", "broker-a", i) for i in range(8)]
CIDS = ["c1", "c2", "c3"]


def assignment(
    alloc: Allocator, queues: Sequence[MessageQueue], clients: Sequence[str]
) -> dict[str, list[int]]:
    return {c: [q.queue_id for q in alloc("G", c, queues, clients)] for c in clients}


@pytest.mark.parametrize(
    ("alloc", "expected"),
    [
        (
            average,
            [
                {"c1": [0, 1, 2, 3, 4, 5, 6, 7]},
                {"c1": [0, 1, 2, 3], "c2": [4, 5, 6, 7]},
                {"c1": [0, 1, 2], "c2": [3, 4, 5], "c3": [6, 7]},
            ],
        ),
        (
            average_by_circle,
            [
                {"c1": [0, 1, 2, 3, 4, 5, 6, 7]},
                {"c1": [0, 2, 4, 6], "c2": [1, 3, 5, 7]},
                {"c1": [0, 3, 6], "c2": [1, 4, 7], "c3": [2, 5]},
            ],
        ),
        (
            machine_room(),
            [
                {"c1": [0, 1, 2, 3, 4, 5, 6, 7]},
                {"c1": [0, 1, 2, 3], "c2": [4, 5, 6, 7]},
                {"c1": [0, 1, 6], "c2": [2, 3, 7], "c3": [4, 5]},
            ],
        ),
    ],
    ids=["average", "average_by_circle", "machine_room"],
)
def test_one_two_three_consumers_over_eight_queues(
    alloc: Allocator, expected: list[dict[str, list[int]]]
) -> None:
    for n, want in zip((1, 2, 3), expected, strict=True):
        assert assignment(alloc, Q8, CIDS[:n]) == want


def test_consistent_hash_one_two_three_consumers() -> None:
    alloc = consistent_hash()
    one = assignment(alloc, Q8, CIDS[:1])
    assert one == {"c1": list(range(8))}
    two = assignment(alloc, Q8, CIDS[:2])
    three = assignment(alloc, Q8, CIDS[:3])
    assert sorted(q for qs in two.values() for q in qs) == list(range(8))
    assert sorted(q for qs in three.values() for q in qs) == list(range(8))
    # The point of the ring: adding c3 only moves queues *to* c3; nothing moves between c1 and c2.
    for c in ("c1", "c2"):
        assert set(three[c]) <= set(two[c])


def test_machine_room_only_takes_queues_of_its_rooms() -> None:
    queues = [MessageQueue("T", f"{room}@broker-{room}", i) for room in ("hz", "sh") for i in range(4)]
    got = assignment(machine_room({"hz"}), queues, ["c1", "c2"])
    assert got == {"c1": [0, 1], "c2": [2, 3]}
    brokers = {
        q.broker_name for c in ("c1", "c2") for q in machine_room({"hz"})("G", c, queues, ["c1", "c2"])
    }
    assert brokers == {"hz@broker-hz"}


def test_unknown_client_gets_nothing_and_unknown_strategy_is_an_error() -> None:
    for alloc in STRATEGIES.values():
        assert alloc("G", "stranger", Q8, CIDS) == []
    with pytest.raises(ValueError, match="unknown allocation strategy"):
        strategy("nope")


queues_st = st.lists(
    st.builds(
        MessageQueue,
        st.sampled_from(["T", "U"]),
        st.sampled_from(["broker-a", "broker-b"]),
        st.integers(0, 15),
    ),
    min_size=0,
    max_size=40,
    unique=True,
)
clients_st = st.lists(
    st.text("abcdef0123456789@.", min_size=1, max_size=8), min_size=1, max_size=10, unique=True
)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
@settings(max_examples=60, deadline=None)
@given(queues=queues_st, clients=clients_st, seed=st.integers(0, 1000))
def test_every_queue_assigned_exactly_once_and_deterministically(
    name: str, queues: list[MessageQueue], clients: list[str], seed: int
) -> None:
    alloc = STRATEGIES[name]
    owners: dict[MessageQueue, list[str]] = {}
    for c in clients:
        for q in alloc("G", c, queues, clients):
            owners.setdefault(q, []).append(c)
    assert set(owners) == set(queues)
    assert all(len(v) == 1 for v in owners.values())
    # Deterministic whatever order the broker lists queues and client ids in.
    shuffled_q, shuffled_c = list(queues), list(clients)
    random.Random(seed).shuffle(shuffled_q)
    random.Random(seed + 1).shuffle(shuffled_c)
    for c in clients:
        assert alloc("G", c, shuffled_q, shuffled_c) == alloc("G", c, queues, clients)


@pytest.mark.parametrize("name", ["average", "average_by_circle", "machine_room"])
@settings(max_examples=60, deadline=None)
@given(queues=queues_st, clients=clients_st)
def test_balanced_strategies_differ_by_at_most_one(
    name: str, queues: list[MessageQueue], clients: list[str]
) -> None:
    sizes = [len(STRATEGIES[name]("G", c, queues, clients)) for c in clients]
    assert max(sizes) - min(sizes) <= 1
