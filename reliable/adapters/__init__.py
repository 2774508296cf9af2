"""Broker adapters: the only code in `reliable` that knows a broker's client library.

Each module maps one broker to the two seams of the core: deliveries become
:class:`reliable.types.Envelope` values for a guarded handler, and a :class:`reliable.sender.Sender` carries
stubs to the broker for the producer and the resend sweeper. Import the module you need
(``reliable.adapters.rabbitmq``, ``reliable.adapters.broker_sim``); nothing is imported here, so a missing
optional client library (``pika``, ``rocketmq``) only matters to the adapter that needs it.
"""
