# SPDX-License-Identifier: MIT
"""The pyarrow rows of issue 10's benchmark (./scripts/bench --arrow runs this after the C
rows): magmalake's measurement, one float64 column of 79,478,796 rows (and a utf8 column
of 10M strings), made by a producer process that holds it in its heap; a consumer process
asks for it and scans every value: sums the float64 values; checks every byte of every
string (ascii_is_alnum: all are letters, so no string ends early; a full scan, not the
offsets only). Timed by the consumer from its
request until the scan's result. Methods:

  c-data-in-process   the floor: one process exports the column through the C Data
                      Interface (PyCapsules) and imports it back, then sums
  shmref-batch        Client.publish_batch (one copy into a lease) in the producer,
                      the Ref over a pipe; acquire_batch + to_pyarrow in the consumer,
                      zero-copy, summed where the bytes lie
  shmref-acquire      the same runs, timed from the Ref's arrival: acquire, export and
                      sum where the bytes lie (the consumer's side, magmalake's row)
  shmref-batch-4k     shmref-batch on a daemon with --pool-hugepages no (4 KiB pages; the
  shmref-acquire-4k   default pool runs on huge pages when the daemon is root)
  ipc-mapping         the producer writes Arrow IPC into a file on /dev/shm (one copy),
                      the path over a pipe; the consumer maps it (pyarrow.memory_map)
                      and reads the IPC zero-copy
  flight-loopback     a pyarrow.flight server in the producer holds the column; the
                      consumer's DoGet over grpc://127.0.0.1

Targets (issue 18): shmref-acquire <= 1.1x c-data-in-process; shmref-batch >= 2x faster
than ipc-mapping (issue 10: >= 1.5x faster than flight-loopback).

Usage: arrow_bench.py --shmrefd PATH [--rows N] [--strings N] [--iterations N] [--json F]
                      [--methods M,...] [--columns f64,utf8]
"""
import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import pyarrow as pa
import pyarrow.compute as pc

MAGMALAKE = {  # their published numbers (Apple M4, one float64 column of 79,478,796 rows), ms
    "c-data-in-process": 89, "shmref-batch": None, "shmref-acquire": 112, "ipc-mapping": 228, "flight-loopback": 149,
}
MAGMALAKE_NOTE = {"shmref-acquire": "theirs: another process through a shared mapping"}


def make_column(kind, n):
    if kind == "f64":
        import numpy as np
        return pa.array(np.arange(n, dtype=np.float64) * 0.5)
    import numpy as np
    lengths = (np.arange(n) % 15) + 1
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    data = np.frombuffer(b"abcdefghijklmnop" * (int(offsets[-1]) // 16 + 1), dtype=np.uint8)[: offsets[-1]]
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data.copy())])


def consume(col):
    """A full scan: every value (utf8: every byte of every string, not only the offsets)."""
    if pa.types.is_floating(col.type):
        return pc.sum(col).as_py()
    return pc.sum(pc.ascii_is_alnum(col)).as_py()   # reads every byte: all are letters


def table_of(col):
    return pa.table({"c": col})


def producer(conn, method, kind, n, socket, workdir):
    """The producer process: makes the column once, then answers each request."""
    col = make_column(kind, n)
    t = table_of(col)
    server = None
    client = None
    if method.startswith("shmref-batch"):
        import shmref
        client = shmref.connect(socket)
    elif method == "flight-loopback":
        import pyarrow.flight as flight

        class Server(flight.FlightServerBase):
            def do_get(self, context, ticket):
                return flight.RecordBatchStream(t)

        server = Server("grpc://127.0.0.1:0")
        conn.send(f"grpc://127.0.0.1:{server.port}")
    prev = None
    while True:
        req = conn.recv()
        if req == "stop":
            break
        if method.startswith("shmref-batch"):
            if prev is not None:
                client.release(prev)      # the consumer has finished with the last one
            prev = client.publish_batch(t)
            conn.send(str(prev))
        elif method == "ipc-mapping":
            path = os.path.join(workdir, f"unit-{req}.arrow")
            with pa.OSFile(path, "wb") as f, pa.ipc.new_file(f, t.schema) as w:
                w.write_table(t)
            conn.send(path)
        elif method == "flight-loopback":
            conn.send("ready")
    if server is not None:
        server.shutdown()
    if client is not None:
        client.close()


class Lane:
    """One method's consumer side: its producer process (if any) and its samples. Lanes of
    one column run interleaved, one iteration of each in turn, so that all of them see the
    same machine (two shared CPUs drift a lot within a minute)."""

    def __init__(self, method, kind, n, socket, workdir):
        self.method, self.times, self.after, self.result = method, [], [], None
        self.p = self.fc = self.client = self.col = None
        if method == "c-data-in-process":
            self.col = make_column(kind, n)
            return
        ctx = mp.get_context("spawn")
        self.here, there = ctx.Pipe()
        self.p = ctx.Process(target=producer, args=(there, method, kind, n, socket, workdir))
        self.p.start()
        if method == "flight-loopback":
            import pyarrow.flight as flight
            self.fc = flight.connect(self.here.recv())
        elif method.startswith("shmref-batch"):
            import shmref
            self.client = shmref.connect(socket)

    def step(self, i):
        """One request and scan; timed unless i == 0 (the warm-up)."""
        if self.col is not None:
            t0 = time.perf_counter()
            got = pa.Array._import_from_c_capsule(*self.col.__arrow_c_array__())
            self.result = consume(got)
            t1 = time.perf_counter()
            if i:
                self.times.append(t1 - t0)
            return
        t0 = time.perf_counter()
        self.here.send(i)
        answer = self.here.recv()
        t1 = time.perf_counter()
        if self.method.startswith("shmref-batch"):
            with self.client.acquire_batch(answer) as b:
                got = b.to_pyarrow().column(0)
            self.result = consume(got)
        elif self.method == "ipc-mapping":
            with pa.memory_map(answer) as src:
                got = pa.ipc.open_file(src).read_all().column(0)
                self.result = consume(got)
            os.unlink(answer)
        else:
            import pyarrow.flight as flight
            got = self.fc.do_get(flight.Ticket(b"c")).read_all().column(0)
            self.result = consume(got)
        t2 = time.perf_counter()
        del got
        if i:
            self.times.append(t2 - t0)
            self.after.append(t2 - t1)

    def stop(self):
        if self.p is not None:
            self.here.send("stop")
            self.p.join(60)
        if self.client is not None:
            self.client.close()
        if self.fc is not None:
            self.fc.close()


def verdict(what, got, met):
    print(f"  {'n/a' if got is None else 'MET' if met else 'MISSED':<8} {what:<72} {got or 'not measured'}")


def print_targets(records):
    """The targets of issue 18 (item 3) and of issue 10, per column and pool, from this run."""
    print("\nTargets (issue 18 item 3: Arrow; ratios of medians), from this run:")
    for kind in ("f64", "utf8"):
        med = {r["method"]: r["median_ms"] for r in records if r["column"] == kind}
        pool = {r["method"]: r["pool"] for r in records if r["column"] == kind}
        floor, ipc, flight = (med.get(m) for m in ("c-data-in-process", "ipc-mapping", "flight-loopback"))
        for sfx in ("", "-4k"):
            acq, batch = med.get("shmref-acquire" + sfx), med.get("shmref-batch" + sfx)
            if batch is None or floor is None:
                continue
            where = f"{kind}, {pool['shmref-batch' + sfx]} pages"
            x = acq / floor
            verdict(f"acquire_batch + full scan <= 1.1x the scan over the C Data Interface ({where})",
                    f"{x:.2f}x ({acq:.1f} ms vs {floor:.1f} ms)", x <= 1.1)
            x = ipc / batch if ipc else None
            verdict(f"publish + acquire + scan >= 2x faster than IPC into /dev/shm ({where})",
                    x and f"{x:.2f}x faster ({batch:.1f} ms vs {ipc:.1f} ms)", x is not None and x >= 2.0)
            x = flight / batch if flight else None
            verdict(f"publish + acquire + scan >= 1.5x faster than Flight, loopback ({where})",
                    x and f"{x:.2f}x faster ({flight:.1f} ms)", x is not None and x >= 1.5)


def start_daemon(binary, sockdir, name, extra=()):
    """A shmrefd on a socket outside /dev/shm (one inside its pool dir keeps a root daemon
    from mounting its private huge-page pool). Returns (process, socket, pool kind)."""
    sock = os.path.join(sockdir, f"{name}.sock")
    logpath = os.path.join(sockdir, f"{name}.log")
    with open(logpath, "wb") as log:
        d = subprocess.Popen([binary, "--socket", sock, "--pool-size", "4G", *extra], stdout=log,
                             stderr=subprocess.STDOUT)
    import shmref
    for _ in range(500):
        try:
            with shmref.connect(sock, timeout=5) as c:
                c.ping()
            with open(logpath) as f:
                text = f.read()
            return d, sock, "huge" if "(tmpfile-hugepages)" in text or "(memfd-hugepages)" in text else "4k"
        except OSError:
            time.sleep(0.02)
    d.kill()
    raise SystemExit(f"arrow_bench: shmrefd ({name}) did not start")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shmrefd", required=True)
    ap.add_argument("--rows", type=int, default=79_478_796)
    ap.add_argument("--strings", type=int, default=10_000_000)
    ap.add_argument("--iterations", type=int, default=9)
    ap.add_argument("--methods", default="c-data-in-process,shmref-batch,shmref-batch-4k,ipc-mapping,flight-loopback",
                    help="comma list; the first is the floor of the ratios")
    ap.add_argument("--columns", default="f64,utf8")
    ap.add_argument("--json")
    a = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="shmref-arrow-bench-", dir="/dev/shm")   # the IPC files
    sockdir = tempfile.mkdtemp(prefix="shmref-arrow-bench-")
    daemons, sockets, pools = [], {}, {}
    records = []
    methods = a.methods.split(",")
    try:
        # shmref-batch: the daemon as configured by default (as root: its private huge-page
        # pool; otherwise /dev/shm, 4 KiB pages); shmref-batch-4k: --pool-hugepages no.
        for name, extra in (("default", ()), ("4k", ("--pool-hugepages", "no"))):
            d, sock, pool = start_daemon(a.shmrefd, sockdir, name, extra)
            daemons.append(d)
            sockets[name], pools[name] = sock, pool
        if pools["default"] == "4k" and "shmref-batch-4k" in methods:
            methods.remove("shmref-batch-4k")   # the same daemon twice
            print("arrow_bench: no huge-page pool here (not root?): shmref-batch runs on 4 KiB pages")
        pool_of = {"shmref-batch": pools["default"], "shmref-batch-4k": "4k"}
        print(f"pyarrow {pa.__version__}; load average {os.getloadavg()[0]:.1f}; {a.iterations} iterations of "
              "each method, interleaved; medians")
        print(f"{'column':<5} {'method':<19} {'pool':<5} {'median ms':>10} {'p90 ms':>8} {'ratio':>6}   magmalake")
        for kind, n in (("f64", a.rows), ("utf8", a.strings)):
            if kind not in a.columns.split(","):
                continue
            floor, want = None, None
            lanes = []
            try:
                for m in methods:
                    lanes.append(Lane(m, kind, n, sockets["4k" if m.endswith("-4k") else "default"], workdir))
                for i in range(a.iterations + 1):   # the first one warms up
                    for lane in lanes:
                        lane.step(i)
            finally:
                for lane in lanes:
                    lane.stop()
            rows = []
            for lane in lanes:
                rows.append((lane.method, lane.times, lane.result))
                if lane.method.startswith("shmref-batch"):
                    rows.append((lane.method.replace("batch", "acquire"), lane.after, lane.result))
            for m, ts, res in rows:
                med = statistics.median(ts) * 1e3
                p90 = sorted(ts)[max(0, int(len(ts) * 0.9) - 1)] * 1e3
                if floor is None:
                    floor, want = med, res
                ok = res == want
                ratio = med / floor
                pool = pool_of.get(m.replace("acquire", "batch"), "")
                theirs = ""
                if kind == "f64" and MAGMALAKE.get(m):
                    theirs = f"{MAGMALAKE[m]} ms ({MAGMALAKE[m] / MAGMALAKE['c-data-in-process']:.2f}x)"
                    if m in MAGMALAKE_NOTE:
                        theirs += f", {MAGMALAKE_NOTE[m]}"
                print(f"{kind:<5} {m:<19} {pool or '-':<5} {med:>10.1f} {p90:>8.1f} {ratio:>5.2f}x   {theirs}"
                      + ("" if ok else f"   WRONG RESULT {res} != {want}"), flush=True)
                records.append({"scenario": "arrow-python", "column": kind, "rows": n, "method": m, "pool": pool,
                                "iterations": a.iterations, "median_ms": med, "p90_ms": p90,
                                "ratio_vs": "c-data-in-process", "ratio": ratio, "sum_ok": ok,
                                "magmalake_ms": MAGMALAKE.get(m) if kind == "f64" else None,
                                "producer_copy": m.startswith("shmref-batch") or m == "ipc-mapping"})
        print_targets(records)
    finally:
        for d in daemons:
            d.terminate()
            d.wait(20)
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(sockdir, ignore_errors=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(records, f, indent=1)
    return 0 if all(r["sum_ok"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
