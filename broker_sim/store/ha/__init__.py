"""Master/slave replication of the commit log (RocketMQ 4.9.8 ``HAService``, ``HAConnection``, ``HAClient``).

A slave connects to its master's HA port and keeps reporting how far its own commit log reaches; the
master streams commit-log bytes from there. The slave writes them at the same physical offsets and its
dispatcher builds consume queues and index from them exactly as for local appends. ``SYNC_MASTER`` makes a
send wait until a slave has reported the message's end offset (:meth:`HAService.wait_replicated`).
"""
