# SPDX-License-Identifier: MIT
"""The pyarrow rows of issue 10's benchmark (./scripts/bench --arrow runs this after the C
rows): magmalake's measurement, one float64 column of 79,478,796 rows (and a utf8 column
of 10M strings), made by a producer process that holds it in its heap; a consumer process
asks for it and sums it (utf8: the string lengths, through the offsets). Timed by the
consumer from its request until the sum. Methods:

  c-data-in-process   the floor: one process exports the column through the C Data
                      Interface (PyCapsules) and imports it back, then sums
  shmref-batch        Client.publish_batch (one copy into a lease) in the producer,
                      the Ref over a pipe; acquire_batch + to_pyarrow in the consumer,
                      zero-copy, summed where the bytes lie
  shmref-acquire      the same runs, timed from the Ref's arrival: acquire, export and
                      sum where the bytes lie (the consumer's side, magmalake's row)
  ipc-mapping         the producer writes Arrow IPC into a file on /dev/shm (one copy),
                      the path over a pipe; the consumer maps it (pyarrow.memory_map)
                      and reads the IPC zero-copy
  flight-loopback     a pyarrow.flight server in the producer holds the column; the
                      consumer's DoGet over grpc://127.0.0.1

Usage: arrow_bench.py --shmrefd PATH [--rows N] [--strings N] [--iterations N] [--json F]
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
    if pa.types.is_floating(col.type):
        return pc.sum(col).as_py()
    return pc.sum(pc.utf8_length(col)).as_py()


def table_of(col):
    return pa.table({"c": col})


def producer(conn, method, kind, n, socket, workdir):
    """The producer process: makes the column once, then answers each request."""
    col = make_column(kind, n)
    t = table_of(col)
    server = None
    client = None
    if method == "shmref-batch":
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
        if method == "shmref-batch":
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


def run_method(method, kind, n, iterations, socket, workdir):
    """(times, sum, consumer-side times or None)."""
    times, result, after = [], None, []
    if method == "c-data-in-process":
        col = make_column(kind, n)
        for _ in range(iterations + 1):
            t0 = time.perf_counter()
            got = pa.Array._import_from_c_capsule(*col.__arrow_c_array__())
            result = consume(got)
            times.append(time.perf_counter() - t0)
            del got
        return times[1:], result, None
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    p = ctx.Process(target=producer, args=(there, method, kind, n, socket, workdir))
    p.start()
    location = here.recv() if method == "flight-loopback" else None
    fc = None
    if location:
        import pyarrow.flight as flight
        fc = flight.connect(location)
    client = None
    if method == "shmref-batch":
        import shmref
        client = shmref.connect(socket)
    for i in range(iterations + 1):   # the first one warms up
        t0 = time.perf_counter()
        here.send(i)
        answer = here.recv()
        t1 = time.perf_counter()
        if method == "shmref-batch":
            with client.acquire_batch(answer) as b:
                got = b.to_pyarrow().column(0)
            result = consume(got)
        elif method == "ipc-mapping":
            with pa.memory_map(answer) as src:
                got = pa.ipc.open_file(src).read_all().column(0)
                result = consume(got)
            os.unlink(answer)
        else:
            got = fc.do_get(flight.Ticket(b"c")).read_all().column(0)
            result = consume(got)
        times.append(time.perf_counter() - t0)
        after.append(time.perf_counter() - t1)
        del got
    here.send("stop")
    p.join(60)
    if client is not None:
        client.close()
    if fc is not None:
        fc.close()
    return times[1:], result, after[1:] if method == "shmref-batch" else None


def start_daemon(binary, workdir):
    sock = os.path.join(workdir, "shmrefd.sock")
    log = open(os.path.join(workdir, "shmrefd.log"), "wb")
    d = subprocess.Popen([binary, "--socket", sock, "--pool-size", "4G"], stdout=log, stderr=subprocess.STDOUT)
    import shmref
    for _ in range(500):
        try:
            with shmref.connect(sock, timeout=5) as c:
                c.ping()
            return d, sock
        except OSError:
            time.sleep(0.02)
    d.kill()
    raise SystemExit("arrow_bench: shmrefd did not start")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shmrefd", required=True)
    ap.add_argument("--rows", type=int, default=79_478_796)
    ap.add_argument("--strings", type=int, default=10_000_000)
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="shmref-arrow-bench-", dir="/dev/shm")
    daemon, socket = start_daemon(a.shmrefd, workdir)
    records = []
    methods = ["c-data-in-process", "shmref-batch", "ipc-mapping", "flight-loopback"]
    try:
        print(f"pyarrow {pa.__version__}; load average {os.getloadavg()[0]:.1f}; {a.iterations} iterations, medians")
        print(f"{'column':<5} {'method':<19} {'median ms':>10} {'p90 ms':>8} {'ratio':>6}   magmalake")
        for kind, n in (("f64", a.rows), ("utf8", a.strings)):
            floor, want = None, None
            rows = []
            for m in methods:
                ts, res, after = run_method(m, kind, n, a.iterations, socket, workdir)
                rows.append((m, ts, res))
                if after is not None:
                    rows.append(("shmref-acquire", after, res))
            for m, ts, res in rows:
                med = statistics.median(ts) * 1e3
                p90 = sorted(ts)[max(0, int(len(ts) * 0.9) - 1)] * 1e3
                if floor is None:
                    floor, want = med, res
                ok = res == want
                ratio = med / floor
                theirs = ""
                if kind == "f64" and MAGMALAKE[m]:
                    theirs = f"{MAGMALAKE[m]} ms ({MAGMALAKE[m] / MAGMALAKE['c-data-in-process']:.2f}x)"
                    if m in MAGMALAKE_NOTE:
                        theirs += f", {MAGMALAKE_NOTE[m]}"
                print(f"{kind:<5} {m:<19} {med:>10.1f} {p90:>8.1f} {ratio:>5.2f}x   {theirs}"
                      + ("" if ok else f"   WRONG SUM {res} != {want}"), flush=True)
                records.append({"scenario": "arrow-python", "column": kind, "rows": n, "method": m,
                                "iterations": a.iterations, "median_ms": med, "p90_ms": p90,
                                "ratio_vs": "c-data-in-process", "ratio": ratio, "sum_ok": ok,
                                "magmalake_ms": MAGMALAKE[m] if kind == "f64" else None,
                                "producer_copy": m in ("shmref-batch", "ipc-mapping")})
        f64 = {r["method"]: r["median_ms"] for r in records if r["column"] == "f64"}
        print("targets (f64): shmref-acquire <= 1.1x in-process: %.2fx (with the producer's copy: %.2fx); "
              "shmref-batch >= 2x faster than IPC: %.2fx; >= 1.5x faster than Flight: %.2fx"
              % (f64["shmref-acquire"] / f64["c-data-in-process"], f64["shmref-batch"] / f64["c-data-in-process"],
                                                      f64["ipc-mapping"] / f64["shmref-batch"],
                                                      f64["flight-loopback"] / f64["shmref-batch"]))
    finally:
        daemon.terminate()
        daemon.wait(20)
        shutil.rmtree(workdir, ignore_errors=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(records, f, indent=1)
    return 0 if all(r["sum_ok"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
