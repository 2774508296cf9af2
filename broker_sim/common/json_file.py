"""Atomic JSON config files (``config/*.json``): thin wrappers over the store's ``config_files`` helpers, so
the broker's tables (topics, groups, offsets, delay progress) share one durable write path and one reader
(temp file + fsync + rename, previous version in ``.bak``, unquoted fastjson integer keys accepted)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from broker_sim.store.config_files import load_json, save_json


def write_json_atomic(path: Path, data: Any) -> None:
    save_json(path, data)


def read_json(path: Path) -> Any | None:
    """The file's content, else its ``.bak``, else None; the store's ConfigFileError if both are
    unreadable."""
    return load_json(path)
