"""The name server: a registry of broker groups fed by broker registrations (``route_info``) and its
request handlers (``processor``). The registry itself imports nothing of the network layer."""
