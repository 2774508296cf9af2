"""RocketMQ 5.x gRPC front end of broker_sim: ``apache.rocketmq.v2.MessagingService`` over the same Broker.

The remoting front end (``broker_sim.remoting``) and this one share one :class:`~broker_sim.broker.Broker`
and so one store: a message sent through either is consumed through either. What 5.x adds on top of the
4.x model lives here and only here, talking to the Broker through its public methods:

* :mod:`.pop` — pop consumption: a received message is invisible for its invisible duration, then
  delivered again with ``delivery_attempt + 1``; ack / change-invisible-duration by receipt handle; DLQ after
  the group's max attempts; FIFO message groups delivered in order.
* :mod:`.receipt` — receipt handles (RocketMQ's space-separated layout, so adapters can read queue/offset).
* :mod:`.policy` — per-group retry policy and FIFO flag, sent to clients in the Telemetry settings.
* :mod:`.timer` — delay messages by delivery timestamp (any time, not only the 18 delay levels).
* :mod:`.telemetry` — the Telemetry stream: settings, and transaction check-back to 5.x producers.
* :mod:`.service` / :mod:`.server` — the gRPC servicer and its server.
"""
