# SPDX-License-Identifier: MIT
"""The private daemon (client-lib/autostart.c) through the Python entry points, run the way
users run them: no socket named, SHMREF_AUTOSTART not set to 0, no daemon answering at the
default socket. One rule finds or starts the daemon for every entry point (DESIGN 12):
shmref.connect() with no socket, and the process's default client behind unpickling,
shared(), encode/decode. A path given explicitly is a choice and never starts one.

Each test runs its processes with an XDG_RUNTIME_DIR of its own (a temporary directory),
SHMREF_DAEMON naming this build's shmrefd, and stops the daemon they started (the one
whose socket is in that directory) at the end; nothing else is touched. A system daemon
answering at /run/shmrefd/shmrefd.sock would be preferred by the rule: then they skip."""
import os
import shutil
import signal
import socket as socketlib
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SYSTEM_SOCKET = "/run/shmrefd/shmrefd.sock"


def _system_daemon_answers() -> bool:
    s = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_SEQPACKET)
    try:
        s.connect(SYSTEM_SOCKET)
        return True
    except OSError:
        return False
    finally:
        s.close()


@pytest.fixture
def runtime_dir():
    """A private XDG_RUNTIME_DIR; at the end, the daemon started in it is stopped (only
    a shmrefd whose command line names this directory) and the directory removed."""
    if not os.environ.get("SHMREFD_BIN"):
        pytest.fail("SHMREFD_BIN is not set: run through ctest (./scripts/test) or python/tests/run.sh")
    if _system_daemon_answers():
        pytest.skip(f"a system shmrefd answers at {SYSTEM_SOCKET}: the rule prefers it to a private one")
    d = tempfile.mkdtemp(prefix="shmref-autostart-")
    os.chmod(d, 0o700)
    yield d
    for pid in _daemons_in(d):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        for _ in range(200):
            if not os.path.exists(f"/proc/{pid}"):
                break
            time.sleep(0.05)
    shutil.rmtree(d, ignore_errors=True)


def _daemons_in(d):
    """The pids of shmrefd processes whose command line names directory d."""
    found = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if args and os.path.basename(args[0]) == b"shmrefd" and any(d.encode() in a for a in args):
            found.append(int(p))
    return found


def run_user(code, runtime, **env):
    """code in a fresh interpreter with the environment a user has: no socket named, no
    SHMREF_AUTOSTART, XDG_RUNTIME_DIR the test's own."""
    e = {k: v for k, v in os.environ.items() if k not in ("SHMREFD_SOCKET", "SHMREF_AUTOSTART")}
    e.update(XDG_RUNTIME_DIR=runtime, SHMREF_DAEMON=os.environ["SHMREFD_BIN"], SHMREF_IDLE_EXIT_S="60", **env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e, capture_output=True, text=True,
                          timeout=120, cwd=HERE)


def test_the_default_client_starts_the_private_daemon_as_connect_does(runtime_dir):
    """Before: default_client() connected to the default path named explicitly, which
    turns the private daemon off: FileNotFoundError where shmref.connect() worked, so
    unpickling, shared() and encode/decode failed in a process with no daemon set up."""
    r = run_user("""
        import os, pickle
        from multiprocessing.reduction import ForkingPickler
        import numpy as np
        import shmref
        c = shmref.default_client()
        print("daemon", c.daemon_pid, flush=True)
        assert shmref.default_client() is c                      # made once
        x = shmref.shared(np.arange(10.0))                       # through the default client
        b = pickle.loads(ForkingPickler.dumps(x))                # unpickling acquires through it
        assert b.tolist() == list(range(10)), b
        y = shmref.decode(shmref.encode({"a": np.ones(100_000)}))["a"]
        assert float(y.sum()) == 100_000.0
        with shmref.connect() as c2:                             # the same rule, the same daemon
            assert c2.daemon_pid == c.daemon_pid
            # the socket that answered, not the default path where nothing is
            assert c2.socket == c.socket == c2.status()["daemon"]["socket"], (c2.socket, c2.status()["daemon"])
        print("ok", flush=True)
    """, runtime_dir)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert "ok" in r.stdout
    pid = int(r.stdout.split("daemon ")[1].split()[0])
    assert _daemons_in(runtime_dir) == [pid], "the daemon it reached is the private one it started"
    assert os.path.exists(os.path.join(runtime_dir, "shmref", "shmrefd.sock"))


def test_a_socket_named_or_autostart_off_starts_no_daemon(runtime_dir):
    """The other half of the rule, for the default client as for connect(): a path given
    explicitly (even the default one) is a choice, and SHMREF_AUTOSTART=0 turns the
    private daemon off; both fail with FileNotFoundError and start nothing."""
    r = run_user("""
        import os
        import shmref
        for name in (os.path.join(os.environ["XDG_RUNTIME_DIR"], "none.sock"), shmref.default_socket()):
            for fn in (shmref.connect, shmref.default_client):
                try:
                    fn(name)
                    print("connected", fn.__name__, name)
                except FileNotFoundError:
                    pass
        print("done", flush=True)
    """, runtime_dir)
    assert r.returncode == 0 and r.stdout.strip() == "done", (r.returncode, r.stdout, r.stderr)
    r = run_user("""
        import shmref
        for fn in (shmref.connect, shmref.default_client):
            try:
                fn()
                print("connected", fn.__name__)
            except FileNotFoundError:
                pass
        print("done", flush=True)
    """, runtime_dir, SHMREF_AUTOSTART="0")
    assert r.returncode == 0 and r.stdout.strip() == "done", (r.returncode, r.stdout, r.stderr)
    assert not os.path.exists(os.path.join(runtime_dir, "shmref")), os.listdir(runtime_dir)
    assert _daemons_in(runtime_dir) == []


def test_the_dask_backend_starts_the_private_daemon_as_connect_does(runtime_dir):
    """shmref:// with no socket configured follows the same rule: frames go by reference
    through the private daemon. Before: the backend connected to the default path named
    explicitly, found nothing there, and sent every frame over TCP ('no shmrefd
    reachable')."""
    pytest.importorskip("distributed", reason="dask.distributed is not installed (shmref[dask])")
    r = run_user("""
        import numpy as np
        from distributed import Client, LocalCluster
        import shmref.dask as sd
        with LocalCluster(protocol="shmref://", n_workers=1, threads_per_worker=1, processes=False,
                          dashboard_address=":0", host="127.0.0.1") as cl, Client(cl) as c:
            x = c.submit(np.arange, 1 << 20, pure=False).result()   # an 8 MiB frame back to us
            assert x.sum() == (1 << 20) * ((1 << 20) - 1) // 2
            st = sd.stats()
        print("mode", st["mode"], "by_ref", st["received_by_ref"], "socket", st["socket"], flush=True)
    """, runtime_dir, DASK_DISTRIBUTED__COMM__SHMREF__RETENTION="5s")
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-3000:])
    words = r.stdout.split()
    assert words[1] == "shmref" and int(words[3]) > 0, (r.stdout, r.stderr[-3000:])
    assert words[5] == os.path.join(runtime_dir, "shmref", "shmrefd.sock"), r.stdout
    assert len(_daemons_in(runtime_dir)) == 1


def test_a_pipeline_of_150_mb_arrays_fits_the_private_daemon(runtime_dir):
    """Three stages in three processes hand 150 MB arrays on through queues (by
    reference). The private daemon has one tenant, so its quota is its pool, sized for
    the user (issue 25 item 2). Before: QuotaExceeded, 'raise it with --tenant-quota',
    a flag a private daemon cannot be given. Up to 1.2 GB are held at once: skipped where a
    quarter of MemAvailable (the pool's share of RAM) is less."""
    with open("/proc/meminfo") as f:
        avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    if avail // 4 < 1_300_000_000:
        pytest.skip(f"MemAvailable {avail} bytes: a private pool (a quarter of it) cannot hold the pipeline's 1.2 GB")
    r = run_user("""
        import multiprocessing as mp
        import numpy as np
        import shmref
        N = 150_000_000 // 8
        def stage(fn):
            def run(qi, qo, out, done):
                try:
                    fn(qi, qo)
                    done.wait(60)   # a stage keeps what it made until the pipeline is done
                except BaseException as e:
                    out.put(f"{type(e).__name__}: {e}")
            return run
        held = []
        @stage
        def produce(qi, qo):
            for i in range(4):
                held.append(shmref.shared(np.full(N, float(i))))
                qo.put(held[-1])
            qo.put(None)
        @stage
        def double(qi, qo):
            while (a := qi.get()) is not None:
                held.append(shmref.shared(a * 2))
                qo.put(held[-1])
                del a
            qo.put(None)
        @stage
        def total(qi, qo):
            s = 0.0
            while (a := qi.get()) is not None:
                s += float(a[::1000].sum())
                del a
            qo.put(s)
        if __name__ == "__main__":
            ctx = mp.get_context("fork")
            q1, q2, out, done = ctx.Queue(), ctx.Queue(), ctx.Queue(), ctx.Event()
            ps = [ctx.Process(target=produce, args=(None, q1, out, done)),
                  ctx.Process(target=double, args=(q1, q2, out, done)),
                  ctx.Process(target=total, args=(q2, out, out, done))]
            for p in ps:
                p.start()
            s = out.get(timeout=90)
            done.set()
            if isinstance(s, str):
                for p in ps:
                    p.kill()
                raise SystemExit("a stage failed: " + s)
            for p in ps:
                p.join(30)
            assert s == 2 * (0 + 1 + 2 + 3) * len(range(0, N, 1000)), s
            print("ok", flush=True)
    """, runtime_dir)
    assert r.returncode == 0 and "ok" in r.stdout, (r.returncode, r.stdout, r.stderr[-3000:])


def test_doctor_says_which_daemon_and_its_limits(runtime_dir):
    """python -m shmref doctor runs shmrefctl which (libshmref's own rule, as connect()
    applies it): the socket, why, and once the daemon runs its pid, uid, pool and quota."""
    r = run_user("""
        import subprocess, sys
        before = subprocess.run([sys.executable, "-m", "shmref", "doctor"], capture_output=True, text=True)
        import shmref
        c = shmref.connect()
        after = subprocess.run([sys.executable, "-m", "shmref", "doctor"], capture_output=True, text=True)
        print(before.returncode, after.returncode, c.daemon_pid)
        print(before.stdout + before.stderr)
        print(after.stdout + after.stderr)
    """, runtime_dir)
    assert r.returncode == 0, (r.stdout, r.stderr)
    first = r.stdout.split("\n", 1)[0].split()
    sock = os.path.join(runtime_dir, "shmref", "shmrefd.sock")
    assert first[:2] == ["0", "0"], r.stdout
    assert f"socket: {sock}" in r.stdout and "not running: the next connect starts it" in r.stdout, r.stdout
    assert f"pid: {first[2]}, uid {os.getuid()}" in r.stdout and "tenant quota: " in r.stdout, r.stdout
