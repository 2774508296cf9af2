"""Fixtures: clusters of name servers and brokers inside the test process (shared with the sweeper tests,
see :mod:`tests.clusters`)."""

from tests.clusters import Cluster, ClusterFactory, cluster

__all__ = ["Cluster", "ClusterFactory", "cluster"]
