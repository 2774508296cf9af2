"""Export the four tables the report reads to Parquet with pyarrow (the Spark job's input for SQLite users).

Rows stream from the database in chunks (server-side cursor where the driver has one) and each chunk becomes
one Parquet row group, so memory stays flat whatever the table size. The message bodies (``content``) are
left out unless asked for: the reconciliation never reads them and they dominate the size.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy import Engine, Table, select

from reliable.models import ConsumeProgress, MessageInbox, MessageLog, MessageStub
from reliable.reconcile.errors import InputError

TS = pa.timestamp("us", tz="UTC")

#: Parquet types of the contract columns; ``content`` is exported only with ``with_content``.
SCHEMAS: dict[str, pa.Schema] = {
    "message_stub": pa.schema(
        [
            ("message_id", pa.string()),
            ("topic", pa.string()),
            ("tags", pa.string()),
            ("content", pa.binary()),
            ("payload_hash", pa.string()),
            ("status", pa.string()),
            ("send_count", pa.int32()),
            ("queue_id", pa.int32()),
            ("queue_offset", pa.int64()),
            ("resend_at", TS),
            ("created_at", TS),
            ("updated_at", TS),
            ("last_sent_at", TS),
            ("confirmed_at", TS),
            ("last_error", pa.string()),
            ("broker_name", pa.string()),
        ]
    ),
    "message_inbox": pa.schema(
        [
            ("consumer_group", pa.string()),
            ("message_id", pa.string()),
            ("status", pa.string()),
            ("attempts", pa.int32()),
            ("payload_hash", pa.string()),
            ("first_received_at", TS),
            ("confirmed_at", TS),
            ("resend_count", pa.int32()),
            ("resend_at", TS),
            ("queue_id", pa.int32()),
            ("queue_offset", pa.int64()),
            ("last_error", pa.string()),
            ("created_at", TS),
            ("updated_at", TS),
            ("broker_name", pa.string()),
            ("resend_topic", pa.string()),
        ]
    ),
    "message_log": pa.schema(
        [
            ("id", pa.int64()),
            ("message_id", pa.string()),
            ("consumer_group", pa.string()),
            ("topic", pa.string()),
            ("original_topic", pa.string()),
            ("queue_id", pa.int32()),
            ("queue_offset", pa.int64()),
            ("reconsume_times", pa.int32()),
            ("received_at", TS),
            ("outcome", pa.string()),
            ("worker", pa.string()),
            ("reason", pa.string()),
            ("broker_name", pa.string()),
        ]
    ),
    "consume_progress": pa.schema(
        [
            ("consumer_group", pa.string()),
            ("topic", pa.string()),
            ("queue_id", pa.int32()),
            ("max_offset", pa.int64()),
            ("min_offset", pa.int64()),
            ("created_at", TS),
            ("updated_at", TS),
            ("received_count", pa.int64()),
            ("broker_name", pa.string()),
        ]
    ),
}
_TABLES: dict[str, Table] = {
    "message_stub": MessageStub.__table__,  # type: ignore[dict-item]
    "message_inbox": MessageInbox.__table__,  # type: ignore[dict-item]
    "message_log": MessageLog.__table__,  # type: ignore[dict-item]
    "consume_progress": ConsumeProgress.__table__,  # type: ignore[dict-item]
}
DEFAULT_CHUNK_ROWS = 50_000


@dataclass(frozen=True)
class ExportResult:
    path: Path
    rows: dict[str, int]


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


def _batches(engine: Engine, name: str, schema: pa.Schema, chunk_rows: int) -> Iterator[pa.RecordBatch]:
    table = _TABLES[name]
    cols = [table.c[f.name] for f in schema]
    order = list(table.primary_key.columns)
    with engine.connect() as conn:
        result = conn.execution_options(stream_results=True, yield_per=chunk_rows).execute(
            select(*cols).order_by(*order)
        )
        for chunk in result.partitions(chunk_rows):
            columns = list(zip(*chunk, strict=True)) if chunk else [() for _ in cols]
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array([_plain(v) for v in col], type=f.type)
                    for col, f in zip(columns, schema, strict=True)
                ],
                schema=schema,
            )


def export_tables(
    engine: Engine,
    directory: Path,
    *,
    with_content: bool = False,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    on_chunk: Callable[[str, int], None] | None = None,
    tables: Sequence[str] = tuple(SCHEMAS),
) -> ExportResult:
    """Write ``directory/<table>.parquet`` for each table; returns the row counts."""
    if chunk_rows < 1:
        raise InputError("chunk size must be at least 1 row")
    directory.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    for name in tables:
        schema = SCHEMAS[name]
        if not with_content and "content" in schema.names:
            schema = schema.remove(schema.get_field_index("content"))
        path = directory / f"{name}.parquet"
        tmp = path.with_suffix(".parquet.tmp")
        n = 0
        try:
            with pq.ParquetWriter(str(tmp), schema, compression="zstd") as writer:
                for batch in _batches(engine, name, schema, chunk_rows):
                    writer.write_batch(batch)
                    n += batch.num_rows
                    if on_chunk is not None:
                        on_chunk(name, n)
        except BaseException:  # no half-written file left beside the finished ones
            tmp.unlink(missing_ok=True)
            raise
        tmp.replace(path)
        counts[name] = n
    return ExportResult(directory, counts)
