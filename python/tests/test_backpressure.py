# SPDX-License-Identifier: MIT
"""Backpressure from Python (issue 25, item 3): empty(), share(), shared() and
publish_batch() take wait= (float seconds), libshmref's wait_ms: a lease over the quota or
the pool waits for another holder's release instead of failing at once, with the GIL
released, and TimeoutError (naming the wait, with the daemon's numbers) when none comes."""
import math
import threading
import time

import numpy as np
import pytest

import shmref
from conftest import Daemon

MiB = 1 << 20


@pytest.fixture
def small():
    """A daemon whose tenant quota (16 MiB) two 12 MiB leases overrun, for one test: a
    client of another test still alive (an exception's traceback keeps its frame) could
    pin a retired buffer's pages, charged to the uid, with an idle mapping."""
    d = Daemon("--pool-size", "64M", "--tenant-quota", "16M")
    yield d
    d.stop()


def client_of(d):
    c = shmref.connect(d.socket, timeout=10)
    c.set_stock(0)  # a stock would hold leases of its own against the quota
    return c


class Counter(threading.Thread):
    """Counts as fast as it can while the test waits: it advances only if the waiting call
    released the GIL."""

    def __init__(self):
        super().__init__(daemon=True)
        self.n = 0
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            self.n += 1


def lease_waits(d):
    return d.status()["counters"]["lease_waits"]


def wait_parked(d, waits, seconds=10.0):
    """Waits, by the daemon's count of leases that waited, until a lease has been parked
    since the count was `waits`."""
    deadline = time.monotonic() + seconds
    while lease_waits(d) <= waits:
        assert time.monotonic() < deadline, "no lease waited"
        time.sleep(0.01)


def test_empty_waits_for_a_release_with_the_gil_released(small):
    holder, c = client_of(small), client_of(small)
    held = holder.empty(12 * MiB, "uint8")
    waits = lease_waits(small)
    released_at = []

    def release_when_parked():
        # By the daemon's state: the lease below is parked behind the quota.
        wait_parked(small, waits)
        time.sleep(0.3)  # the waiter stays parked meanwhile, not spinning
        released_at.append(time.monotonic())
        holder.release(held)

    counter = Counter()
    counter.start()
    t = threading.Thread(target=release_when_parked)
    t.start()
    start = time.monotonic()
    n0 = counter.n
    a = c.empty(12 * MiB, "uint8", wait=5)  # before: TypeError: empty() got an unexpected keyword argument 'wait'
    returned = time.monotonic()
    n1 = counter.n
    counter.stop.set()
    t.join()
    counter.join()
    assert a.nbytes == 12 * MiB
    a[:] = 1  # writable, ours
    assert released_at and returned >= released_at[0], "returned before the release"
    assert returned - start < 5, f"waited {returned - start:.2f} s: the whole wait"
    assert returned - released_at[0] < 2, f"returned {returned - released_at[0]:.2f} s after the release"
    assert n1 - n0 > 1000, f"the counter thread advanced {n1 - n0} times during the wait: the GIL was held"
    c.release(a)
    holder.close()
    c.close()


def test_empty_wait_runs_out_as_timeout_error_naming_the_wait(small):
    holder, c = client_of(small), client_of(small)
    held = holder.empty(12 * MiB, "uint8")
    start = time.monotonic()
    with pytest.raises(TimeoutError) as e:
        c.empty(12 * MiB, "uint8", wait=0.2)
    took = time.monotonic() - start
    msg = str(e.value)
    # the daemon's deadline is counted from its loop's clock, read once per loop turn (and
    # a turn of the sanitized daemon is slow): it may end a few ms before 0.2 s of ours
    assert 0.19 <= took < 3, took
    assert "empty(wait=0.2)" in msg and "waited" in msg and "quota" in msg, msg
    assert "12582912 bytes" in msg and "16.0 MiB quota" in msg, msg  # the daemon's numbers
    assert e.value.wait == 0.2
    c.ping()  # the connection is fine: a refusal, not a dead connection
    with pytest.raises(shmref.QuotaExceeded):  # no wait: refused at once, as before
        c.empty(12 * MiB, "uint8")
    with pytest.raises(shmref.QuotaExceeded):
        c.empty(12 * MiB, "uint8", wait=0)
    holder.release(held)
    holder.close()
    c.close()


def test_a_wait_is_not_held_up_by_the_clients_own_idle_mappings(small):
    """A buffer released and kept mapped (the client's mapping cache) that the daemon
    retires for the quota pins its pages until the client unmaps it; a lease without a
    wait is refused, gives the idle mappings back and goes again: one with wait= does the
    same before it waits (before: TimeoutError after the whole wait, the quota free)."""
    c = client_of(small)
    a = c.empty(12 * MiB, "uint8")
    a[:] = 1
    c.release(a)
    start = time.monotonic()
    b = c.empty(8 * MiB, "uint8", wait=3)
    assert time.monotonic() - start < 1.5
    c.release(b)
    c.close()


def test_share_and_shared_wait_too(small):
    holder, c = client_of(small), client_of(small)
    held = holder.empty(12 * MiB, "uint8")
    x = np.ones(12 * MiB, np.uint8)
    with pytest.raises(TimeoutError, match=r"share\(wait=0.1\)"):
        c.share(x, wait=0.1)
    with pytest.raises(TimeoutError, match=r"empty\(wait=0.1\)"):
        shmref.shared(x, client=c, wait=0.1)
    waits = lease_waits(small)

    def release_when_parked():
        wait_parked(small, waits)
        holder.release(held)

    t = threading.Thread(target=release_when_parked)
    t.start()
    y = shmref.shared(x, client=c, wait=5)
    t.join()
    assert y.nbytes == 12 * MiB and int(y[-1]) == 1
    del y
    holder.close()
    c.close()


def test_publish_batch_waits_too(small):
    pa = pytest.importorskip("pyarrow")
    holder, c = client_of(small), client_of(small)
    held = holder.empty(12 * MiB, "uint8")
    table = pa.table({"x": pa.array(np.arange(MiB, dtype=np.float64))})  # 8 MiB
    with pytest.raises(TimeoutError, match=r"publish_batch\(wait=0.1\)"):
        c.publish_batch(table, wait=0.1)
    waits = lease_waits(small)

    def release_when_parked():
        nonlocal held
        wait_parked(small, waits)
        holder.release(held)
        held = None
        holder.close()  # and its mapping: the daemon retired that buffer (another size)

    t = threading.Thread(target=release_when_parked)
    t.start()
    ref = c.publish_batch(table, wait=5)
    t.join()
    assert c.acquire_batch(ref).to_pyarrow().column("x")[-1].as_py() == MiB - 1
    c.release(ref)
    big = c.empty(12 * MiB, "uint8")
    start = time.monotonic()
    with pytest.raises(shmref.QuotaExceeded):  # the wait was for that call only
        c.publish_batch(table)
    assert time.monotonic() - start < 1
    c.release(big)
    c.close()


@pytest.mark.parametrize("bad", [-1.0, 600.5, math.inf, math.nan])
def test_wait_must_be_seconds_up_to_600(small, bad):
    c = client_of(small)
    with pytest.raises(ValueError, match="wait"):
        c.empty(10, wait=bad)
    c.close()
