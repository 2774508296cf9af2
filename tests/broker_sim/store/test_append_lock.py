"""The compiled commit-log lock (``_codec.AppendLock``) behaves as ``threading.Lock`` does for every use the
store makes of it (``with``, ``acquire(False)``, timeouts, another thread waiting), and the store appends
under it: a put made while Python code holds the lock waits for it and then lands after what the holder
wrote."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from broker_sim.store import MessageStore, PutMessageStatus, codec
from broker_sim.store.commit_log import LockLike
from tests.broker_sim.store.conftest import msg, needs_c


def kinds() -> list[Callable[[], LockLike]]:
    out: list[Callable[[], LockLike]] = [threading.Lock]
    if codec.compiled is not None:
        out.append(codec.compiled.AppendLock)
    return out


@pytest.mark.parametrize("make", kinds())
def test_acquire_release_and_locked(make: Callable[[], LockLike]) -> None:
    lock = make()
    assert not lock.locked()
    assert lock.acquire() is True
    assert lock.locked()
    assert lock.acquire(False) is False
    assert lock.acquire(blocking=False) is False
    assert lock.acquire(timeout=0.01) is False
    lock.release()
    assert not lock.locked()
    with lock:
        assert lock.locked()
    assert not lock.locked()
    with pytest.raises(RuntimeError):
        lock.release()
    with pytest.raises(ValueError):
        lock.acquire(False, 1.0)
    with pytest.raises(ValueError):
        lock.acquire(timeout=-2)


@pytest.mark.parametrize("make", kinds())
def test_a_waiting_thread_gets_the_lock_when_it_is_released(make: Callable[[], LockLike]) -> None:
    lock = make()
    lock.acquire()
    started, got = threading.Event(), threading.Event()

    def waiter() -> None:
        started.set()
        with lock:  # blocks (without the GIL) until the main thread releases
            got.set()

    t = threading.Thread(target=waiter)
    t.start()
    started.wait()
    assert not got.is_set()
    lock.release()
    t.join(10)
    assert got.is_set()
    assert not lock.locked()


@needs_c
def test_compiled_store_appends_under_the_append_lock(tmp_path: Path) -> None:
    store = MessageStore(tmp_path / "s")
    store.start()
    try:
        assert type(store.commit_log.lock) is codec.compiled.AppendLock
        first = store.put_message(msg(body=b"one"))
        done: list[PutMessageStatus] = []
        with store.commit_log.lock:  # what expiry does: the compiled put must hand over and wait
            t = threading.Thread(target=lambda: done.append(store.put_message(msg(body=b"two")).status))
            t.start()
            assert not done  # cannot have appended: the lock is still held here
        t.join(10)
        assert done == [PutMessageStatus.PUT_OK]
        assert store.commit_log.lock.locked() is False
        assert first.append_result is not None
        assert store.max_phy_offset > first.append_result.wrote_offset + first.append_result.wrote_bytes
    finally:
        store.shutdown()


def test_python_twin_uses_threading_lock(tmp_path: Path) -> None:
    from broker_sim.clock import SystemClock
    from broker_sim.store.commit_log import CommitLog

    host = b"\x7f\x00\x00\x01\x00\x00\x2a\x9f"
    cl = CommitLog(tmp_path / "cl", 1 << 20, 1 << 16, host, SystemClock(), "python")
    assert type(cl.lock) is type(threading.Lock())
