# SPDX-License-Identifier: MIT
"""Nothing a Python program does crashes the interpreter or hangs: lifetimes of views,
read-only exports, forked children, threads, and a daemon that is gone or stopped."""
import ctypes
import gc
import os
import signal
import threading
import time

import numpy as np
import pytest

import shmref


def published(c, n=1000, value=5.0):
    a = c.empty(n, "float64")
    a[:] = value
    return a, c.publish(a)


def leases_held(daemon, client):
    return daemon.leases(client)


def test_views_keep_the_buffer_and_release_says_so(client):
    """While views of an array live, release() refuses (BufferError, as
    memoryview.release) and every view keeps reading the producer's bytes; once they
    are gone, release() gives the buffer up and the array reads as empty."""
    a, ref = published(client, 100_000, 2.5)
    b = client.acquire(ref)
    view = b[::7]
    mv = memoryview(b)
    with pytest.raises(BufferError, match="still in use"):
        client.release(b)
    assert float(b.sum()) == 250_000.0        # still mapped, still the producer's bytes
    assert float(view.sum()) == pytest.approx(2.5 * len(view))
    assert mv.readonly and mv.nbytes == 800_000
    del view
    gc.collect()
    assert np.frombuffer(mv, np.float64)[-1] == 2.5   # the memoryview alone keeps it
    mv.release()
    client.release(b)
    assert b.size == 0
    client.release(b)                         # twice: harmless
    client.release(a)


def test_release_takes_effect_at_once(client, daemon):
    client.ping()
    before = leases_held(daemon, client)
    a, ref = published(client)
    b = client.acquire(ref)
    v = b[1:]
    with pytest.raises(BufferError):
        client.release(b)
    client.ping()
    assert leases_held(daemon, client) == before + 2   # v still holds the acquire
    del v
    client.release(b)
    client.release(a)
    client.ping()
    assert leases_held(daemon, client) == before       # both gone now, not at the next GC


def test_read_after_close_stays_valid(daemon):
    c = shmref.connect(daemon.socket)
    a, ref = published(c, 50_000, 1.0)
    b = c.acquire(ref)
    clients = daemon.status()["daemon"]["clients"]
    c.close()
    c.close()                                  # idempotent
    assert c.closed and "closed" in repr(c)
    assert float(a.sum()) == 50_000.0 and float(b.sum()) == 50_000.0
    with pytest.raises(ValueError, match="closed"):
        c.acquire(ref)
    with pytest.raises(ValueError, match="closed"):
        c.empty(3)
    assert daemon.status()["daemon"]["clients"] == clients   # kept open for the arrays
    del a, b
    gc.collect()
    assert daemon.wait_status("daemon.clients", clients - 1) == clients - 1


def test_acquired_arrays_cannot_be_made_writable(client):
    a, ref = published(client)
    b = client.acquire(ref)
    for x in (b, b[2:], b.reshape(10, 100), b.view(np.uint8)):
        with pytest.raises(ValueError):
            x.setflags(write=True)
        with pytest.raises(ValueError):
            x.flags.writeable = True
        with pytest.raises((ValueError, TypeError)):
            x[0] = 1
    with pytest.raises(TypeError, match="read-only"):
        memoryview(b.base).cast("B")[0] = 1
    with pytest.raises(TypeError, match="not writable"):
        (ctypes.c_char * 8).from_buffer(b.base)        # asks for a writable export
    assert memoryview(b.base).readonly and memoryview(b).readonly
    with pytest.raises(ValueError):
        np.frombuffer(b.base, np.uint8).setflags(write=True)
    # the producer's own array is read-only once published, and stays so
    with pytest.raises(ValueError):
        a.setflags(write=True)
    assert float(b[0]) == 5.0


def test_forked_child_gets_a_clear_error(client, daemon):
    a, ref = published(client, 1000, 3.0)
    b = client.acquire(ref)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return into pytest
        code = 1
        try:
            ok_read = float(b.sum()) == 3000.0          # inherited mappings stay readable
            try:
                client.acquire(ref)
                msg = "no error"
            except ChildProcessError as e:
                msg = str(e)
            try:
                client.ping()
            except ChildProcessError:
                pass
            with shmref.connect(daemon.socket) as mine:   # a new connection works
                fresh = float(mine.acquire(ref).sum()) == 3000.0
            del b
            os.write(w, f"{ok_read}|{fresh}|{msg}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    out = os.read(r, 4096).decode()
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0, out
    ok_read, fresh, msg = out.split("|", 2)
    assert ok_read == "True" and fresh == "True"
    assert f"connection was opened by pid {os.getpid()}; this is pid {pid}: connect again in the child" == msg
    client.ping()                                       # the parent's connection is untouched
    np.testing.assert_array_equal(client.acquire(ref), np.full(1000, 3.0))
    assert "forked" not in repr(client)


def test_threads_share_a_client(client):
    errors, done = [], []

    def work(k):
        try:
            for i in range(40):
                a = client.empty((50, 20), "int32")
                a[:] = k * 1000 + i
                b = client.acquire(client.publish(a))
                assert int(b[3, 3]) == k * 1000 + i
                client.release(b)
                client.release(a)
                del a, b
            done.append(k)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and sorted(done) == list(range(8))
    client.ping()


def test_gil_is_released_while_a_call_waits(own_daemon):
    c = shmref.connect(own_daemon.socket, timeout=1.5)
    spare = [c.empty(10) for _ in range(5)]
    os.kill(own_daemon.proc.pid, signal.SIGSTOP)
    try:
        ticks = []
        result = []

        def call():
            try:
                c.ping()
            except OSError as e:
                result.append(e)

        t = threading.Thread(target=call)
        t.start()
        time.sleep(0.2)
        t0 = time.monotonic()
        del spare                               # released while the connection is busy: queued
        assert time.monotonic() - t0 < 0.2
        t0 = time.monotonic()
        while t.is_alive() and time.monotonic() - t0 < 10:
            ticks.append(1)                     # pure Python: runs only if the GIL is free
            time.sleep(0.001)
        t.join()
        assert len(ticks) > 100, len(ticks)
        assert isinstance(result[0], TimeoutError)
    finally:
        os.kill(own_daemon.proc.pid, signal.SIGCONT)


def test_stopped_daemon_times_out_with_the_operation_named(own_daemon):
    c = shmref.connect(own_daemon.socket, timeout=0.5)
    # another connection, which does not map the buffer: its acquire must ask the daemon (a
    # connection that maps it may take it in the uid's table, with no daemon at all)
    other = shmref.connect(own_daemon.socket, timeout=0.5)
    a = c.empty(100)
    ref = c.publish(a)
    os.kill(own_daemon.proc.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        # the acquire's deadline covers the wait for a publish it asks of the daemon
        with pytest.raises(TimeoutError, match=r"acquire: no answer from shmrefd within 1000 ms"):
            other.acquire(ref)
        assert time.monotonic() - t0 < 3
        with pytest.raises(OSError, match="abandoned after acquire timed out"):
            other.ping()
        t0 = time.monotonic()
        with pytest.raises(TimeoutError) as e:      # a new connection: hello waits, then gives up
            shmref.connect(own_daemon.socket, timeout=0.5)
        assert own_daemon.socket in str(e.value) and time.monotonic() - t0 < 3
        assert float(a.sum()) == float(a.sum())     # mapped memory stays readable
    finally:
        os.kill(own_daemon.proc.pid, signal.SIGCONT)


def test_killed_daemon_raises_at_once(own_daemon):
    c = shmref.connect(own_daemon.socket, timeout=5)
    a, ref = published(c, 10_000, 4.0)
    b = c.acquire(ref)
    own_daemon.proc.kill()
    own_daemon.proc.wait()
    t0 = time.monotonic()
    with pytest.raises(ConnectionResetError, match="shmrefd closed the connection"):
        c.ping()            # (a re-acquire of ref would not ask the daemon: b holds it)
    with pytest.raises(OSError):
        c.empty(10)
    assert time.monotonic() - t0 < 2
    assert float(b.sum()) == 40_000.0             # the mapping outlives the daemon
    with pytest.raises((FileNotFoundError, ConnectionRefusedError), match=own_daemon.socket):
        shmref.connect(own_daemon.socket, timeout=1)
    c.release(b)
    c.close()
    del a, b


def test_absent_daemon_fails_fast_naming_the_socket(tmp_path):
    path = str(tmp_path / "nobody.sock")
    t0 = time.monotonic()
    with pytest.raises(FileNotFoundError, match=f"cannot connect to shmrefd at {path}.*is shmrefd running"):
        shmref.connect(path)
    assert time.monotonic() - t0 < 1


def test_environment_default_timeout(own_daemon, monkeypatch):
    monkeypatch.setenv("SHMREF_TIMEOUT_MS", "700")
    c = shmref.connect(own_daemon.socket)
    assert c.timeout == 0.7
    c.timeout = float("inf")
    assert c.timeout == float("inf")
    c.close()


def test_misuse_raises_instead_of_crashing(client, daemon):
    with pytest.raises(ValueError):
        client.release(np.zeros(3))
    with pytest.raises(ValueError):
        client.release("shmref1:" + "00" * 16 + ":1")
    with pytest.raises(TypeError):
        client.release(None)
    other = shmref.connect(daemon.socket)
    x = other.empty(4)
    with pytest.raises(ValueError, match="another client"):
        client.release(x)
    del other                                  # the client object goes; x keeps its connection
    gc.collect()
    x[:] = 1
    assert float(x.sum()) == 4.0
    with pytest.raises(ValueError):
        client.empty(-1)
    with pytest.raises(TypeError):
        client.empty((2, 2), "no-such-dtype")
    with pytest.raises(OSError):
        client.empty(1 << 50)                  # the daemon refuses: EFBIG with its message
    with pytest.raises(TypeError):
        shmref.Client(socket=3)


def test_uninitialised_client_raises(daemon):
    class Lazy(shmref.Client):
        def __init__(self):  # never connects
            pass

    c = Lazy()
    for call in (lambda: c.empty(3), lambda: c.acquire("shmref1:" + "00" * 16 + ":1"), c.ping,
                 lambda: c.release("shmref1:" + "00" * 16 + ":1"), lambda: c.daemon_pid):
        with pytest.raises(ValueError):
            call()
    assert c.shares == [] and c.closed
    c.close()


def test_random_sequences_never_crash(daemon):
    """A few hundred random calls, mixing lifetimes: every array alive must keep its
    values, whatever was released or closed before."""
    import pickle
    import random
    rnd = random.Random(9)
    clients = [shmref.connect(daemon.socket) for _ in range(2)]
    alive = []          # (array, expected value)
    refs = []           # (client, ref, value)
    for step in range(400):
        op = rnd.randrange(9)
        c = rnd.choice(clients)
        try:
            if op == 0:
                a = c.empty(rnd.randrange(0, 5000), rnd.choice(["f8", "i4", "u1"]))
                a[...] = step % 100
                alive.append((a, step % 100))
            elif op == 1 and alive:
                a, v = rnd.choice(alive)
                refs.append((c, c.publish(a, keep=rnd.choice([0.0, 5.0])), v))
            elif op == 2 and refs:
                _, ref, v = rnd.choice(refs)
                alive.append((c.acquire(ref), v))
            elif op == 3 and alive:
                a, _ = rnd.choice(alive)
                c.release(a)
            elif op == 4 and alive:
                alive.pop(rnd.randrange(len(alive)))
            elif op == 5:
                k = rnd.randrange(len(clients))
                clients[k].close()
                clients[k] = shmref.connect(daemon.socket)
            elif op == 6 and alive:
                a, v = rnd.choice(alive)
                alive.append((pickle.loads(pickle.dumps(a)), v))
            elif op == 7:
                ref = c.share(np.full(rnd.randrange(1, 3000), step % 50, np.int16))
                refs.append((c, ref, step % 50))
                if rnd.random() < 0.5:
                    c.release(ref)
            elif op == 8:
                gc.collect()
        except (OSError, ValueError, BufferError):
            pass   # refused (e.g. publish twice, acquire of a gone buffer): an exception, not a crash
        for a, v in alive[-5:]:
            assert a.size == 0 or (int(a.flat[0]) == v and int(a.flat[-1]) == v)
    for a, v in alive:
        assert a.size == 0 or int(a.flat[0]) == v
    for c in clients:
        c.close()


def test_hostile_metadata_never_maps_outside_the_buffer(client):
    """A producer lies in its metadata (published as raw bytes, as any C producer can);
    the consumer refuses with ValueError instead of building a view past the mapping."""
    from helpers import mp

    held = []

    def publish(meta):
        held.append(client.empty(4096, "u1"))           # a buffer of exactly 4096 bytes
        return client._publish_raw(held[-1], meta)

    base = {"shmref": 1, "kind": "array", "dtype": "<f8", "order": "C"}
    lies = [{**base, "shape": [513]},                          # 4104 bytes of 4096
            {**base, "shape": [8], "offset": 4090},             # offset + size past the end
            {**base, "shape": [2 ** 40, 2 ** 40]},              # overflows on the way
            {**base, "dtype": "|O8", "shape": [1]},             # pointers
            {**base, "shape": [1], "shmref": 9}]                # a later version
    for meta in lies:
        with pytest.raises(ValueError, match="array metadata"):
            client.acquire(publish(mp(meta)))
    with pytest.raises(ValueError, match="too large"):         # 0 bytes, but no ndarray can say so
        client.acquire(publish(mp({**base, "shape": [0, 2 ** 62]})))
    assert client.acquire(publish(mp({**base, "shape": [0, 7]}))).shape == (0, 7)
    ok = client.acquire(publish(mp({**base, "shape": [511], "offset": 8})))
    assert ok.shape == (511,) and ok.base.nbytes == 4096
    opaque = client.acquire(publish(b"\xc1 not msgpack"))
    assert opaque.dtype == np.uint8 and opaque.shape == (4096,)
    assert shmref.metadata(opaque) == b"\xc1 not msgpack"


def test_default_client_reconnects_after_a_daemon_restart(own_daemon, monkeypatch):
    from conftest import Daemon
    monkeypatch.setenv("SHMREFD_SOCKET", own_daemon.socket)
    first = shmref.shared(np.arange(10.0))
    own_daemon.proc.kill()
    own_daemon.proc.wait()
    again = Daemon(socket=own_daemon.socket)       # a new shmrefd on the same socket
    try:
        second = shmref.shared(np.arange(5.0))     # the dead cached connection is replaced
        np.testing.assert_array_equal(second, np.arange(5.0))
        assert float(first.sum()) == 45.0          # the old mapping is still readable
        j = shmref.encode(np.ones(100_000))
        assert float(shmref.decode(j).sum()) == 100_000.0
    finally:
        again.stop()
