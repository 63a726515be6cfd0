# SPDX-License-Identifier: MIT
"""Producer and consumer in separate processes; pickling by reference through
multiprocessing (fork, spawn, forkserver) and ProcessPoolExecutor."""
import multiprocessing as mp
import os
import pickle
import subprocess
import sys
import textwrap
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest

import helpers
import shmref

HERE = os.path.dirname(os.path.abspath(__file__))


def run_py(code, *args):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], check=True, capture_output=True,
                          text=True, timeout=120, cwd=HERE).stdout


def test_producer_process_consumer_here(daemon):
    text = run_py("""
        import sys, numpy as np, shmref
        with shmref.connect(sys.argv[1]) as c:
            a = c.empty((500, 3), "float32")
            a[:] = np.arange(1500, dtype=np.float32).reshape(500, 3)
            print(c.publish(a, keep=30.0, meta=b"from-child"))
        """, daemon.socket).strip()
    with shmref.connect(daemon.socket) as c:
        b = c.acquire(text)
        np.testing.assert_array_equal(b, np.arange(1500, dtype=np.float32).reshape(500, 3))
        assert shmref.metadata(b) == b"from-child"


def test_producer_here_consumer_process(daemon):
    with shmref.connect(daemon.socket) as c:
        a = c.empty((64, 64), "int64")
        a[:] = np.arange(4096).reshape(64, 64)
        ref = c.publish(a)
        out = run_py("""
            import sys, shmref
            with shmref.connect(sys.argv[1]) as c:
                b = c.acquire(sys.argv[2])
                print(b.dtype, b.shape, int(b.sum()), b.flags.writeable)
            """, daemon.socket, str(ref))
        assert out.split() == ["int64", "(64,", "64)", str(4096 * 4095 // 2), "False"]


def test_pickle_is_a_reference(client):
    """Inside by_reference() (multiprocessing's pickler always): a descriptor."""
    a = client.empty(100_000, "float64")
    a[:] = 1.5
    with shmref.by_reference():
        p = pickle.dumps(a)
        assert len(p) < 400, len(p)          # a descriptor, not 800 kB
        assert not a.flags.writeable         # pickling published it
        for proto in range(2, pickle.HIGHEST_PROTOCOL + 1):
            assert len(pickle.dumps(a[:10], protocol=proto)) < 400
    b = pickle.loads(p)
    assert shmref._shmref._buffer_info(b) is not None
    np.testing.assert_array_equal(b, a)
    with shmref.by_reference():
        p = pickle.dumps(b[10:50:3])
    v = pickle.loads(p)                          # a strided view travels as a view
    np.testing.assert_array_equal(v, a[10:50:3])
    plain = pickle.loads(pickle.dumps(a * 2))    # arithmetic results are plain arrays: by value
    assert type(plain) is np.ndarray and shmref._shmref._buffer_info(plain) is None


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_multiprocessing_pool(daemon, method):
    ctx = mp.get_context(method)
    arrays = [shmref.shared(np.arange(10_000, dtype=np.float64) * k) for k in range(4)]
    with ctx.Pool(2) as pool:
        got = pool.map(helpers.describe, arrays)
        doubled = pool.map(helpers.double_shared, arrays[:2])
    for k, (in_shm, total, shape, dtype, writable) in enumerate(got):
        assert in_shm, "the worker got a copy, not the shared buffer"
        assert total == pytest.approx(k * 10_000 * 9_999 / 2)
        assert shape == (10_000,) and dtype == "float64" and not writable
    for k, d in enumerate(doubled):
        assert shmref._shmref._buffer_info(d) is not None  # came back by reference too
        np.testing.assert_array_equal(d, np.arange(10_000) * k * 2)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_process_pool_executor(daemon, method):
    with ProcessPoolExecutor(2, mp_context=mp.get_context(method)) as ex:
        results = list(ex.map(helpers.square, range(5)))
        a = shmref.shared(np.ones((300, 300)))
        got = ex.submit(helpers.describe, a).result()
    for x, r in zip(range(5), results):
        assert shmref._shmref._buffer_info(r) is not None
        np.testing.assert_array_equal(r, np.full(1000, x * x))
    assert got[0] and got[1] == 90_000


def test_process_with_queue(daemon):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=helpers.put_shared, args=(q,))
    p.start()
    a = q.get(timeout=60)
    p.join(60)
    assert p.exitcode == 0
    assert shmref._shmref._buffer_info(a) is not None   # the sender is gone; the retention kept it
    np.testing.assert_array_equal(a, np.arange(12).reshape(3, 4))

