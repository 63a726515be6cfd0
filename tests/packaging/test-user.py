# SPDX-License-Identifier: MIT
"""test-user.py: what test-user.sh runs, as a user would, with the python of a fresh venv
that holds nothing but the installed wheel (and numpy; dask and distributed for --dask).
No socket is named and autostart is on: the first connect starts the uid's private shmrefd.

  - the Python examples of README.md, docs/install.md and docs/python.md, as written (the
    first of python.md in two processes, split at its "# another process" line, the
    descriptor passed on the command line as `ref_text`);
  - a 3-stage multiprocessing pipeline of 200 MB arrays (produce, add one, check) through
    bounded Queues, with fork and with spawn: every array arrives by reference, as a
    read-only mapping of a shmref buffer, with the values sent;
  - ProcessPoolExecutor: 200 MB arrays (shmref.shared) to a worker and its results
    (leased there by the default client) back, one at a time, by reference both ways;
  - two processes of the user hand 200 arrays over through the default client
    (Client.empty, publish, the descriptor through a Queue, acquire, release): after a
    warm-up the daemon reads no message for them (its status counter), the users' default
    of issue 28's same-tenant table;
  - with --dask: a LocalCluster(protocol="shmref://") of 2 worker processes moves a 64 MiB
    array from one worker to the other and to the client, intact: its frames are counted as
    sent and received by reference (shmref.dask.stats), none as large frames over TCP.

Prints one line per check, "PASS name" or "FAIL name: why" (test-user.sh counts them), and
"DAEMON pid" for each private daemon seen (test-user.sh stops them at the end).
Usage: python test-user.py DOCS_DIR [--dask]
"""
import multiprocessing as mp
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import shmref

MB200 = 200_000_000 // 8          # float64 elements of a 200 MB array
ITEMS = 3                         # arrays through the pipeline per start method


def report(ok, name, why=""):
    """One line; of a traceback, its last line (the exception and its message)."""
    lines = [line.strip() for line in str(why).strip().splitlines() if line.strip()]
    why = lines[-1] if lines and lines[0].startswith("Traceback") else " ".join(lines)
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else ": " + why), flush=True)
    return ok


def by_reference(x):
    """x is a mapping of a shmref buffer (what arrives when a pickle went by reference)."""
    return shmref._shmref._buffer_info(x) is not None


# ---- the docs' examples ----

FENCE = re.compile(r"^```python([^\n]*)\n(.*?)^```\s*$", re.S | re.M)


def python_blocks(path):
    return [m.group(2) for m in FENCE.finditer(open(path, encoding="utf-8").read())]


def run_py(code, *args, timeout=180):
    with tempfile.TemporaryDirectory() as d:
        f = os.path.join(d, "example.py")
        with open(f, "w") as out:
            out.write(code)
        return subprocess.run([sys.executable, f, *args], cwd=d, capture_output=True, text=True, timeout=timeout)


def check_example(name, code, expect, *args):
    try:
        r = run_py(code, *args)
    except subprocess.TimeoutExpired:
        return report(False, name, "timed out")
    ok = r.returncode == 0 and expect in r.stdout
    report(ok, name, f"exit {r.returncode}, wanted {expect!r} in stdout {r.stdout[-300:]!r}, "
                     f"stderr {r.stderr.strip()[-600:]!r}")
    return r


def docs(docs_dir):
    readme = [b for b in python_blocks(os.path.join(docs_dir, "README.md")) if "consumer sum" in b]
    if report(len(readme) == 1, "README.md has its Python example"):
        check_example("README.md's Python example (hello.py)", readme[0], "consumer sum: 1500000.0")
    install = python_blocks(os.path.join(docs_dir, "docs", "install.md"))
    if report(len(install) >= 1, "docs/install.md has its Python example"):
        check_example("docs/install.md's three lines", install[0], "1000.0")
    blocks = python_blocks(os.path.join(docs_dir, "docs", "python.md"))
    if not report(len(blocks) >= 2, "docs/python.md has its two Python examples", f"{len(blocks)} found"):
        return
    producer, _, consumer = blocks[0].partition("# another process")
    r = check_example("docs/python.md's first example, the producer", producer, "shmref1:")
    ref = r.stdout.split()[-1] if r and r.returncode == 0 and r.stdout.split() else ""
    if ref:
        consumer = "import sys, numpy as np, shmref\nref_text = sys.argv[1]\n" + consumer
        check_example("docs/python.md's first example, the consumer (another process)", consumer, "b'run 7'", ref)
    check_example("docs/python.md's ProcessPoolExecutor example", blocks[1], "[0. 2. 4.]")


def settle(before, limit=64 << 20, seconds=75):
    """Waits until the daemon holds less than limit bytes: a check that failed may leave
    arrays retained for a receiver that never came (PICKLE_KEEP, 60 s), which would count
    against the next check's quota."""
    t0 = time.monotonic()
    held = -1
    try:
        c = shmref.default_client()
        while time.monotonic() - t0 < seconds:
            held = c.status()["pool"]["bytes_leased"]
            if held < limit:
                break
            time.sleep(0.5)
    except Exception as e:
        print(f"    before {before}: no daemon status: {e!r}", flush=True)
    if time.monotonic() - t0 > 1:
        print(f"    before {before}: waited {time.monotonic() - t0:.0f} s for the daemon to hold less "
              f"(then {held} bytes)", flush=True)


# ---- a 3-stage pipeline of 200 MB arrays ----

def produce(q_out, results):
    try:
        c = shmref.default_client()
        for i in range(ITEMS):
            a = c.empty((MB200,), "float64")
            a[:] = i
            q_out.put(a)
            del a
        q_out.put(None)
        results.put(("stage1", "ok", c.daemon_pid))
    except BaseException:
        traceback.print_exc()
        q_out.put(None)
        results.put(("stage1", traceback.format_exc(), None))


def add_one(q_in, q_out, results):
    try:
        c = shmref.default_client()
        refs = 0
        while True:
            x = q_in.get()
            if x is None:
                break
            refs += by_reference(x) and not x.flags.writeable
            out = c.empty(x.shape, x.dtype)
            np.add(x, 1, out=out)
            del x
            q_out.put(out)
            del out
        q_out.put(None)
        results.put(("stage2", "ok" if refs == ITEMS else f"{refs} of {ITEMS} arrived by reference, read-only",
                     c.daemon_pid))
    except BaseException:
        traceback.print_exc()
        q_out.put(None)
        results.put(("stage2", traceback.format_exc(), None))


def check_all(q_in, results):
    try:
        seen = []
        while True:
            y = q_in.get()
            if y is None:
                break
            good = by_reference(y) and y.shape == (MB200,) and y[0] == y[-1] == len(seen) + 1
            seen.append(bool(good))
            del y
        ok = seen == [True] * ITEMS
        results.put(("stage3", "ok" if ok else f"arrays right and by reference: {seen}",
                     shmref.default_client().daemon_pid))
    except BaseException:
        traceback.print_exc()
        results.put(("stage3", traceback.format_exc(), None))


def pipeline(method):
    ctx = mp.get_context(method)
    q1, q2, results = ctx.Queue(1), ctx.Queue(1), ctx.Queue()
    procs = [ctx.Process(target=produce, args=(q1, results)), ctx.Process(target=add_one, args=(q1, q2, results)),
             ctx.Process(target=check_all, args=(q2, results))]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    got = {}
    deadline = time.monotonic() + 240
    while len(got) < 3 and time.monotonic() < deadline:
        try:
            m = results.get(timeout=1)
        except Exception:
            if all(p.exitcode is not None for p in procs) and results.empty():
                break
            continue
        got[m[0]] = m[1:]
        if m[1] != "ok":
            # A stage that failed leaves the one before it blocked on a full queue: the
            # others get a few seconds to report, then are stopped.
            deadline = min(deadline, time.monotonic() + 5)
    for p in procs:
        p.join(max(0.1, min(30, deadline - time.monotonic())))
        if p.is_alive():
            p.kill()
            p.join(5)
    name = f"3-stage pipeline of {ITEMS} 200 MB arrays, {method}: each arrives by reference, right"
    codes = [p.exitcode for p in procs]
    why = []
    for k in ("stage1", "stage2", "stage3"):
        status, pid = got.get(k, (None, None))
        if pid:
            print("DAEMON", pid, flush=True)
        if status is None:
            why.append(f"{k} sent no report (exit {codes[int(k[-1]) - 1]}: -9 is stopped here, as blocked)")
        elif status != "ok":
            lines = [line.strip() for line in status.strip().splitlines() if line.strip()]
            why.insert(0, f"{k}: {lines[-1]}")   # a stage's own failure first
    report(not why and codes == [0, 0, 0], name, "; ".join(why) or f"exit codes {codes}")
    print(f"    {name}: {time.monotonic() - t0:.1f} s", flush=True)


# ---- ProcessPoolExecutor ----

def double(x):
    out = shmref.default_client().empty(x.shape, x.dtype)
    np.multiply(x, 2, out=out)
    return by_reference(x), out


def pool():
    got = []
    try:
        with ProcessPoolExecutor(2) as ex:
            for i in (1, 2):         # one at a time: 400 MB held at most
                x = shmref.shared(np.full(MB200, i, dtype=np.float64))
                came, y = ex.submit(double, x).result()
                got.append((came, by_reference(y), float(y[0]), float(y[-1])))
                del x, y
    except Exception:
        return report(False, "ProcessPoolExecutor: 200 MB arrays to workers and back", traceback.format_exc()[-800:])
    ok = got == [(True, True, 2.0 * i, 2.0 * i) for i in (1, 2)]
    report(ok, "ProcessPoolExecutor: 200 MB arrays to workers and back, by reference both ways", str(got))


# ---- same-tenant handoffs send the daemon nothing ----

def _consume(q_in, q_out, rounds):
    c = shmref.default_client()
    for i in range(rounds):
        b = c.acquire(q_in.get())
        q_out.put(b.shape == (1000,) and bool(np.array_equal(b, np.arange(1000.0) + i)))
        c.release(b)
    q_in.get()      # the producer has read the daemon's counters


def table():
    """As test_table.py's two-process test, with the default client of a fresh venv."""
    name = "200 handoffs between two processes of this user send the daemon no message"
    warm, rounds = 50, 200
    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_consume, args=(q_in, q_out, warm + rounds))
    p.start()
    try:
        c = shmref.default_client()
        right = 0
        for i in range(warm + rounds):
            if i == warm:
                m0 = c.status()["counters"]["messages"]
                per_status = c.status()["counters"]["messages"] - m0
                m0 += per_status
            a = c.empty(1000, "float64")
            a[:] = np.arange(1000.0) + i
            q_in.put(str(c.publish(a)))
            right += q_out.get(timeout=60)
            c.release(a)
        sent = c.status()["counters"]["messages"] - m0 - per_status
    except Exception:
        return report(False, name, traceback.format_exc()[-800:])
    finally:
        q_in.put(None)
        p.join(60)
    report(right == warm + rounds and p.exitcode == 0 and sent == 0, name,
           f"{sent} messages (a status call is {per_status}), {right} of {warm + rounds} arrays right, "
           f"consumer exit {p.exitcode}")


# ---- Dask ----

def make(n):
    return np.arange(n, dtype=np.float64)


def facts(x):
    return by_reference(x), float(x[-1])


def dask():
    from distributed import Client, LocalCluster
    import shmref.dask as sd
    n = 64 * 2**20 // 8
    try:
        with LocalCluster(protocol="shmref://", n_workers=2, threads_per_worker=1, processes=True,
                          dashboard_address=None, host="127.0.0.1") as cluster, Client(cluster) as client:
            w = sorted(client.scheduler_info()["workers"])
            a = client.submit(make, n, workers=w[:1], pure=False)
            got = client.submit(facts, a, workers=w[1:], pure=False).result()
            local = a.result()
            st = client.run(sd.stats)
            me = sd.stats()
            for s in st.values():
                print("    worker", {k: s[k] for k in ("mode", "sent_by_ref", "sent_bytes_by_ref", "received_by_ref",
                                                        "sent_large_tcp")}, flush=True)
    except Exception:
        return report(False, "Dask LocalCluster(protocol='shmref://')", traceback.format_exc()[-1200:])
    # What arrives: the values sent (a mapping, or since issue 27 item 3b, a writable copy out
    # of it when the sender's array was writable, as a tcp:// receive makes one).
    print(f"    Dask: arrived on the other worker as a shmref mapping: {got[0]}, in the client: "
          f"{by_reference(local)}", flush=True)
    report(got[1] == float(n - 1) and local[-1] == n - 1 and local.shape == (n,),
           "Dask: a 64 MiB array reaches the other worker and the client intact", f"{got}, {local[-1]}")
    report(all(s["mode"] == "shmref" for s in st.values()), "Dask: every worker reached the private daemon",
           str({k: s["mode"] for k, s in st.items()}))
    # Worker to worker, then to the client from whichever worker holds it.
    sent = {k: sum(s[k] for s in st.values()) for k in ("sent_by_ref", "sent_bytes_by_ref")}
    report(sent["sent_by_ref"] >= 2 and sent["sent_bytes_by_ref"] >= 2 * n * 8,
           "Dask: the large frames are counted as sent by reference (to the worker and the client)", str(sent))
    report(st[w[1]]["received_by_ref"] >= 1 and me["received_by_ref"] >= 1,
           "Dask: and as received by reference", f"worker {st[w[1]]['received_by_ref']}, client {me['received_by_ref']}")
    report(all(s["sent_large_tcp"] == 0 for s in st.values()), "Dask: no large frame went over TCP",
           str({k: s["sent_large_tcp"] for k, s in st.items()}))


def main():
    docs_dir = sys.argv[1]
    run = os.environ.get("XDG_RUNTIME_DIR")
    where = os.path.join(run, "shmref") if run else f"/tmp/shmref-{os.getuid()}"
    try:
        c = shmref.connect()
        print("DAEMON", c.daemon_pid, flush=True)
        report(os.path.exists(os.path.join(where, "shmrefd.sock")),
               f"connect() with no socket named started the private daemon in {where}", os.listdir(where)
               if os.path.isdir(where) else f"no {where}")
        c.close()
    except Exception:
        report(False, "connect() with no socket named", traceback.format_exc()[-800:])
        return
    try:
        d = shmref.default_client()
        print("DAEMON", d.daemon_pid, flush=True)
        report(True, "default_client() reaches the private daemon")
    except Exception:
        report(False, "default_client() reaches the private daemon", traceback.format_exc()[-800:])
    docs(docs_dir)
    for method in ("fork", "spawn"):
        settle(f"the {method} pipeline")
        pipeline(method)
    settle("ProcessPoolExecutor")
    pool()
    settle("the table")
    table()
    if "--dask" in sys.argv[2:]:
        settle("Dask")
        dask()


if __name__ == "__main__":
    main()
