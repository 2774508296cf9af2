"""One SparkSession for the whole test session (local[2], 2 shuffle partitions, no UI) and dataset helpers."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import services
from tests.reconcile import dataset as D


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    if shutil.which("java") is None:
        services.unavailable("a Java runtime for PySpark")
    from reliable.reconcile.io import build_session

    session = build_session(
        "local[2]",
        app_name="reliable-reconcile-tests",
        driver_memory="1g",
        shuffle_partitions=2,
        # The test datasets have tens of rows: compiling generated code and re-planning adaptively cost far
        # more than they save (a run takes ~4x longer with them). Results are identical either way.
        extra={
            "spark.sql.codegen.wholeStage": "false",
            "spark.sql.codegen.factoryMode": "NO_CODEGEN",
            "spark.sql.adaptive.enabled": "false",
        },
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def planted() -> D.Dataset:
    return D.build()


def write_parquet(ds: D.Dataset, directory: Path) -> Path:
    """The dataset as the four Parquet files `reliable export` writes (same schemas)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from reliable.reconcile.export import SCHEMAS

    directory.mkdir(parents=True, exist_ok=True)
    for name, rows in (
        ("message_stub", ds.stubs),
        ("message_inbox", ds.inbox),
        ("message_log", ds.logs),
        ("consume_progress", ds.progress),
    ):
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMAS[name]), directory / f"{name}.parquet")
    return directory


def write_database(ds: D.Dataset, url: str) -> None:
    """Create the schema (as the application does) and insert the dataset with SQLAlchemy."""
    from sqlalchemy import delete, insert

    from reliable import Reliability
    from reliable.models import ConsumeProgress, MessageInbox, MessageLog, MessageStub

    rel = Reliability(url)
    try:
        rel.create_schema()
        with rel.session() as s:
            for model in (MessageLog, ConsumeProgress, MessageInbox, MessageStub):
                s.execute(delete(model))
            if ds.stubs:
                s.execute(insert(MessageStub), ds.stubs)
            if ds.inbox:
                s.execute(insert(MessageInbox), ds.inbox)
            if ds.logs:
                s.execute(insert(MessageLog), ds.logs)
            if ds.progress:
                s.execute(insert(ConsumeProgress), ds.progress)
    finally:
        rel.close()


def run_report(spark: Any, inputs: Any, out: Path, cfg: Any) -> Any:
    from reliable.reconcile.config import Thresholds
    from reliable.reconcile.runner import reconcile

    return reconcile(spark, inputs, out, cfg, Thresholds(), source="test")


@pytest.fixture(scope="session")
def parquet_report(spark: Any, planted: D.Dataset, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from reliable.reconcile import io
    from reliable.reconcile.config import ReconcileConfig

    cfg = ReconcileConfig(as_of=D.AS_OF)
    src = write_parquet(planted, tmp_path_factory.mktemp("parquet-in"))
    return run_report(spark, io.read_parquet(spark, src, cfg), tmp_path_factory.mktemp("parquet-out"), cfg)
