"""The thin I/O around the transforms: the SparkSession, JDBC and Parquet readers, the writers.

JDBC reads are split into ``numPartitions`` range queries on a numeric or time column (``message_log.id``,
``message_stub.created_at``) whose bounds come from one ``min``/``max`` query, so a large table streams
through several connections in parallel instead of one cursor; ``message_inbox`` is read joined with the
window's stubs, ranged on the stub's ``created_at``. Parquet inputs are a directory holding
``message_stub.parquet``, ``message_inbox.parquet``, ``message_log.parquet`` and ``consume_progress.parquet``
(each a file or a directory of part files), as written by ``reliable export``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from reliable.reconcile import inputs as I
from reliable.reconcile.config import CLOCK_SKEW_S, ReconcileConfig, parquet_inputs
from reliable.reconcile.errors import InputError
from reliable.reconcile.jdbc import JdbcTarget, jdbc_target, range_bounds_sql, range_predicates, window_sql

#: JDBC drivers as installed by the Debian packages libpostgresql-jdbc-java / libmariadb-java
JDBC_JARS = ("/usr/share/java/postgresql.jar", "/usr/share/java/mariadb-java-client.jar")


#: the garbage collector of a local-mode driver (see :func:`build_session`)
LOCAL_DRIVER_GC = "-XX:+UseParallelGC"


def default_parallelism() -> int:
    return max(1, os.cpu_count() or 1)


def local_shuffle_partitions(cores: int) -> int:
    """Shuffle partitions for local mode: a few per core (AQE coalesces the small ones), never Spark's 200."""
    return max(4, 4 * cores)


def build_session(
    master: str | None = "local[*]",
    *,
    app_name: str = "reliable-reconcile",
    driver_memory: str | None = "4g",
    shuffle_partitions: int | None = None,
    ui: bool = False,
    extra: Mapping[str, str] | None = None,
) -> SparkSession:
    """A SparkSession with the settings the job relies on.

    UTC everywhere (session and JVM), so a MariaDB ``DATETIME`` holding naive UTC reads back as the right
    instant; the Debian JDBC jars on the class path when present; adaptive execution on; in local mode the
    parallel (throughput) garbage collector for the driver JVM. ``master=None``
    leaves the master to ``spark-submit``. Settings that need a new JVM (driver memory, jars) only apply when
    this call starts it.
    """
    builder = SparkSession.builder.appName(app_name)
    cores = default_parallelism()
    if master is not None:
        builder = builder.master(master)
        if master.startswith("local["):
            inner = master[len("local[") : -1]
            cores = cores if inner == "*" else max(1, int(inner.split(",")[0]))
    jars = [j for j in JDBC_JARS if Path(j).exists()]
    conf: dict[str, str] = {
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
        "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.adaptive.coalescePartitions.enabled": "true",
        "spark.ui.enabled": "true" if ui else "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.parquet.compression.codec": "zstd",
        # the job caches one narrow frame and scans it a few times: choosing and applying a compression
        # scheme per column batch (dictionary statistics in a boxed hash map) was ~10 % of its CPU profile
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
        # the three big inputs are hash-partitioned on message_id alone (by_message); a join or window on
        # (message_id, consumer_group) is then already co-partitioned and must not shuffle them again
        "spark.sql.requireAllClusterKeysForCoPartition": "false",
    }
    local = master is not None and master.startswith("local")
    if shuffle_partitions or local:  # on a cluster, the cluster's own setting (or --conf) stands
        conf["spark.sql.shuffle.partitions"] = str(shuffle_partitions or local_shuffle_partitions(cores))
    if local:
        # the driver is the only JVM and runs every task: the throughput collector has no concurrent GC
        # threads competing with the task threads on a small machine, nor G1's write barriers (the job
        # keeps one big cache and makes short-lived rows); docs/benchmarks/reconcile.md, fifth round. On a
        # cluster the executors' own JVM options stand
        conf["spark.driver.extraJavaOptions"] += " " + LOCAL_DRIVER_GC
        conf["spark.driver.bindAddress"] = "127.0.0.1"
        conf["spark.driver.host"] = "127.0.0.1"
    if jars:
        conf["spark.jars"] = ",".join(jars)
    if driver_memory:
        conf["spark.driver.memory"] = driver_memory
    conf.update(extra or {})
    for key, value in conf.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as exc:  # the launcher raises plain exceptions (no Java, bad memory string)
        from reliable.reconcile.errors import SparkUnavailableError

        raise SparkUnavailableError(f"cannot start Spark: {exc}") from exc
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def co_partitions(spark: SparkSession) -> int:
    """How many partitions the inputs are hashed into on ``message_id``.

    The session's shuffle partitions, but at least 8 per core: the hash joins build an in-memory table per
    partition that cannot spill (the per-pair delivery statistics of 20 M pairs in 8 partitions ran out of
    a 4 GiB driver's execution memory on a second job in the same JVM).
    """
    shuffle = int(spark.conf.get("spark.sql.shuffle.partitions") or "200")
    return max(shuffle, 8 * spark.sparkContext.defaultParallelism)


def by_message(df: DataFrame, partitions: int) -> DataFrame:
    """``df`` hash-partitioned on ``message_id``: the one shuffle each big input goes through.

    Logs, inbox and stubs partitioned the same way meet in the same task, so the delivery numbering (a
    window per (message, group)), inbox ⋈ stub and pairs ⋈ deliveries all run without another exchange.
    """
    return df.repartition(partitions, "message_id")


# --- inputs ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Inputs:
    """The tables as DataFrames (normalized), plus the unwindowed stub ids for the orphan check."""

    stubs: DataFrame
    inbox: DataFrame
    logs: DataFrame
    progress: DataFrame
    all_stub_ids: DataFrame


def read_parquet(spark: SparkSession, directory: str | Path, cfg: ReconcileConfig) -> Inputs:
    base = Path(directory)
    paths = parquet_inputs(base)
    try:
        stubs_all = I.normalize_stubs(spark.read.parquet(str(paths["message_stub"])))
        inbox = I.normalize_inbox(spark.read.parquet(str(paths["message_inbox"])))
        logs = I.normalize_logs(spark.read.parquet(str(paths["message_log"])))
        progress = I.normalize_progress(spark.read.parquet(str(paths["consume_progress"])))
    except Exception as exc:
        if type(exc).__name__ in ("AnalysisException", "AnalysisExceptionWrapper"):
            raise InputError(f"cannot read Parquet input {base}: {_first_line(exc)}") from exc
        raise
    return Inputs(
        stubs=I.window_stubs(stubs_all, cfg),
        inbox=inbox,
        logs=I.window_logs_for_messages(logs, cfg),
        progress=progress,
        all_stub_ids=stubs_all.select("message_id"),
    )


def read_jdbc(
    spark: SparkSession, db_url: str, cfg: ReconcileConfig, partitions: int | None = None
) -> Inputs:
    """Read the tables over JDBC, windowed in the database, in ``partitions`` parallel range queries."""
    target = jdbc_target(db_url)
    parts = partitions or max(2, spark.sparkContext.defaultParallelism)
    stub_cols = ", ".join(I.STUB_COLUMNS)
    log_cols = ", ".join(I.LOG_SOURCE_COLUMNS)
    log_since = cfg.since - dt.timedelta(seconds=CLOCK_SKEW_S) if cfg.since is not None else None
    stub_where = window_sql("created_at", cfg.since, cfg.until, target.dialect)
    inbox_cols = ", ".join(f"i.{c}" for c in I.INBOX_COLUMNS)
    inbox_sql = (
        f"SELECT {inbox_cols}, s.created_at AS stub_created_at FROM message_inbox i "
        f"JOIN message_stub s ON s.message_id = i.message_id "
        f"WHERE {window_sql('s.created_at', cfg.since, cfg.until, target.dialect)}"
    )
    log_where = window_sql("received_at", log_since, None, target.dialect)
    try:
        stubs = _read_ranged(
            spark, target, f"SELECT {stub_cols} FROM message_stub WHERE {stub_where}", "created_at", parts
        )
        inbox = _read_ranged(spark, target, inbox_sql, "stub_created_at", parts)
        logs = _read_ranged(
            spark, target, f"SELECT {log_cols} FROM message_log WHERE {log_where}", "id", parts
        )
        progress = _read_query(spark, target, f"SELECT {', '.join(I.PROGRESS_COLUMNS)} FROM consume_progress")
        all_ids = (
            _read_ranged(
                spark, target, "SELECT message_id, created_at FROM message_stub", "created_at", parts
            )
            if cfg.windowed
            else None
        )
    except InputError:
        raise
    except Exception as exc:
        raise InputError(f"cannot read {target.url}: {_first_line(exc)}") from exc
    if target.dialect == "mysql":
        stubs, inbox, logs = _utc(stubs), _utc(inbox), _utc(logs)
    n_stubs = I.normalize_stubs(stubs)
    return Inputs(
        stubs=n_stubs,
        inbox=I.normalize_inbox(inbox),
        logs=I.normalize_logs(logs),
        progress=I.normalize_progress(progress),
        all_stub_ids=all_ids.select("message_id") if all_ids is not None else n_stubs.select("message_id"),
    )


def _utc(df: DataFrame) -> DataFrame:
    """MariaDB DATETIMEs hold naive UTC (models.UTCDateTime): read as NTZ, cast in the UTC session zone."""
    from pyspark.sql import functions as F

    for name, kind in df.dtypes:
        if kind == "timestamp_ntz":
            df = df.withColumn(name, F.col(name).cast("timestamp"))
    return df


def _reader(spark: SparkSession, target: JdbcTarget) -> Any:
    r = spark.read.format("jdbc").option("url", target.url).option("driver", target.driver)
    r = r.option("fetchsize", "10000")
    if target.dialect == "mysql":
        r = r.option("preferTimestampNTZ", "true")
    for k, v in target.properties.items():
        r = r.option(k, v)
    return r


def _read_query(spark: SparkSession, target: JdbcTarget, sql: str) -> DataFrame:
    return _reader(spark, target).option("dbtable", f"({sql}) q").load()  # type: ignore[no-any-return]


def _read_ranged(spark: SparkSession, target: JdbcTarget, sql: str, column: str, parts: int) -> DataFrame:
    """``parts`` range queries on ``column``, split between its min and max (one query finds them).

    The ranges are given to Spark as explicit predicates rather than ``partitionColumn``/``lowerBound``:
    that way a time column is bounded with literals in the database's own terms (``timestamptz`` on
    PostgreSQL, naive UTC ``DATETIME`` on MariaDB, which Spark cannot use as a partition column), and the
    first and last ranges are open-ended so no row is ever left out.
    """
    lo_expr, hi_expr = range_bounds_sql(column, target.dialect)
    bounds = _read_query(spark, target, f"SELECT {lo_expr} AS lo, {hi_expr} AS hi FROM ({sql}) b").first()
    if bounds is None or bounds["lo"] is None or parts < 2:
        return _read_query(spark, target, sql)
    predicates = range_predicates(column, bounds["lo"], bounds["hi"], parts, target.dialect)
    if len(predicates) < 2:
        return _read_query(spark, target, sql)
    props = {"driver": target.driver, **target.properties}
    reader = spark.read.option("fetchsize", "10000")
    if target.dialect == "mysql":
        reader = reader.option("preferTimestampNTZ", "true")
    return reader.jdbc(target.url, f"({sql}) q", predicates=predicates, properties=props)


def _first_line(exc: BaseException) -> str:
    """What went wrong, in one line: for a Java exception (Py4J) its ``toString()``, plus its root cause's
    when that says more (``PSQLException: Connection to h:1 refused … (java.net.ConnectException: …)``).

    A ``Py4JJavaError``'s own text starts with ``An error occurred while calling o66.load.``, which hides the
    reason (connection refused, no such table) in the Java stack trace that follows.
    """
    java = getattr(exc, "java_exception", None)
    if java is not None:
        try:
            text = _line(str(java.toString()))
            root, depth = java, 0
            while root.getCause() is not None and depth < 20:
                root, depth = root.getCause(), depth + 1
            reason = _line(str(root.getMessage() or ""))
            if depth and reason not in text:
                text = f"{text} ({_line(str(root.toString()))})"
            if text:
                return text
        except Exception:  # the JVM is gone: fall back to the Python text
            pass
    return _line(str(exc)) or type(exc).__name__


def _line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0].strip() if lines else ""


# --- outputs -----------------------------------------------------------------------------------------------


def write_detail(df: DataFrame, out_dir: Path, name: str, files: int = 1) -> None:
    """One Parquet detail table as ``out_dir/name.parquet`` (a directory of ``files`` part files).

    ``repartition``, not ``coalesce``: a coalesce to one file would also run the stage that computes ``df``
    (a cache scan, a window) in one task, on one core; a shuffle of the few result rows is cheaper.
    """
    df.repartition(files).write.mode("overwrite").parquet(str(out_dir / f"{name}.parquet"))


def write_json(summary: Mapping[str, Any], path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(summary, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    tmp.replace(path)
