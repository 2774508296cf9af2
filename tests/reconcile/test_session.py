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
