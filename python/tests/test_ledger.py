# SPDX-License-Identifier: MIT
"""Same-tenant handoffs without the daemon (issue 18) from Python: Client.acquire and
Client.release go through libshmref's shmref_acquire/shmref_release, so an acquire of a
buffer of this uid that the consumer's connection already maps is taken in the tenant's
ledger. The binding has no client counters; the daemon's status says it: its acquire
counter does not move while its ledger.took does. SHMREF_LEDGER=0 (a child process)
turns it off."""
import os
import subprocess
import sys
import textwrap

import numpy as np

import shmref

N = 1000
ROUNDS = 300


def handoffs(prod, cons, rounds, start=0, settle=False):
    """rounds producer -> consumer handoffs of N float64, every element compared. settle:
    the consumer pings before the producer releases, so the daemon has read its one-way
    took while the publish it names still stands (on a loaded machine a took read after
    the producer's release, another connection, names nothing and is ignored)."""
    for i in range(start, start + rounds):
        a = prod.empty(N, "float64")
        a[:] = np.arange(N, dtype=np.float64) + i
        ref = prod.publish(a)
        b = cons.acquire(ref)
        assert b.shape == (N,) and b.dtype == np.float64
        np.testing.assert_array_equal(b, np.arange(N, dtype=np.float64) + i)
        cons.release(b)
        if settle:
            cons.ping()
        prod.release(a)


def counters(daemon):
    """(acquires the daemon answered, acquires taken in the ledger): its acquire counter
    counts both."""
    st = daemon.status()
    took = st["ledger"]["took"]
    return st["counters"]["acquires"] - took, took


def test_steady_state_acquires_skip_the_daemon(daemon):
    with shmref.connect(daemon.socket, timeout=20) as prod, shmref.connect(daemon.socket, timeout=20) as cons:
        handoffs(prod, cons, 200)  # the consumer comes to map the pool's buffers
        cons.ping()  # the daemon has read the consumer's one-way notes (took) before status
        acq0, took0 = counters(daemon)
        handoffs(prod, cons, ROUNDS, start=200, settle=True)
        cons.ping()
        acq1, took1 = counters(daemon)
    print(f"{ROUNDS} Python handoffs: daemon acquires {acq1 - acq0}, ledger takes {took1 - took0}")
    # Every acquire skipped the daemon (a ping is no acquire), and the daemon heard of each
    # as a took while its publish stood.
    assert acq1 - acq0 <= 5, (acq1 - acq0, took1 - took0)
    assert took1 - took0 >= ROUNDS - 5, (acq1 - acq0, took1 - took0)


def test_ledger_off_asks_the_daemon(daemon):
    acq0, took0 = counters(daemon)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import sys, shmref
        sys.path.insert(0, sys.argv[2])
        from test_ledger import handoffs
        with shmref.connect(sys.argv[1], timeout=20) as p, shmref.connect(sys.argv[1], timeout=20) as c:
            handoffs(p, c, 200)
        """), daemon.socket, os.path.dirname(os.path.abspath(__file__))],
        env={**os.environ, "SHMREF_LEDGER": "0"}, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    acq1, took1 = counters(daemon)
    assert took1 == took0, "SHMREF_LEDGER=0 took buffers in the ledger"
    assert acq1 - acq0 >= 200
