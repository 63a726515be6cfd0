# SPDX-License-Identifier: MIT
"""A connection the daemon closed for idleness (--idle-timeout, holding nothing) gets a
new one at its next call, through the binding as through libshmref (issue 25, item 5);
and shmref.dask says why a frame falls back to TCP once, not per message."""
import logging
import time

import numpy as np
import pytest

import shmref
from conftest import Daemon


@pytest.fixture
def idle_daemon():
    d = Daemon("--idle-timeout", "1")
    yield d
    d.stop()


def wait_closed(d, left=1, seconds=10.0):
    """Waits, by the daemon's count of clients (the status probe's own connection among
    them), until idle connections are closed; then checks that it said so."""
    assert d.wait_status("daemon.clients", left, seconds) == left, "the idle connection was not closed"
    assert "idle, holding nothing" in d.text()


def test_a_client_idle_past_the_daemons_timeout_reconnects(idle_daemon):
    with shmref.connect(idle_daemon.socket, timeout=10) as c:
        c.set_stock(0)  # holds nothing between calls
        a = c.empty(1000, "float64")
        c.release(a)
        wait_closed(idle_daemon)
        a = c.empty(1000, "float64")  # before: TimeoutError: idle for 1 s holding nothing ... closed
        a[:] = 7.0
        ref = c.publish(a, keep=10.0)
        with shmref.connect(idle_daemon.socket, timeout=10) as other:
            b = other.acquire(ref)
            assert b.sum() == 7000.0
            other.release(b)
        c.release(a)
        wait_closed(idle_daemon)
        c.ping()
        wait_closed(idle_daemon)
        assert c.status()["daemon"]["clients"] >= 1
        wait_closed(idle_daemon)
        with shmref.connect(idle_daemon.socket, timeout=10) as p:
            x = p.empty(10, "int64")
            x[:] = np.arange(10)
            ref = p.publish(x, keep=10.0)
            wait_closed(idle_daemon, 2)  # p holds its lease: only c idles out
            y = c.acquire(ref)
            assert list(y) == list(range(10))
            c.release(y)


def test_dask_fallback_to_tcp_is_said_once_with_its_reason(monkeypatch, caplog):
    pytest.importorskip("distributed")
    from shmref.dask import comm

    class Full:
        def empty(self, n, dtype):
            raise shmref.QuotaExceeded(122, f"lease of {n} bytes refused: over quota")

        def empty_many(self, sizes):  # the batch is refused as a whole, then each lease
            raise shmref.QuotaExceeded(122, f"lease of {sum(sizes)} bytes refused: over quota")

    class State:
        client = Full()
        threshold = 1

        def lookup(self, addr, n):
            return None

    monkeypatch.setattr(comm, "_state", lambda: State())
    monkeypatch.setattr(comm, "_fallbacks_warned", set(), raising=False)
    before = comm._stats.as_dict()["fallbacks"]
    frames = [b"x" * 100_000, b"y" * 100_000]
    with caplog.at_level(logging.DEBUG, logger=comm.logger.name):
        for _ in range(20):
            entries, out = comm.ShmrefComm._to_refs(None, frames)
            assert entries == [] and out == frames
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "over quota" in warnings[0].getMessage() and "TCP" in warnings[0].getMessage()
    assert comm._stats.as_dict()["fallbacks"] - before >= 20
