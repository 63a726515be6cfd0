# SPDX-License-Identifier: MIT
"""Same-tenant handoffs without the daemon (issue 28) from Python: Client.empty,
Client.publish, Client.acquire and Client.release go through libshmref, so between
processes of one uid a steady-state handoff is made in the uid's table and sends the daemon
no message at all. The binding has no client counters; the daemon's status says it: its
message counter (every message it read) does not move over hundreds of handoffs but for
the status requests themselves. SHMREF_TABLE=0 (a child process) turns it off."""
import multiprocessing as mp
import os
import subprocess
import sys
import textwrap

import numpy as np

import shmref

N = 1000
ROUNDS = 300


def handoffs(prod, cons, rounds, start=0):
    """rounds producer -> consumer handoffs of N float64, every element compared."""
    for i in range(start, start + rounds):
        a = prod.empty(N, "float64")
        a[:] = np.arange(N, dtype=np.float64) + i
        ref = prod.publish(a)
        b = cons.acquire(ref)
        assert b.shape == (N,) and b.dtype == np.float64
        np.testing.assert_array_equal(b, np.arange(N, dtype=np.float64) + i)
        cons.release(b)
        prod.release(a)


def messages(daemon):
    """The daemon's count of messages read, and what one status call itself adds to it."""
    a = daemon.status()["counters"]["messages"]
    b = daemon.status()["counters"]["messages"]
    return b, b - a


def test_steady_state_handoffs_send_the_daemon_nothing(daemon):
    with shmref.connect(daemon.socket, timeout=20) as prod, shmref.connect(daemon.socket, timeout=20) as cons:
        handoffs(prod, cons, 50)  # the table gets its buffers, the consumer maps them
        m0, per_status = messages(daemon)
        handoffs(prod, cons, ROUNDS, start=50)
        m1 = daemon.status()["counters"]["messages"]
        st = daemon.status()
    sent = m1 - m0 - per_status
    print(f"{ROUNDS} Python handoffs: {sent} messages to the daemon (a status call is {per_status})")
    assert sent == 0, (sent, per_status)
    assert st["table"]["tables"] >= 1 and st["table"]["members"] >= 1, st["table"]


def _consumer(sock, q_in, q_out, rounds):
    with shmref.connect(sock, timeout=20) as cons:
        for i in range(rounds):
            ref = q_in.get()
            b = cons.acquire(ref)
            ok = b.shape == (N,) and bool(np.array_equal(b, np.arange(N, dtype=np.float64) + i))
            cons.release(b)
            q_out.put(ok)
        q_in.get()  # the producer has read the daemon's counters: this connection may close now


def test_two_processes_hand_over_in_the_table(daemon):
    """The users' case: a producer process and a consumer process of one uid; after a
    warm-up their handoffs (each acknowledged, so the producer's buffers come back) cost
    the daemon no message, and every element is the round's."""
    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    warm, rounds = 50, 200
    p = ctx.Process(target=_consumer, args=(daemon.socket, q_in, q_out, warm + rounds))
    p.start()
    try:
        with shmref.connect(daemon.socket, timeout=20) as prod:
            m0 = per_status = None
            for i in range(warm + rounds):
                if i == warm:
                    m0, per_status = messages(daemon)
                a = prod.empty(N, "float64")
                a[:] = np.arange(N, dtype=np.float64) + i
                q_in.put(str(prod.publish(a)))
                assert q_out.get(timeout=60), f"round {i}: the consumer read other bytes"
                prod.release(a)
            m1 = daemon.status()["counters"]["messages"]
    finally:
        q_in.put(None)
        p.join(60)
    assert p.exitcode == 0
    sent = m1 - m0 - per_status
    print(f"{rounds} handoffs between two processes: {sent} messages to the daemon")
    assert sent == 0, (sent, per_status)


def test_table_off_asks_the_daemon(daemon):
    acq0 = daemon.status()["counters"]["acquires"]
    out = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import sys, shmref
        sys.path.insert(0, sys.argv[2])
        from test_table import handoffs
        with shmref.connect(sys.argv[1], timeout=20) as p, shmref.connect(sys.argv[1], timeout=20) as c:
            handoffs(p, c, 200)
        """), daemon.socket, os.path.dirname(os.path.abspath(__file__))],
        env={**os.environ, "SHMREF_TABLE": "0"}, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert daemon.status()["counters"]["acquires"] - acq0 >= 200
