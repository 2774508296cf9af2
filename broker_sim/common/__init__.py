"""The floor that broker and client both stand on, as RocketMQ's ``common`` module is: the message model
(:mod:`.message`), request/response types (:mod:`.requests`), names and retry arithmetic (:mod:`.constants`),
errors (:mod:`.errors`), store-record conversion, atomic JSON files and the timer scheduler.

Nothing here imports :mod:`broker_sim.broker`, :mod:`broker_sim.client` or :mod:`broker_sim.remoting`, so the
broker and the clients depend on this package instead of on each other.
"""
