# SPDX-License-Identifier: MIT
"""shmref:// keeps tcp://'s semantics (issue 27), written on distributed.utils_test's own
helpers (gen_test, gen_cluster), as distributed's tests are: a message written just before
a close is delivered, independent frames of one message do not keep each other mapped, a
task may write into what it received. In-process clusters against a real shmrefd."""
import asyncio
import gc
import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

distributed = pytest.importorskip("distributed", reason="dask.distributed is not installed (shmref[dask])")

from distributed.comm import connect, listen  # noqa: E402
from distributed.protocol import to_serialize  # noqa: E402
from distributed.utils_test import gen_cluster, gen_test  # noqa: E402

import shmref  # noqa: E402
import shmref.dask as sd  # noqa: E402
from shmref.dask import comm as sdcomm  # noqa: E402

from conftest import Daemon  # noqa: E402

#: The last release's shmrefd (ctest's skew-previous builds it), which knows no retain.
PREVIOUS = os.environ.get("SHMREF_PREVIOUS_DAEMON", "")

KiB, MiB = 1 << 10, 1 << 20


@pytest.fixture(scope="module", autouse=True)
def shmref_daemon(daemon):
    """This module's daemon ($SHMREFD_SOCKET, conftest) for the backend of this process: a
    connection made for another module's daemon is dropped first, and again after."""
    sdcomm._the_state = None
    yield daemon
    sdcomm._the_state = None


def _host(a):
    """The object at the bottom of a's .base chain (what keeps a's memory mapped)."""
    while getattr(a, "base", None) is not None:
        a = a.base
    return a


async def _echo_and_close(comm):
    """A handler that reads one message, writes it back (its frames by reference are
    forwarded) and closes the comm at once."""
    msg = await comm.read()
    await comm.write(msg)
    await comm.close()


async def _echo(x):
    """x written to _echo_and_close's listener; (what came back, stats before, after)."""
    before = sd.stats()
    async with listen("shmref://127.0.0.1:0", _echo_and_close) as lst:
        comm = await connect(lst.contact_address)
        assert comm.by_ref
        await comm.write({"x": to_serialize(x)})
        got = await comm.read()
        await comm.close()
    return got, before, sd.stats()


# ---- item 3a: a message written just before a close ----

@gen_test()
async def test_a_message_written_before_close_keeps_its_forwarded_frames():
    """A handler reads a message (its large frame arrives by reference), writes it back
    (the frame is forwarded: its descriptor travels, no copy) and closes the comm at once:
    the peer reads the message, as over tcp://. Before: CommClosedError ... shmref frames:
    [Errno 2] no published buffer for this descriptor (the handler's hold ended at close,
    before the peer acquired the frame). x is read-only, so it arrives as a view of the
    mapping (a writable one arrives as a copy, which is sent on by a copy)."""
    x = np.arange(MiB // 8, dtype=np.float64)
    x.setflags(write=False)

    got, before, after = await _echo(x)
    assert np.array_equal(got["x"], x)
    assert after["sent_forwarded"] - before["sent_forwarded"] == 1  # forwarded, not copied
    del got
    gc.collect()


# A forwarder in a process of its own: it reads one message, writes it back (its large
# frame, which it received by reference, forwarded: the same descriptor) and exits at once,
# as a retiring worker hands its data over and shuts down. It prints its address, then what
# it forwarded.
_FORWARDER = textwrap.dedent("""
    import asyncio, os, sys
    from distributed.comm import listen
    import shmref.dask as sd

    async def main():
        done = asyncio.Event()

        async def echo_and_exit(comm):
            msg = await comm.read()
            await comm.write(msg)
            await comm.close()  # flushes what the write queued
            print("forwarded", sd.stats()["sent_forwarded"], flush=True)
            os._exit(0)  # no linger, no finalizer: the process is gone

        async with listen("shmref://127.0.0.1:0", echo_and_exit) as lst:
            print(lst.contact_address, flush=True)
            await done.wait()

    asyncio.run(main())
""")


@gen_test(timeout=60)
async def test_a_message_written_before_its_writer_exits_keeps_its_forwarded_frames():
    """A process reads a message (its large frame arrives by reference), writes it back
    (the frame is forwarded) and exits at once (os._exit right after the write is
    flushed); the peer reads the message only after that process is gone, and gets it,
    as over tcp://. Before: CommClosedError ... shmref frames: [Errno 2] no published
    buffer for this descriptor (the forwarder's hold ended with its connection; the
    publish's retention had ended at the forwarder's own acquire)."""
    x = np.arange(MiB // 8, dtype=np.float64)
    x.setflags(write=False)  # arrives as a view of the mapping, so it is forwarded
    proc = subprocess.Popen([sys.executable, "-c", _FORWARDER], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        addr = (await asyncio.to_thread(proc.stdout.readline)).strip()
        assert addr.startswith("shmref://"), addr
        comm = await connect(addr)
        assert comm.by_ref
        await comm.write({"x": to_serialize(x)})
        out, _ = await asyncio.to_thread(proc.communicate, timeout=30)
        assert proc.returncode == 0, out
        assert out.split() == ["forwarded", "1"], out  # forwarded, not copied
        got = await comm.read()  # after the forwarder exited
        await comm.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert np.array_equal(got["x"], x)
    del got
    gc.collect()


@pytest.mark.skipif(not os.path.exists(PREVIOUS), reason="no shmrefd of the previous release "
                    "($SHMREF_PREVIOUS_DAEMON: ctest builds it, skew-previous)")
@gen_test(timeout=60)
async def test_a_daemon_without_retain_gets_the_forwarded_frame_copied():
    """Against a shmrefd that does not know retain (EOPNOTSUPP) a frame that would be
    forwarded is copied into a lease of its own, which its publish's retention keeps for
    the reader; said once in the log."""
    x = np.arange(MiB // 8, dtype=np.float64)
    x.setflags(write=False)

    old_bin, old_sock = os.environ["SHMREFD_BIN"], os.environ.get("SHMREFD_SOCKET")
    os.environ["SHMREFD_BIN"] = PREVIOUS
    try:
        other = Daemon()
    finally:
        os.environ["SHMREFD_BIN"] = old_bin
    said = []
    handler = logging.Handler()
    handler.emit = lambda r: said.append(r.getMessage()) if r.levelno >= logging.WARNING else None
    log = logging.getLogger("distributed.comm.shmref")
    log.addHandler(handler)
    sdcomm._fallbacks_warned.discard(("retain", 95))
    try:
        os.environ["SHMREFD_SOCKET"] = other.socket
        sdcomm._the_state = None
        for _ in range(2):
            got, before, after = await _echo(x)
            assert np.array_equal(got["x"], x)
            del got
            assert after["sent_forwarded"] == before["sent_forwarded"]
            assert after["forwards_copied"] - before["forwards_copied"] == 1
            assert after["sent_by_ref"] - before["sent_by_ref"] == 2  # there, and back as a copy
        retain_lines = [m for m in said if "forwarded frames are copied" in m]
        assert len(retain_lines) == 1, said
        assert "PROTO_FEAT_RETAIN" in retain_lines[0]
    finally:
        log.removeHandler(handler)
        sdcomm._the_state = None
        if old_sock is None:
            os.environ.pop("SHMREFD_SOCKET", None)
        else:
            os.environ["SHMREFD_SOCKET"] = old_sock
        gc.collect()
        other.stop()


@gen_test()
async def test_a_forwarded_frame_whose_reader_never_comes_is_let_go_after_the_retention():
    """The retention a forwarded frame got for its reader ends at its time when the reader
    never comes: nothing stays held for a reader that never reads."""
    import dask

    x = np.arange(MiB // 8, dtype=np.float64)
    x.setflags(write=False)
    with dask.config.set({"distributed.comm.shmref.retention": "1s"}):
        sdcomm._the_state = None  # the retention is read once per process
        try:
            done = asyncio.Event()

            async def echo_and_close(comm):
                msg = await comm.read()
                await comm.write(msg)
                await comm.close()
                done.set()

            async with listen("shmref://127.0.0.1:0", echo_and_close) as lst:
                comm = await connect(lst.contact_address)
                await comm.write({"x": to_serialize(x)})
                await done.wait()
                comm.abort()  # never reads the echo
            gc.collect()
            st = sdcomm._state()
            assert st.client is not None
            for _ in range(100):
                b = st.client.status()["buffers"]
                if b["live"] == 0:
                    break
                await asyncio.sleep(0.05)
            assert b["live"] == 0, b
        finally:
            sdcomm._the_state = None


# ---- item 2: independent frames of one message ----

@gen_test()
async def test_frames_of_one_message_do_not_share_a_buffer():
    """Frames between the threshold and 4 MiB of one message each arrive in a buffer of
    their own, as over tcp:// (TCP.read gives each frame its own buffer, so that one
    object does not keep the others alive: distributed's
    test_rechunk_in_memory_shards_dont_share_buffer). Before: all in one lease."""
    xs = [np.full(256 * KiB // 8, i, dtype=np.float64) for i in range(6)]
    for x in xs:
        x.setflags(write=False)  # arrive as views of the mappings (writable ones are copied out)
    got = []

    async def keep(comm):
        got.append(await comm.read())
        await comm.close()

    before = sd.stats()
    async with listen("shmref://127.0.0.1:0", keep) as lst:
        comm = await connect(lst.contact_address)
        assert comm.by_ref
        await comm.write({"xs": [to_serialize(x) for x in xs]})
        for _ in range(200):
            if got:
                break
            await asyncio.sleep(0.01)
        await comm.close()
    ys = list(got[0]["xs"])
    assert all(np.array_equal(x, y) for x, y in zip(xs, ys))
    # ... and their leases were made in one batch (one round trip, not six)
    assert sd.stats()["lease_batches"] - before["lease_batches"] == 1
    assert all(shmref._shmref._buffer_info(_host(y)) is not None for y in ys), "not by reference"
    hosts = {id(_host(y)) for y in ys}
    assert len(hosts) == len(ys), f"{len(ys)} frames in {len(hosts)} buffer(s)"
    # What the daemon holds follows the objects: one frame kept, one frame's buffer held.
    st = sdcomm._state()
    del got, ys[1:]
    gc.collect()
    for _ in range(100):
        s = st.client.status()
        if s["buffers"]["live"] <= 1:
            break
        await asyncio.sleep(0.02)
    assert s["buffers"]["live"] == 1, s["buffers"]
    assert s["pool"]["bytes_leased"] <= 512 * KiB, s["pool"]


@gen_test()
async def test_a_message_whose_header_frame_goes_by_reference():
    """A message whose first frame (Dask's msgpack header) is itself past the threshold,
    as a client's graph of a few thousand tasks is, with a writable array in it: read as
    over tcp://. Before: the reader parsed the header before mapping it (ValueError:
    Unpack failed: incomplete input) and closed the comm; a Client that submitted
    c.map(inc, range(2000)) lost its scheduler ("scheduler-connection-lost"), and
    distributed's test_feed_large_bytestring and test_dump_cluster_state_exclude_default
    failed (a large bytes value in a message makes its msgpack frame large too)."""
    keys = [f"task-{i:08d}" for i in range(20000)]  # about 300 KiB of msgpack header
    x = np.arange(MiB // 8, dtype=np.float64)  # writable: arrives as a private mapping
    got = []

    async def keep(comm):
        got.append(await comm.read())
        await comm.close()

    before = sd.stats()
    async with listen("shmref://127.0.0.1:0", keep) as lst:
        comm = await connect(lst.contact_address)
        assert comm.by_ref
        await comm.write({"keys": keys, "x": to_serialize(x)})
        for _ in range(500):
            if got:
                break
            await asyncio.sleep(0.01)
        await comm.close()
    assert got, "the message was not read"
    assert list(got[0]["keys"]) == keys  # a tuple, as over tcp:// (msgpack use_list=False)
    assert np.array_equal(got[0]["x"], x)
    after = sd.stats()
    assert after["received_by_ref"] - before["received_by_ref"] >= 2, "the header and the array by reference"
    assert after["received_private"] > before["received_private"]


@gen_test()
async def test_daemon_calls_of_a_message_leave_the_event_loop():
    """No daemon call holds the event loop for long (issue 27 item 5): a message with one
    small frame by reference does its one round trip on the loop; a message with eight
    (eight leases, eight acquires) does them on Dask's offload thread, at both ends.
    Before: every message under 8 MiB did all of its round trips on the loop."""
    small = [np.full(128 * KiB // 8, i, dtype=np.float64) for i in range(8)]
    got = []

    async def keep(comm):
        while True:
            try:
                got.append(await comm.read())
            except Exception:
                return

    async with listen("shmref://127.0.0.1:0", keep) as lst:
        comm = await connect(lst.contact_address)
        assert comm.by_ref
        before = sd.stats()
        await comm.write({"x": to_serialize(small[0])})
        for _ in range(500):
            if got:
                break
            await asyncio.sleep(0.01)
        one = sd.stats()
        await comm.write({"xs": [to_serialize(x) for x in small]})
        for _ in range(500):
            if len(got) == 2:
                break
            await asyncio.sleep(0.01)
        eight = sd.stats()
        await comm.close()
    assert len(got) == 2 and all(np.array_equal(a, b) for a, b in zip(small, got[1]["xs"]))
    # one process plays both ends: each message counts once when written, once when read
    assert one["refs_on_loop"] - before["refs_on_loop"] == 2
    assert one["refs_offloaded"] == before["refs_offloaded"]
    assert eight["refs_offloaded"] - one["refs_offloaded"] == 2
    assert eight["refs_on_loop"] == one["refs_on_loop"]


def _make_table(n):
    import pyarrow as pa
    return pa.table({"x": pa.array(np.arange(n, dtype=np.float64)), "y": pa.array(np.arange(n) % 7)})


def _table_sum(t):
    return float(t.column("x").to_numpy().sum()), int(t.num_rows)


@gen_cluster(client=True, scheduler="shmref://127.0.0.1",
             nthreads=[("shmref://127.0.0.1", 1), ("shmref://127.0.0.1", 1)])
async def test_an_arrow_table_is_serialized_straight_into_a_lease(c, s, a, b):
    """An Arrow table a task made on one worker reaches a task on another through a lease
    Dask's serializer wrote it into (shmref.dask.serialize: Arrow's IPC stream, what
    distributed writes and reads), sent by descriptor with no copy: the comm copied none
    of its bytes. Before: distributed wrote it into a buffer of its own and the comm copied
    that into a lease (sent_copied_bytes grew by the table's size)."""
    pytest.importorskip("pyarrow")
    n = MiB // 8
    before = sd.stats()
    t = c.submit(_make_table, n, workers=[a.address], pure=False)
    got = await c.submit(_table_sum, t, workers=[b.address], pure=False)
    assert got == (float(np.arange(n, dtype=np.float64).sum()), n)
    after = sd.stats()
    assert after["sent_serialized"] - before["sent_serialized"] >= 1
    assert after["sent_copied_bytes"] - before["sent_copied_bytes"] < 64 * KiB, "the table was copied"


@gen_test()
async def test_a_table_to_a_tcp_peer_is_serialized_as_distributed_does():
    """Over a comm that does not take frames by reference the table is distributed's own
    serialization (the context says so), and arrives equal."""
    pa = pytest.importorskip("pyarrow")
    from distributed.protocol import deserialize, serialize
    tbl = _make_table(MiB // 8)
    header, frames = serialize(tbl, serializers=("dask",), context={"shmref": False})
    assert not any(isinstance(f, memoryview) and sdcomm._state().lookup(sdcomm._address(f), f.nbytes)
                   for f in frames)
    assert deserialize(header, frames).equals(tbl)
    before = sd.stats()["sent_serialized"]
    header, frames = serialize(tbl, serializers=("dask",), context={"shmref": True})
    hit = sdcomm._state().lookup(sdcomm._address(frames[0]), frames[0].nbytes)
    assert hit is not None and hit[2], "not written into a lease published here"
    assert deserialize(header, frames).equals(tbl)
    assert isinstance(pa.py_buffer(frames[0]), pa.Buffer)
    assert sd.stats()["sent_serialized"] == before  # counted when sent, not when serialized


# ---- item 3b: a task that writes into its input ----

def _add_one_in_place(x):
    x += 1
    return x


def _make(n):
    return np.arange(n, dtype=np.float64)


@gen_cluster(client=True, scheduler="shmref://127.0.0.1",
             nthreads=[("shmref://127.0.0.1", 1), ("shmref://127.0.0.1", 1)])
async def test_a_task_may_write_into_its_input(c, s, a, b):
    """A task that updates its input in place works, as over tcp://: the input arrived by
    reference from the other worker. Before: ValueError: output array is read-only."""
    assert s.address.startswith("shmref://") and a.address.startswith("shmref://")
    before = sd.stats()
    x = c.submit(_make, MiB // 8, workers=[a.address], pure=False)
    y = c.submit(_add_one_in_place, x, workers=[b.address], pure=False)
    got = await y
    assert np.array_equal(got, np.arange(MiB // 8, dtype=np.float64) + 1)
    assert sd.stats()["received_by_ref"] > before["received_by_ref"]



def _write_and_tell(x):
    """What x arrived as (writable? what holds its memory?), after writing into all of it."""
    o = x
    for _ in range(64):  # arrays' .base, memoryviews' .obj, down to what owns the memory
        nxt = o.obj if isinstance(o, memoryview) else getattr(o, "base", None)
        if nxt is None:
            break
        o = nxt
    writeable = bool(x.flags.writeable)
    x[:] = -1.0
    return writeable, type(o).__module__ + "." + type(o).__qualname__


def _total(x):
    return float(x.sum())


@gen_cluster(client=True, scheduler="shmref://127.0.0.1",
             nthreads=[("shmref://127.0.0.1", 1), ("shmref://127.0.0.1", 1), ("shmref://127.0.0.1", 1)])
async def test_a_writable_input_arrives_mapped_copy_on_write(c, s, a, b, w):
    """A writable array sent to a worker arrives writable and is a private copy-on-write
    mapping of the sender's published frame (issue 27 item 3: no copy until written), and
    the task's writes stay its own: another worker receiving the same array from the same
    sender gets the producer's bytes. Before: it arrived as a copy (its memory a
    bytearray's, received_private absent)."""
    n = MiB // 8
    want = float(np.arange(n, dtype=np.float64).sum())
    before = sd.stats()
    x = c.submit(_make, n, workers=[a.address], pure=False)
    assert await c.submit(_total, x, workers=[w.address], pure=False) == want  # w received x
    writeable, host = await c.submit(_write_and_tell, x, workers=[b.address], pure=False)
    after = sd.stats()
    assert writeable
    assert host.startswith("shmref"), f"the input's memory is held by {host}, not a shmref mapping"
    assert after["received_private"] > before.get("received_private", 0)
    assert after["received_copied"] == before.get("received_copied", 0)
    # b's task wrote -1 into all of its input: neither the sender's array nor what the
    # other worker received (a mapping of the same buffer) changed
    assert float(a.data[x.key].sum()) == want
    assert float(w.data[x.key].sum()) == want
    assert await c.submit(_total, x, workers=[w.address], pure=False) == want

# ---- a worker listens where the scheduler reaches it ----

def _external_ip():
    from distributed.utils import get_ip
    return get_ip()


needs_external_ip = pytest.mark.skipif(
    _external_ip() == "127.0.0.1",
    reason="this machine's default route address is 127.0.0.1: a worker on all interfaces gets it either way")


async def _worker_hosts(s, security=None):
    """(w.ip of a Worker given no host, host of one given host "") for scheduler s."""
    from distributed import Worker
    from distributed.comm import get_address_host
    kw = {"security": security} if security is not None else {}
    async with Worker(s.address, **kw) as w:
        first = w.ip
    async with Worker(s.address, host="", **kw) as w:
        second = get_address_host(w.address)
    return first, second


@needs_external_ip
@gen_cluster(nthreads=[], scheduler="shmref://127.0.0.1")
async def test_a_worker_given_no_host_is_reached_where_it_reaches_the_scheduler(s):
    """A Worker started with no host (or host "", `dask worker --listen-address
    shmref://:PORT`) gives the scheduler the address of the interface that reaches the
    scheduler, as over tcp:// (distributed's test_worker_listens_on_same_interface_by_default
    and test_service_hosts_match_worker). distributed's Worker passes its listener that
    default host only for tcp and tls. Before: the machine's external address
    (assert '192.0.2.2' == '127.0.0.1')."""
    assert s.address.startswith("shmref://127.0.0.1:")
    assert await _worker_hosts(s) == ("127.0.0.1", "127.0.0.1")


# ---- item 4: TLS, as distributed's tls:// ----

def _make_certs(d):
    """A self-signed certificate (its own CA) for 127.0.0.1, made with the openssl CLI
    (distributed's wheel ships no test certificates: utils_test.get_cert's files are in
    its source tree only)."""
    import subprocess
    key, cert = os.path.join(d, "key.pem"), os.path.join(d, "cert.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                    "-addext", "basicConstraints=critical,CA:TRUE",
                    "-keyout", key, "-out", cert], check=True, capture_output=True)
    return key, cert


def _tls_only_security():
    """distributed.utils_test.tls_only_security's Security (TLS for every role, plain
    comms refused) on certificates made here; None without the openssl CLI."""
    import atexit
    import shutil
    import tempfile

    from distributed.security import Security
    if shutil.which("openssl") is None:
        return None
    d = tempfile.mkdtemp(prefix="shmref-tls-")
    atexit.register(shutil.rmtree, d, True)
    key, cert = _make_certs(d)
    kw = {f"tls_{role}_{what}": path for role in ("scheduler", "worker", "client")
          for what, path in (("cert", cert), ("key", key))}
    sec = Security(tls_ca_file=cert, require_encryption=True, **kw)
    assert sec.require_encryption
    return sec


TLS_SECURITY = _tls_only_security()
needs_tls = pytest.mark.skipif(TLS_SECURITY is None, reason="no openssl CLI to make a test certificate")


@needs_tls
@gen_cluster(client=True, security=TLS_SECURITY, nthreads=[("127.0.0.1", 1), ("127.0.0.1", 1)],
             scheduler_kwargs={"protocol": "shmref+tls"}, worker_kwargs={"protocol": "shmref+tls"})
async def test_shmref_over_tls(c, s, a, b):
    """shmref+tls:// is distributed's tls:// (Security's contexts, require_encryption)
    with frames by reference: the cluster comes up on it and a worker-to-worker transfer
    goes by reference. Before: ValueError: unknown address scheme 'shmref+tls'."""
    assert s.address.startswith("shmref+tls://") and a.address.startswith("shmref+tls://")
    before = sd.stats()
    x = c.submit(_make, MiB // 8, workers=[a.address], pure=False)
    y = c.submit(_add_one_in_place, x, workers=[b.address], pure=False)
    assert np.array_equal(await y, np.arange(MiB // 8, dtype=np.float64) + 1)
    assert sd.stats()["received_by_ref"] > before["received_by_ref"]
    # the workers' comms to each other are TLS (their peers' certificates were checked)
    comm = await connect(a.address, **TLS_SECURITY.get_connection_args("client"))
    try:
        assert comm.by_ref and "peercert" in comm.extra_info
    finally:
        await comm.close()


@needs_tls
@needs_external_ip
@gen_cluster(nthreads=[], security=TLS_SECURITY, scheduler_kwargs={"protocol": "shmref+tls"})
async def test_a_tls_worker_given_no_host_is_reached_where_it_reaches_the_scheduler(s):
    """The same over shmref+tls:// (distributed applies its rule to tls://). Before: the
    machine's external address."""
    assert s.address.startswith("shmref+tls://127.0.0.1:")
    assert await _worker_hosts(s, TLS_SECURITY) == ("127.0.0.1", "127.0.0.1")


@needs_tls
@gen_test()
async def test_plain_shmref_is_refused_when_encryption_is_required():
    """require_encryption refuses shmref:// (unencrypted) as it refuses tcp://."""
    args = TLS_SECURITY.get_connection_args("client")
    async with listen("shmref+tls://127.0.0.1:0", lambda comm: comm.close(),
                      **TLS_SECURITY.get_listen_args("scheduler")) as lst:
        host = lst.contact_address.split("://", 1)[1]
        with pytest.raises(RuntimeError, match="encryption required"):
            await connect("shmref://" + host, **args)


def test_both_schemes_are_found_without_importing_shmref_dask():
    """A worker a nanny starts imports nothing of ours: distributed finds shmref:// and
    shmref+tls:// by the package's entry points (distributed.comm.backends)."""
    import subprocess
    import sys
    code = ("import sys\n"
            "from distributed.comm.registry import get_backend\n"
            "print(type(get_backend('shmref')).__name__, type(get_backend('shmref+tls')).__name__)\n"
            "print('shmref.dask' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ShmrefBackend", "ShmrefTLSBackend", "True"], out.stdout
