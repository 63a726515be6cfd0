# SPDX-License-Identifier: MIT
"""shmref.dask, the shmref:// comm backend, with real dask.distributed clusters (worker
processes) against a real shmrefd: results equal to tcp://, frames by reference counted
by the daemon, SIGKILLed workers, a worker behind another network namespace, spilling."""
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest

distributed = pytest.importorskip("distributed", reason="dask.distributed is not installed (shmref[dask])")
pd = pytest.importorskip("pandas")
pa = pytest.importorskip("pyarrow")

from distributed import Client, LocalCluster  # noqa: E402

import shmref  # noqa: E402
import shmref.dask as sd  # noqa: E402
from conftest import Daemon  # noqa: E402

MiB = 1 << 20
NOTHING = {"live": 0, "leases": 0, "published": 0, "retained": 0, "bytes_leased": 0}


# ---- functions the workers run (module level: pickled by reference for the workers) ----

def make_array(n, seed):
    return np.random.default_rng(seed).standard_normal(n)


def array_facts(x):
    """(backed by a shmref mapping, writable, digest of the bytes) of what a task received
    (a digest, not a sum: numpy's float sums depend on the memory's alignment)."""
    return (shmref._shmref._buffer_info(x) is not None, bool(x.flags.writeable),
            hashlib.sha256(np.ascontiguousarray(x).view(np.uint8)).hexdigest())


def frame_of(n, seed):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"a": rng.integers(0, 1000, n), "b": rng.standard_normal(n),
                         "c": [f"s{i % 97}" for i in range(n)]})


def arrow_frame_of(n, seed):
    return frame_of(n, seed).astype({"a": "int64[pyarrow]", "b": "double[pyarrow]", "c": "string[pyarrow]"})


def identity(x):
    return x


def objects(n):
    return {"blob": bytes(range(256)) * (n // 256), "list": list(range(1000)), "nested": {"t": (1, "x", 2.5)}}


def worker_pids(dask_worker):
    return os.getpid()


def stats(dask_worker=None):
    return sd.stats()


# ---- fixtures ----

def daemon_counters(d):
    s = d.status()
    return {k: s["counters"][k] for k in ("leases", "publishes", "acquires")}


def held(d):
    """What the daemon holds for anyone: leases and published buffers, retained ones, bytes."""
    s = d.status()
    b = s["buffers"]
    return {"live": b["live"], "leases": b["leases"], "published": b["published"], "retained": b["retained"],
            "bytes_leased": s["pool"]["bytes_leased"]}


def nothing_held(d, seconds=20.0):
    deadline = time.monotonic() + seconds
    while True:
        h = held(d)
        if not any(h.values()) or time.monotonic() > deadline:
            return h
        time.sleep(0.1)


@pytest.fixture(scope="module")
def dask_env(daemon):
    """Worker processes inherit these: the daemon's socket (conftest), a short retention,
    so a frame whose receiver died is gone within seconds, and writable false: the tests
    here look at the mappings themselves (read-only views, no copy out of them);
    test_dask_semantics.py tests the default (objects writable as over tcp://)."""
    env = {"DASK_DISTRIBUTED__COMM__SHMREF__RETENTION": "3s", "DASK_DISTRIBUTED__COMM__SHMREF__WRITABLE": "False"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import dask
    dask.config.refresh()
    yield daemon
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    dask.config.refresh()


def cluster(protocol, n=3, **kw):
    return LocalCluster(protocol=protocol, n_workers=n, threads_per_worker=1, processes=True,
                        dashboard_address=":0", host="127.0.0.1", **kw)


@pytest.fixture(scope="module")
def clusters(dask_env):
    with cluster("tcp://") as tcp, cluster("shmref://") as shm, Client(tcp) as ct, Client(shm) as cs:
        yield ct, cs
    assert nothing_held(dask_env) == NOTHING


def run_both(clusters, fn):
    ct, cs = clusters
    return fn(ct), fn(cs)


# ---- results identical to tcp:// ----

def transfer(c, make, *args):
    """make(*args) on worker 0, then identity on worker 1 (a worker-to-worker transfer),
    then gathered by the client (a worker-to-client transfer)."""
    w = sorted(c.scheduler_info()["workers"])
    a = c.submit(make, *args, workers=[w[0]], pure=False)
    b = c.submit(identity, a, workers=[w[1]], pure=False)
    return b.result()


def test_numpy_identical(clusters):
    t, s = run_both(clusters, lambda c: transfer(c, make_array, 2 * MiB // 8, 1))
    assert np.array_equal(t, s)
    ct, cs = clusters
    before = {k: v["received_by_ref"] for k, v in cs.run(stats).items()}
    w = sorted(cs.scheduler_info()["workers"])
    x = cs.submit(make_array, 4 * MiB // 8, 7, workers=[w[0]], pure=False)
    on_tcp = ct.submit(array_facts, ct.submit(make_array, 4 * MiB // 8, 7, pure=False)).result()
    facts = cs.submit(array_facts, x, workers=[w[1]], pure=False).result()
    # Arrived as a read-only mapping of a shmref buffer, with the same values.
    assert facts == (True, False, on_tcp[2]) and on_tcp[:2] == (False, True)
    after = {k: v["received_by_ref"] for k, v in cs.run(stats).items()}
    assert after[w[1]] > before[w[1]]
    assert all(v["mode"] == "shmref" for v in ct.run(stats).values())  # the process has a daemon...
    assert all(v["comms_by_ref"] == 0 for v in ct.run(stats).values())  # ...but tcp:// never uses it


def test_pandas_identical(clusters):
    t, s = run_both(clusters, lambda c: transfer(c, frame_of, 200_000, 2))
    pd.testing.assert_frame_equal(t, s)


def test_pyarrow_dataframe_identical(clusters):
    t, s = run_both(clusters, lambda c: transfer(c, arrow_frame_of, 200_000, 3))
    assert str(s.dtypes["c"]).startswith("string")
    pd.testing.assert_frame_equal(t, s)


def test_pickled_objects_identical(clusters):
    t, s = run_both(clusters, lambda c: transfer(c, objects, 4 * MiB))
    assert t == s
    t, s = run_both(clusters, lambda c: c.gather(c.scatter({"k": objects(MiB)}, broadcast=True))["k"])
    assert t == s == objects(MiB)


def test_scatter_broadcast_maps_one_copy(clusters, dask_env):
    """scatter(broadcast=True) to 3 workers: the client copies once, the workers forward
    the descriptor, and each task sees the same values from a shmref mapping."""
    _, cs = clusters
    x = np.random.default_rng(5).standard_normal(8 * MiB // 8)
    sd.stats(reset=True)
    [f] = cs.scatter([x], broadcast=True)
    facts = cs.run(lambda dask_worker: array_facts(next(iter(dask_worker.data.values()))))
    assert len(facts) == 3 and all(v == (True, False, array_facts(x)[2]) for v in facts.values()), facts
    st = sd.stats()
    assert st["sent_copied_bytes"] == x.nbytes, st  # the client copied it once
    del f
    assert nothing_held(dask_env)["bytes_leased"] == 0


def test_frames_below_threshold_never_touch_shmref(clusters, dask_env):
    _, cs = clusters
    c0 = daemon_counters(dask_env)
    w = sorted(cs.scheduler_info()["workers"])
    for i in range(5):
        a = cs.submit(make_array, 4096, i, workers=[w[0]], pure=False)     # 32 KiB < 64 KiB
        r = cs.submit(array_facts, a, workers=[w[1]], pure=False).result()
        assert r[0] is False and r[1] is True  # plain TCP frames: a writable copy, as tcp:// gives
        assert cs.submit(frame_of, 500, i, workers=[w[2]], pure=False).result().shape == (500, 3)
    assert daemon_counters(dask_env) == c0
    # The control: one frame above the threshold costs the daemon a lease and an acquire.
    a = cs.submit(make_array, 128 * 1024 // 8, 9, workers=[w[0]], pure=False)
    assert cs.submit(array_facts, a, workers=[w[1]], pure=False).result()[0] is True
    c1 = daemon_counters(dask_env)
    assert c1["leases"] > c0["leases"] and c1["acquires"] > c0["acquires"]


# ---- workers that die mid-transfer ----

def test_sigkill_mid_transfer_leaves_nothing_held(dask_env):
    """Two deaths: a receiver stopped before it read a descriptor (the frame waits in the
    daemon's retention, then expires), and a receiver that holds mappings. After each, and
    once the cluster is closed, the daemon holds nothing."""
    with cluster("shmref://", n=2) as cl, Client(cl) as c:
        pids = c.run(worker_pids)
        (wa, pa_), (wb, pb) = sorted(pids.items())
        x = np.ones(16 * MiB // 8)
        # 1. Worker B holds a mapping of x; SIGKILL: the daemon drops its hold at once.
        [f] = c.scatter([x], workers=[wb])
        assert c.submit(array_facts, f, workers=[wb], pure=False).result()[0] is True
        h = held(dask_env)
        assert h["bytes_leased"] == x.nbytes and h["live"] == 1, h  # B's mapping, nothing else
        os.kill(pb, signal.SIGKILL)
        assert nothing_held(dask_env, 15) == NOTHING
        del f
        # 2. Worker A stopped: the client's descriptor is on the wire, the frame published
        #    for one consumer that never comes. SIGKILL A; the retention (3 s) ends it.
        c.scatter([1], workers=[wa], direct=True)  # the client's comm to A exists (pooled)
        os.kill(pa_, signal.SIGSTOP)
        # (the scatter blocks on the stopped worker: it runs aside)
        t = threading.Thread(target=lambda: _try(lambda: c.scatter([x * 2], workers=[wa], direct=True)), daemon=True)
        t.start()
        deadline = time.monotonic() + 15
        while held(dask_env)["retained"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert held(dask_env)["retained"] == 1  # published, held by nobody: waiting for A
        os.kill(pa_, signal.SIGKILL)
        assert nothing_held(dask_env, 20) == NOTHING
    assert nothing_held(dask_env) == NOTHING
    assert dask_env.status()["counters"]["retentions_expired"] >= 1


def _try(fn):
    try:
        fn()
    except Exception:
        pass


# ---- spilling ----

def spill_one(dask_worker):
    """Spills every key this worker holds; (keys on disk, bytes written)."""
    data = dask_worker.data
    n = 0
    while data.fast:
        data.evict()
        n += 1
    return sorted(map(str, data.slow)), n


def test_spill_releases_the_mapping(dask_env):
    """A key that lives in a shmref mapping counts as managed memory, spills to disk (the
    lease is released: the daemon holds nothing) and reads back equal."""
    with cluster("shmref://", n=2, memory_limit="2 GiB") as cl, Client(cl) as c:
        w = sorted(c.scheduler_info()["workers"])
        x = np.random.default_rng(11).standard_normal(16 * MiB // 8)
        [f] = c.scatter([x], workers=[w[0]])
        y = c.submit(identity, f, workers=[w[1]], pure=False)  # w1 maps it from w0
        y.result()
        del f  # w0 drops its copy: w1's mapping is the only holder
        deadline = time.monotonic() + 10
        while held(dask_env)["bytes_leased"] != x.nbytes and time.monotonic() < deadline:
            time.sleep(0.05)
        assert held(dask_env)["bytes_leased"] == x.nbytes
        managed = c.run(lambda dask_worker: dask_worker.data.fast.total_weight, workers=[w[1]])[w[1]]
        assert managed >= x.nbytes  # Dask counts the mapped array as managed memory
        keys, n = c.run(spill_one, workers=[w[1]])[w[1]]
        assert keys == [y.key] and n == 1
        assert nothing_held(dask_env)["bytes_leased"] == 0  # the lease went with the spill
        assert np.array_equal(y.result(), x)


# ---- the Dask CLI, a worker without a daemon ----

def _wait_line(proc, pattern, seconds=60):
    deadline = time.monotonic() + seconds
    lines = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            if proc.poll() is not None:
                break
            continue
        lines.append(line)
        m = re.search(pattern, line)
        if m:
            return m, lines
    raise AssertionError(f"no {pattern!r} in:\n{''.join(lines)}")


def _output(p):
    try:
        return p.communicate(timeout=30)[1]
    except subprocess.TimeoutExpired:
        p.kill()
        return p.communicate()[1]


def _spawn(args, env):
    return subprocess.Popen([sys.executable, "-m", *args], env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            text=True)


HERE = os.path.dirname(os.path.abspath(__file__))


def test_cli_and_worker_without_daemon(dask_env, tmp_path):
    """`dask scheduler --protocol shmref`, `dask worker shmref://...` and Client("shmref://...")
    and nothing else: two workers with the daemon exchange frames by reference; a third
    whose SHMREFD_SOCKET leads nowhere says once that it uses TCP frames, and computes the
    same results."""
    env = {**os.environ, "PYTHONPATH": HERE}
    procs = []
    try:
        s = _spawn(["distributed.cli.dask_scheduler", "--protocol", "shmref", "--host", "127.0.0.1",
                    "--port", "0", "--no-dashboard"], env)
        procs.append(s)
        m, _ = _wait_line(s, r"Scheduler at:\s+(shmref://\S+)")
        addr = m.group(1)
        logs = []
        for sock in (dask_env.socket, dask_env.socket, str(tmp_path / "nobody.sock")):
            w = _spawn(["distributed.cli.dask_worker", addr, "--nthreads", "1", "--no-nanny", "--host", "127.0.0.1"],
                       {**env, "SHMREFD_SOCKET": sock})
            procs.append(w)
            _, lines = _wait_line(w, r"Registered to:")
            logs.append((w, lines))
        with Client(addr) as c:
            c.wait_for_workers(3)
            ws = c.scheduler_info()["workers"]
            modes = c.run(stats)
            tcp_only = [a for a, v in modes.items() if v["mode"] == "tcp"]
            by_ref = sorted(a for a, v in modes.items() if v["mode"] == "shmref")
            assert len(tcp_only) == 1 and len(by_ref) == 2, modes
            n = MiB // 4
            a = c.submit(make_array, n, 3, workers=by_ref[:1], pure=False)
            got = c.submit(array_facts, a, workers=by_ref[1:], pure=False).result()
            plain = c.submit(array_facts, a, workers=tcp_only, pure=False).result()
            assert got[0] is True and plain[0] is False and got[2] == plain[2]
            after = c.run(stats)
            assert after[tcp_only[0]]["received_by_ref"] == 0 and after[tcp_only[0]]["comms_by_ref"] == 0
            assert len(ws) == 3
        for p in procs[::-1]:  # the workers first, then the scheduler
            p.send_signal(signal.SIGTERM)
        text = [_output(p) for p in procs]
        worker_logs = ["".join(lines) + t for (w, lines), t in zip(logs, text[1:])]
        assert [t.count("go by reference") for t in worker_logs] == [1, 1, 0], worker_logs
        assert [t.count("frames travel over TCP") for t in worker_logs] == [0, 0, 1], worker_logs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert nothing_held(dask_env)["bytes_leased"] == 0


# ---- dask's config reset after import (issue 27 item 1) ----

CONFIG_RESET_CHILD = """
import copy, sys
import numpy as np
import dask, distributed
from distributed import Client, LocalCluster
before = copy.deepcopy(dask.config.config)      # a snapshot taken before shmref.dask's import
import shmref.dask as sd
assert dask.config.get("distributed.comm.shmref.threshold") == "64 KiB"
how = sys.argv[1]
if how == "snapshot":                            # what distributed's test harness restores
    dask.config.config.clear()
    dask.config.config.update(before)
elif how == "set":                               # a section of someone else's, without our keys
    dask.config.config["distributed"]["comm"]["shmref"] = {}
try:
    dask.config.get("distributed.comm.shmref" if how == "snapshot" else "distributed.comm.shmref.threshold")
    sys.exit("the reset kept the section")
except KeyError:
    pass
with LocalCluster(protocol="shmref://", n_workers=1, threads_per_worker=1, processes=False,
                  dashboard_address=":0", host="127.0.0.1") as cl, Client(cl) as c:
    x = c.submit(np.arange, 1 << 20, pure=False).result()       # an 8 MiB frame back to us
    assert x.sum() == (1 << 20) * ((1 << 20) - 1) // 2
    st = sd.stats()
print("mode", st["mode"], "received_by_ref", st["received_by_ref"], flush=True)
"""


@pytest.mark.parametrize("how", ["snapshot", "set"])
def test_the_backend_works_after_dask_config_is_reset(dask_env, how):
    """A program (distributed's test harness, or anyone) that puts back dask's config as
    it was before shmref.dask added its defaults, or gives the section none of its keys:
    the backend reads every key with its default. Before: KeyError: 'shmref' at the
    first comm, and no cluster."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_DISTRIBUTED__COMM__SHMREF")}
    r = subprocess.run([sys.executable, "-c", CONFIG_RESET_CHILD, how], env=env, capture_output=True,
                       text=True, timeout=180, cwd=HERE)
    assert r.returncode == 0, (how, r.returncode, r.stdout, r.stderr[-3000:])
    assert "KeyError" not in r.stderr, r.stderr[-3000:]
    m = re.search(r"mode (\w+) received_by_ref (\d+)", r.stdout)
    assert m and m.group(1) == "shmref" and int(m.group(2)) > 0, (r.stdout, r.stderr[-3000:])


# ---- a worker in another network namespace ----

def ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


@pytest.fixture
def netns():
    if shutil.which("ip") is None:
        pytest.skip("no `ip` (iproute2) on this machine")
    tag = uuid.uuid4().hex[:6]
    a, b = f"shmref-da-{tag}", f"shmref-db-{tag}"
    r = ip("netns", "add", a, check=False)
    if r.returncode != 0:
        pytest.skip(f"`ip netns add` is not permitted here: {r.stderr.strip()}")
    try:
        ip("netns", "add", b)
        ip("link", "add", f"da-{tag}", "netns", a, "type", "veth", "peer", "name", f"db-{tag}", "netns", b)
        ip("-n", a, "addr", "add", "10.251.9.1/30", "dev", f"da-{tag}")
        ip("-n", b, "addr", "add", "10.251.9.2/30", "dev", f"db-{tag}")
        for ns, dev in ((a, f"da-{tag}"), (b, f"db-{tag}")):
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "link", "set", "lo", "up")
    except subprocess.CalledProcessError as e:
        ip("netns", "del", a, check=False)
        ip("netns", "del", b, check=False)
        pytest.skip(f"could not make the veth pair: {e.stderr.strip()}")
    yield a, b
    ip("netns", "del", a, check=False)
    ip("netns", "del", b, check=False)


DRIVER = r"""
import json, os, sys
sys.path.insert(0, {here!r})
import numpy as np
from distributed import Client, LocalCluster
import test_dask as t
with LocalCluster(protocol="shmref://", host="10.251.9.1", n_workers=2, threads_per_worker=1,
                  processes=True, dashboard_address=":0") as cl, Client(cl) as c:
    print("ADDR", cl.scheduler_address, flush=True)
    c.wait_for_workers(3, timeout=120)
    ws = sorted(c.scheduler_info()["workers"])
    far = [w for w in ws if w.startswith("shmref://10.251.9.2:")]
    near = [w for w in ws if w not in far]
    out = {{}}
    a = c.submit(t.make_array, 1 << 18, 4, workers=near[:1], pure=False)
    out["near_near"] = c.submit(t.array_facts, a, workers=near[1:], pure=False).result()
    out["near_far"] = c.submit(t.array_facts, a, workers=far, pure=False).result()
    b = c.submit(t.make_array, 1 << 18, 5, workers=far, pure=False)
    out["far_near"] = c.submit(t.array_facts, b, workers=near[:1], pure=False).result()
    out["sums"] = [t.array_facts(t.make_array(1 << 18, 4))[2], t.array_facts(t.make_array(1 << 18, 5))[2]]
    out["stats"] = c.run(t.stats)
    out["far"] = far
    print("RESULT", json.dumps(out), flush=True)
"""


def test_worker_in_another_network_namespace(dask_env, netns):
    """The cluster (scheduler and two workers) in namespace A, a worker in namespace B with
    a shmrefd of its own (another host, as far as the handshake can tell), joined by a
    veth pair: A's workers exchange frames by reference, B talks plain TCP frames with
    them, and every result is the same."""
    a, b = netns
    other = Daemon()
    procs = []
    try:
        env = {**os.environ, "PYTHONPATH": HERE}
        here = HERE
        drv = subprocess.Popen(["ip", "netns", "exec", a, sys.executable, "-c", DRIVER.format(here=here)],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(drv)
        line = drv.stdout.readline()
        assert line.startswith("ADDR "), line + drv.stderr.read() if drv.poll() is not None else line
        addr = line.split()[1]
        w = subprocess.Popen(["ip", "netns", "exec", b, sys.executable, "-m", "distributed.cli.dask_worker", addr,
                              "--nthreads", "1", "--no-nanny", "--host", "10.251.9.2"],
                             env={**env, "SHMREFD_SOCKET": other.socket}, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
        procs.append(w)
        out, err = drv.communicate(timeout=240)
        res = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        assert res, err
        r = json.loads(res[0][7:])
        s4, s5 = r["sums"]
        assert r["near_near"] == [True, False, s4]    # by reference between A's workers
        # Plain TCP frames into B and out of it. (Writability is not asserted: B may fetch
        # from the worker that holds a read-only mapping, and Dask keeps the sender's flag.)
        assert r["near_far"][0] is False and r["near_far"][2] == s4
        assert r["far_near"][0] is False and r["far_near"][2] == s5
        far = r["stats"][r["far"][0]]
        assert far["mode"] == "shmref" and far["comms_by_ref"] == 0 and far["received_by_ref"] == 0, far
        assert far["comms_tcp"] >= 2 and far["sent_by_ref"] == 0
        assert other.status()["counters"]["leases"] == 0  # B's daemon was never asked for one
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        other.stop(check=False)
    assert nothing_held(dask_env)["bytes_leased"] == 0


# ---- a hostile peer ----

def test_bad_descriptors_close_only_that_comm(dask_env):
    """A peer that forges the handshake (claims this daemon) and sends descriptors that
    are not published, lie outside their buffer, or a marker that is not one: the
    receiver closes that comm (CommClosedError) and keeps serving the others."""
    import asyncio

    from distributed.comm import connect, listen
    from distributed.protocol import to_serialize

    bogus = "shmref1:" + "0" * 32 + ":4096"
    x = np.arange(MiB // 8, dtype=np.float64)

    async def main():
        got = []

        async def handle(comm):
            try:
                while True:
                    got.append(await comm.read())
            except Exception as e:  # what the receiver saw
                got.append(type(e).__name__)

        async with listen("shmref://127.0.0.1:0", handle) as lst:
            addr = lst.contact_address

            async def send_forged(entries_for):
                comm = await connect(addr)
                assert comm.by_ref
                comm._to_refs = lambda frames: entries_for(list(frames))
                await comm.write({"x": to_serialize(x)})
                await asyncio.sleep(0.5)
                await comm.close()

            def unpublished(frames):
                i = max(range(len(frames)), key=lambda k: len(memoryview(frames[k]).cast("B")))
                frames[i] = b""
                return [(i, bogus, 0, x.nbytes)], frames

            def outside(frames):
                i = max(range(len(frames)), key=lambda k: len(memoryview(frames[k]).cast("B")))
                c = shmref.connect(dask_env.socket)
                ref = c.share(np.zeros(4096, np.uint8), keep=0)  # a real one, 4 KiB
                frames[i] = b""
                send_forged.keep = (c, ref)
                return [(i, str(ref), 1024, x.nbytes)], frames

            await send_forged(unpublished)
            await send_forged(outside)
            c, ref = send_forged.keep
            # A marker that is not one: a tcp:// comm's message to a shmref:// listener (taken
            # as the handshake, refused there: the handler never sees that comm).
            from distributed.comm.tcp import TCPConnector
            raw = await TCPConnector().connect(addr.replace("shmref://", ""))
            await raw.write({"hello": 1})
            await asyncio.sleep(0.5)
            raw.abort()
            # The listener still serves a well-behaved peer.
            good = await connect(addr)
            await good.write({"x": to_serialize(x)})
            for _ in range(100):
                if got and isinstance(got[-1], dict):
                    break
                await asyncio.sleep(0.05)
            await good.close()
            c.release(ref)
            c.close()
        return got

    got = asyncio.run(main())
    errors = [g for g in got if isinstance(g, str)]
    assert errors == ["CommClosedError", "CommClosedError"], got
    assert isinstance(got[-1], dict) and np.array_equal(got[-1]["x"], x), got
