"""Consistent-hash rebalancing identical to Java's ``AllocateMessageQueueConsistentHash`` over
``ConsistentHashRouter`` (4.9.8), so a group mixing broker_sim and Java consumers splits its queues exactly
once. The expected owners were computed by ``java/ConsistentHashOwners.java`` (a TreeMap ring, MD5 first four
bytes big-endian, MessageQueue.toString() keys), which the slow test also runs live."""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_sim import MessageQueue
from broker_sim.client.allocate import consistent_hash, java_md5_hash, java_queue_key

JAVA_SOURCE = Path(__file__).parent / "java" / "ConsistentHashOwners.java"
BROKERS = ("broker-a", "broker-b")

# client ids → owner index (in sorted client order) of T@broker-a:0..7 then T@broker-b:0..7, from Java.
JAVA_TABLE = {
    ("127.0.0.1@c0",): "0000000000000000",
    ("127.0.0.1@c0", "127.0.0.1@c1"): "1011110010111100",
    ("10.0.0.5@1234", "10.0.0.6@99", "10.0.0.7@7"): "1200002012200200",
    ("java-a", "java-b", "py-c", "py-d", "py-e"): "1403244342341104",
}


def _queues(topic: str = "T", per_broker: int = 8) -> list[MessageQueue]:
    return [MessageQueue(topic, b, q) for b in BROKERS for q in range(per_broker)]


def _owners(cids: list[str], mqs: list[MessageQueue], virtual_nodes: int = 10) -> dict[MessageQueue, str]:
    allocate = consistent_hash(virtual_nodes)
    owners: dict[MessageQueue, str] = {}
    for cid in cids:
        for mq in allocate("G", cid, mqs, cids):
            assert mq not in owners, f"{mq} allocated twice"
            owners[mq] = cid
    return owners


def test_hash_is_java_md5_first_four_bytes_big_endian() -> None:
    """ConsistentHashRouter.MD5Hash: value printed by Java for the first queue's MessageQueue.toString()."""
    key = java_queue_key(MessageQueue("T", "broker-a", 0))
    assert key == "MessageQueue [topic=T, brokerName=broker-a, queueId=0]"
    assert java_md5_hash(key) == 1630488180


@pytest.mark.parametrize("cids", list(JAVA_TABLE))
def test_owners_match_the_java_table(cids: tuple[str, ...]) -> None:
    """AllocateMessageQueueConsistentHash (4.9.8): every client computes the same owner as Java does."""
    mqs = _queues()
    owners = _owners(list(cids), mqs)
    ranked = sorted(cids)
    assert "".join(str(ranked.index(owners[mq])) for mq in mqs) == JAVA_TABLE[cids]


client_ids = st.lists(
    st.from_regex(r"(10\.0\.0\.[0-9]{1,3}@[0-9]{1,5}|py-[a-z]{1,6}|java-[a-z]{1,6})", fullmatch=True),
    min_size=1,
    max_size=8,
    unique=True,
)


@settings(deadline=None, max_examples=150)
@given(client_ids, st.integers(1, 16), st.integers(1, 12))
def test_allocation_partitions_the_queues(cids: list[str], per_broker: int, virtual_nodes: int) -> None:
    """Every queue has exactly one owner for any mix of client ids, in any order the broker lists them."""
    mqs = _queues(per_broker=per_broker)
    shuffled = cids[:]
    random.Random(len(cids)).shuffle(shuffled)
    owners = _owners(shuffled, mqs, virtual_nodes)
    assert set(owners) == set(mqs)
    assert set(owners.values()) <= set(cids)


@pytest.mark.slow
def test_owners_match_java_live(tmp_path: Path) -> None:
    """The same ring run by Java 17 on random groups (mixed ids, two brokers, 1–16 queues each)."""
    java = shutil.which("java")
    assert java is not None, "Java 17 is part of the test machine (DESIGN §7)"
    rnd = random.Random(98)
    cases = []
    for n in range(40):
        cids = sorted(
            {
                f"10.0.{rnd.randrange(4)}.{rnd.randrange(256)}@{rnd.randrange(99999)}"
                for _ in range(rnd.randint(1, 7))
            }
            | ({f"java-{n}"} if n % 2 else set())
        )
        cases.append((f"Topic{n % 3}", rnd.randint(1, 16), cids))
    lines = "".join(f"{t};{','.join(BROKERS)};{q};{','.join(c)}\n" for t, q, c in cases)
    out = subprocess.run(
        [java, str(JAVA_SOURCE)], input=lines, capture_output=True, text=True, check=True, timeout=120
    ).stdout.splitlines()
    assert len(out) == len(cases)
    for (topic, per_broker, cids), java_line in zip(cases, out, strict=True):
        mqs = _queues(topic, per_broker)
        owners = _owners(cids, mqs)
        assert [owners[mq] for mq in mqs] == java_line.split(" ")
