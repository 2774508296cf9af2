"""The chaos faults as actions on a running demo: the :class:`~reliable.demo.chaos.ChaosTarget` a run's
:class:`~reliable.demo.chaos.ChaosController` fires its schedule through.

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

from sqlalchemy import text

from reliable.demo import parts
from reliable.demo.chaos import FaultUnsupported
from reliable.demo.consumers import ConsumerPool
from reliable.demo.environment import DemoEnvironment
from reliable.demo.progress import ProgressState
from reliable.demo.topology import Topology
from reliable.demo.transport import ChaosTransport, SendWatch


class ChaosActions:
    """The fault actions on the run's broker ``topology``, its ``consumers``, the database and Redis of
    ``env`` and the producer's ``send_transport``; each fired fault is counted in ``state``. ``stop`` is the
    run's stop event (a fault that waits returns early once the run stops)."""

    def __init__(
        self,
        topology: Topology,
        consumers: ConsumerPool,
        env: DemoEnvironment,
        send_transport: ChaosTransport,
        state: ProgressState,
        stop: threading.Event,
    ) -> None:
        self.topology = topology
        self.consumers = consumers
        self.env = env
        self.send_transport = send_transport
        self.state = state
        self._stop = stop

    def _note_fault(self, text_: str) -> str:
        self.state.faults_fired += 1
        self.state.last_fault = text_
        return text_

    def lose_send_acks(self, count: int) -> str:
        self.send_transport.lose_send_acks(count)
        return self._note_fault(f"next {count} send ACKs lost (messages stored, producer sees a timeout)")

    def kill_consumer(self, slot: int) -> str:
        # out of the pool first, so the settle loop never "replaces" it as a crash
        victim = self.consumers.take(slot)
        self.topology.kill_consumer(victim)
        replacement = self.consumers.add()
        return self._note_fault(f"SIGKILL {victim.name} mid-batch; started {replacement.name}")

    def crash_broker(self, down_ms: int) -> str:
        return self._note_fault(self.topology.crash_broker(down_ms))

    def lose_master(self, down_ms: int) -> str:
        return self._note_fault(self.topology.lose_master(down_ms, SendWatch(self.send_transport)))

    def lose_slave(self, down_ms: int) -> str:
        return self._note_fault(self.topology.lose_slave(down_ms, SendWatch(self.send_transport)))

    def lose_offset_commits(self, slot: int) -> str:
        victim = self.consumers.pick(slot)
        self.topology.lose_offset_commits(victim)
        return self._note_fault(f"{victim.name}: offset commits dropped for a few seconds")

    def rebalance_storm(self, joiners: int) -> str:
        added = [self.consumers.add() for _ in range(joiners)]
        self._stop.wait(1.5)  # long enough for the group to rebalance onto the newcomers
        for slot in added:
            self.consumers.retire(slot)
        return self._note_fault(f"{joiners} consumers joined and left: {', '.join(s.name for s in added)}")

    def redis_flushall(self) -> str:
        env = self.env
        if env.redis_url is None:
            raise FaultUnsupported("no Redis (database-only guard)")
        import redis as redis_lib

        client = redis_lib.Redis.from_url(env.redis_url)
        try:
            if env.redis_server is not None:
                client.flushall()
                return self._note_fault("FLUSHALL on the demo's Redis")
            prefix = env.settings["key_prefix"]
            deleted = 0
            for key in client.scan_iter(match=f"{prefix}:*", count=1000):
                deleted += int(client.delete(key))
            return self._note_fault(
                f"shared Redis: deleted this run's {deleted} keys (FLUSHALL of our prefix)"
            )
        finally:
            client.close()

    def redis_down(self, down_ms: int) -> str:
        env = self.env
        if env.redis_server is None:
            if env.redis_relay is None:
                raise FaultUnsupported("no Redis the demo can take away (rediss://, unix:// or none)")
            cut = env.redis_relay.outage(down_ms / 1000)
            return self._note_fault(
                f"Redis unreachable for {down_ms} ms ({cut} connections cut at the relay)"
            )
        env.redis_server.stop()
        parts.pause(down_ms / 1000)
        env.redis_server.start()
        return self._note_fault(f"redis-server stopped for {down_ms} ms, restarted (empty)")

    def drop_db_connections(self) -> str:
        rel = self.env.rel
        assert rel is not None
        if rel.dialect == "postgresql":
            with rel.engine.connect() as conn:
                n = conn.execute(
                    text(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                        "AND application_name = 'reliable-demo'"
                    )
                ).scalar_one()
                conn.commit()
            return self._note_fault(f"pg_terminate_backend on {n} consumer connections")
        live = self.consumers.live()
        for slot in live:
            self.topology.drop_db_connections(slot)
        return self._note_fault(f"every consumer's connection pool disposed ({len(live)} consumers)")
