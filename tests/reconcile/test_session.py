"""The session the job builds: what its JVM is started with in local mode."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.mark.spark
def test_a_local_driver_runs_in_utc_with_the_throughput_collector(spark: Any) -> None:
    jvm = spark.sparkContext._jvm
    management = jvm.java.lang.management.ManagementFactory
    collectors = {bean.getName() for bean in management.getGarbageCollectorMXBeans()}
    # the parallel collector's two generations; G1 (the JVM's default) would show "G1 Young Generation"
    assert collectors == {"PS Scavenge", "PS MarkSweep"}
    assert jvm.java.util.TimeZone.getDefault().getID() == "UTC"


@pytest.mark.spark
def test_a_failed_jdbc_read_says_why_in_one_line(spark: Any) -> None:
    """Py4J's own text is ``An error occurred while calling o66.load.``: the line must say the Java reason."""
    from reliable.reconcile import io
    from reliable.reconcile.config import ReconcileConfig
    from reliable.reconcile.errors import InputError

    with pytest.raises(InputError) as caught:
        io.read_jdbc(spark, "postgresql://reader@127.0.0.1:1/app", ReconcileConfig(), partitions=2)
    message = str(caught.value)
    assert "\n" not in message and "An error occurred while calling" not in message, message
    assert "PSQLException: Connection to 127.0.0.1:1 refused" in message, message
