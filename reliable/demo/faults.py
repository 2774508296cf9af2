"""The chaos faults as actions on a running demo: the :class:`~reliable.demo.chaos.ChaosTarget` side of
:class:`~reliable.demo.runner.DemoRunner`.

Each action injects one fault into the live pipeline and returns a one-line description for the summary.
What each one does, and why it is a faithful version of the production failure:

* lost send ACKs — the producer's transport drops the replies of the next N sends after the broker stored
  them; the broker_sim producer retries (a second copy at a new offset) and may finally report failure, so
  the stub stays PENDING for the sweeper;
* consumer SIGKILL — mid-batch: a held Redis lease, an open transaction, offsets not persisted;
* broker power cut — unflushed commit-log data discarded, process killed, restarted on the same store;
* master / slave loss (a cluster) — one group's master or slave loses power for seconds
  (:mod:`reliable.demo.cluster`);
* lost offset commits — one consumer's offset commits vanish for a few seconds;
* rebalance storm — consumers join the group and leave again, moving queues before offsets are persisted;
* Redis FLUSHALL / Redis down — every lease and done marker vanishes; Redis unreachable for seconds;
* database connection drop — ``pg_terminate_backend`` of every consumer connection on PostgreSQL, every
  pooled connection disposed elsewhere.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from sqlalchemy import text

from reliable.demo import parts
from reliable.demo.chaos import FaultUnsupported
from reliable.demo.netproxy import TcpRelay
from reliable.demo.progress import ProgressState
from reliable.demo.services import RedisServer
from reliable.demo.topology import ConsumerSlot, Topology
from reliable.demo.transport import ChaosTransport, SendWatch
from reliable.facade import Reliability


class ChaosActions:
    """Mixin: the fault actions. The runner provides the attributes declared here."""

    if TYPE_CHECKING:
        topology: Topology | None
        rel: Reliability | None
        slots: list[ConsumerSlot]
        _slot_lock: threading.Lock
        _stop: threading.Event
        state: ProgressState
        send_transport: ChaosTransport | None
        redis_server: RedisServer | None
        redis_relay: TcpRelay | None
        redis_url: str | None
        settings: dict[str, Any]

        def _add_consumer(self) -> ConsumerSlot: ...

    def _pick(self, slot: int) -> ConsumerSlot:
        with self._slot_lock:
            return self._pick_locked(slot)

    def _pick_locked(self, slot: int) -> ConsumerSlot:
        live = [s for s in self.slots if s.alive()]
        if not live:
            raise FaultUnsupported("no live consumer")
        return live[slot % len(live)]

    def _note_fault(self, text_: str) -> str:
        self.state.faults_fired += 1
        self.state.last_fault = text_
        return text_

    def lose_send_acks(self, count: int) -> str:
        assert self.send_transport is not None
        self.send_transport.lose_send_acks(count)
        return self._note_fault(f"next {count} send ACKs lost (messages stored, producer sees a timeout)")

    def kill_consumer(self, slot: int) -> str:
        assert self.topology is not None
        with self._slot_lock:  # out of the list first, so the settle loop never "replaces" it as a crash
            victim = self._pick_locked(slot)
            self.slots.remove(victim)
        self.topology.kill_consumer(victim)
        replacement = self._add_consumer()
        return self._note_fault(f"SIGKILL {victim.name} mid-batch; started {replacement.name}")

    def crash_broker(self, down_ms: int) -> str:
        assert self.topology is not None
        return self._note_fault(self.topology.crash_broker(down_ms))

    def lose_master(self, down_ms: int) -> str:
        assert self.topology is not None and self.send_transport is not None
        return self._note_fault(self.topology.lose_master(down_ms, SendWatch(self.send_transport)))

    def lose_slave(self, down_ms: int) -> str:
        assert self.topology is not None and self.send_transport is not None
        return self._note_fault(self.topology.lose_slave(down_ms, SendWatch(self.send_transport)))

    def lose_offset_commits(self, slot: int) -> str:
        assert self.topology is not None
        victim = self._pick(slot)
        self.topology.lose_offset_commits(victim)
        return self._note_fault(f"{victim.name}: offset commits dropped for a few seconds")

    def rebalance_storm(self, joiners: int) -> str:
        assert self.topology is not None
        added = [self._add_consumer() for _ in range(joiners)]
        self._stop.wait(1.5)  # long enough for the group to rebalance onto the newcomers
        for slot in added:
            with self._slot_lock:
                self.slots.remove(slot)
                self.state.consumers = len(self.slots)
            self.topology.stop_consumer(slot)
        return self._note_fault(f"{joiners} consumers joined and left: {', '.join(s.name for s in added)}")

    def redis_flushall(self) -> str:
        if self.redis_url is None:
            raise FaultUnsupported("no Redis (database-only guard)")
        import redis as redis_lib

        client = redis_lib.Redis.from_url(self.redis_url)
        try:
            if self.redis_server is not None:
                client.flushall()
                return self._note_fault("FLUSHALL on the demo's Redis")
            prefix = self.settings["key_prefix"]
            deleted = 0
            for key in client.scan_iter(match=f"{prefix}:*", count=1000):
                deleted += int(client.delete(key))
            return self._note_fault(
                f"shared Redis: deleted this run's {deleted} keys (FLUSHALL of our prefix)"
            )
        finally:
            client.close()

    def redis_down(self, down_ms: int) -> str:
        if self.redis_server is None:
            if self.redis_relay is None:
                raise FaultUnsupported("no Redis the demo can take away (rediss://, unix:// or none)")
            cut = self.redis_relay.outage(down_ms / 1000)
            return self._note_fault(
                f"Redis unreachable for {down_ms} ms ({cut} connections cut at the relay)"
            )
        self.redis_server.stop()
        parts.pause(down_ms / 1000)
        self.redis_server.start()
        return self._note_fault(f"redis-server stopped for {down_ms} ms, restarted (empty)")

    def drop_db_connections(self) -> str:
        assert self.rel is not None and self.topology is not None
        if self.rel.dialect == "postgresql":
            with self.rel.engine.connect() as conn:
                n = conn.execute(
                    text(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                        "AND application_name = 'reliable-demo'"
                    )
                ).scalar_one()
                conn.commit()
            return self._note_fault(f"pg_terminate_backend on {n} consumer connections")
        with self._slot_lock:
            live = [s for s in self.slots if s.alive()]
        for slot in live:
            self.topology.drop_db_connections(slot)
        return self._note_fault(f"every consumer's connection pool disposed ({len(live)} consumers)")
