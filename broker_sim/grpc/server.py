"""The gRPC server of the 5.x front end, attached to a running :class:`~broker_sim.broker.Broker`.

``GrpcFrontEnd(broker, port=0).start()`` binds (port 0: any free port, read back from ``.port``), builds the
pop, timer and telemetry services and serves ``apache.rocketmq.v2.MessagingService`` until ``stop()``.
``broker-sim serve --grpc-port N`` does this next to the remoting servers, over the same Broker; given the
name servers (``namesrv_addrs``) it answers QueryOffset for the cluster's other broker groups too, and its
QueryRoute / QueryAssignment list every group's queues at that group's own front end (:mod:`.route`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import grpc

from broker_sim.common.net import announce_host as announce_host_for
from broker_sim.grpc.peers import PeerGroups
from broker_sim.grpc.policy import GroupPolicies, GroupPolicy
from broker_sim.grpc.pop import PopService
from broker_sim.grpc.protocol import load_protocol
from broker_sim.grpc.service import MessagingService
from broker_sim.grpc.telemetry import TelemetryHub
from broker_sim.grpc.timer import TimerService

if TYPE_CHECKING:
    from broker_sim.broker.broker import Broker

log = logging.getLogger("broker_sim.grpc.server")

POLICY_FILE = "grpcGroupPolicy.json"
#: push-consumer renewal, as the 5.x proxy does it: every second look for deliveries expiring within 10 s and
#: give them another 60 s, for at most 3 h after they were received
RENEW_EVERY_MS, RENEW_AHEAD_MS, RENEW_SLICE_MS, RENEW_MAX_MS = 1000, 10_000, 60_000, 3 * 3600_000


class GrpcFrontEnd:
    def __init__(
        self,
        broker: Broker,
        host: str = "127.0.0.1",
        port: int = 8081,
        *,
        workers: int = 64,
        long_polling_s: int = 20,
        groups: dict[str, GroupPolicy] | None = None,
        namesrv_addrs: Sequence[str] = (),
        announce_host: str | None = None,
    ) -> None:
        self.pb = load_protocol()
        self.broker = broker
        self.host = host
        #: the host 5.x clients are told to connect to (``broker_sim.common.net``)
        self.announce_host = announce_host_for(host, announce_host)
        self.requested_port = port
        self.workers = workers
        self.policies = GroupPolicies(broker.store.config_dir / POLICY_FILE)
        self._initial_groups = dict(groups or {})
        self.pop = PopService(broker, self.policies)
        self.timer = TimerService(broker)
        self.hub = TelemetryHub(self.pb, broker, self.policies, long_polling_s)
        #: QueryOffset of another broker group's queue is answered through the cluster's name servers
        self.peers = PeerGroups(namesrv_addrs) if namesrv_addrs else None
        self.service = MessagingService(self.pb, broker, self.pop, self.timer, self.hub, self.peers)
        self._server: grpc.Server | None = None
        self.port = 0

    @property
    def address(self) -> str:
        return f"{self.announce_host}:{self.port}"

    def start(self) -> GrpcFrontEnd:
        self.policies.load()
        for name, policy in self._initial_groups.items():
            self.policies.set(name, policy)
        self.pop.start()
        self.timer.start()
        self.broker.scheduler.schedule_periodic(
            RENEW_EVERY_MS, RENEW_EVERY_MS, self._renew, name="grpc-renew"
        )
        server = grpc.server(
            ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="grpc"),
            options=[("grpc.so_reuseport", 0)],
        )
        self.pb.grpc.add_MessagingServiceServicer_to_server(self.service, server)
        self.port = server.add_insecure_port(f"{self.host}:{self.requested_port}")
        if self.port == 0:
            raise OSError(f"cannot bind the gRPC port {self.host}:{self.requested_port}")
        server.start()
        self._server = server
        # announced in the broker's runtime info: other groups' front ends route 5.x clients here
        self.broker.client_admin.grpc_endpoint = self.address
        log.info("gRPC MessagingService on %s", self.address)
        return self

    def _renew(self) -> None:
        self.pop.renew(self.hub.is_open, RENEW_AHEAD_MS, RENEW_SLICE_MS, RENEW_MAX_MS)

    def stop(self, grace_s: float = 1.0) -> None:
        self.broker.client_admin.grpc_endpoint = ""
        self.service.stop()
        self.pop.wake()
        if self._server is not None:
            self._server.stop(grace_s).wait()
            self._server = None
        if self.peers is not None:
            self.peers.close()
