# SPDX-License-Identifier: MIT
"""./scripts/bench --dask: the same Dask workloads over tcp:// and shmref:// in one run.

(a) client.scatter(x, broadcast=True) of a 2 GB float64 array to 4 workers, then a task
    on each worker reading all of it; (b) a P2P rechunk of a (20000, 20000) float64
    dask.array from row chunks to column chunks; (c) a P2P DataFrame shuffle of a
    pyarrow-backed frame of ~2 GB. For each: wall time, the sum of the workers' peak PSS
    (/proc/PID/smaps_rollup, sampled every 50 ms), the daemon's peak pool use, errors, and
    the buffers the daemon still holds once the cluster is closed. --scale shrinks the sizes
    (0.1: a tenth of the bytes) for a quick run.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np


def pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class Sampler:
    """Peak PSS of each worker pid and the daemon's peak pool use, every 50 ms."""

    def __init__(self, pids, status):
        self.pids, self.status = pids, status
        self.peak = {p: 0 for p in pids}
        self.pool_peak = 0
        self.stop_ev = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)

    def run(self):
        n = 0
        while not self.stop_ev.is_set():
            for p in self.pids:
                self.peak[p] = max(self.peak[p], pss_kib(p))
            if self.status is not None and n % 4 == 0:
                try:
                    self.pool_peak = max(self.pool_peak, self.status()["pool"]["bytes_leased"])
                except OSError:
                    pass
            n += 1
            self.stop_ev.wait(0.05)

    def __enter__(self):
        self.t.start()
        return self

    def __exit__(self, *a):
        self.stop_ev.set()
        self.t.join()


def read_all(x):
    return float(np.asarray(x).sum())


def make_part(i, rows):
    import pandas as pd
    rng = np.random.default_rng(i)
    return pd.DataFrame({
        "key": pd.array(rng.integers(0, 1 << 30, rows), dtype="int64[pyarrow]"),
        "a": pd.array(rng.standard_normal(rows), dtype="double[pyarrow]"),
        "b": pd.array(rng.standard_normal(rows), dtype="double[pyarrow]"),
        "s": pd.array(np.char.add("k", (rng.integers(0, 1 << 20, rows)).astype(str)), dtype="string[pyarrow]"),
    })


def workload_a(c, scale):
    n = int(2e9 * scale) // 8
    x = np.random.default_rng(1).standard_normal(n)
    workers = sorted(c.scheduler_info()["workers"])
    t0 = time.perf_counter()
    [f] = c.scatter([x], broadcast=True, hash=False)
    sums = c.gather([c.submit(read_all, f, workers=[w], pure=False) for w in workers])
    wall = time.perf_counter() - t0
    ok = all(abs(s - sums[0]) <= 1e-6 * abs(sums[0]) + 1e-3 for s in sums) and len(sums) == len(workers)
    del f
    return wall, ok


def workload_b(c, scale):
    import dask
    import distributed
    import dask.array as da
    n = int(20000 * scale ** 0.5)
    x = da.random.default_rng(2).random((n, n), chunks=(max(1, n // 20), n)).persist()
    distributed.wait(x)  # the input in the workers' memory first: the timing is the rechunk's
    with dask.config.set({"array.rechunk.method": "p2p"}):
        y = x.rechunk((n, max(1, n // 20)))
    t0 = time.perf_counter()
    s = float(y.sum().compute())
    wall = time.perf_counter() - t0
    return wall, abs(s - n * n / 2) < n * n * 0.01


def workload_c(c, scale):
    import dask
    import distributed
    import dask.dataframe as dd
    nparts = 40
    rows = int(2e9 * scale / 40 / 45)  # ~45 bytes a row: int64, 2 doubles, a short string
    df = dd.from_map(make_part, range(nparts), rows=rows).persist()
    distributed.wait(df)  # the input in the workers' memory first: the timing is the shuffle's
    t0 = time.perf_counter()
    with dask.config.set({"dataframe.shuffle.method": "p2p"}):
        out = df.shuffle("key", npartitions=nparts)
        total = int(out.map_partitions(len).sum().compute())
    wall = time.perf_counter() - t0
    return wall, total == nparts * rows


WORKLOADS = {"a": ("scatter broadcast + read", workload_a), "b": ("P2P rechunk", workload_b),
             "c": ("P2P DataFrame shuffle", workload_c)}


def start_daemon(binary, pool):
    d = tempfile.mkdtemp(prefix="shmref-dask-bench-")
    sock = os.path.join(d, "shmrefd.sock")
    log = open(os.path.join(d, "shmrefd.log"), "wb")
    p = subprocess.Popen([binary, "--socket", sock, "--pool-size", pool, "--tenant-quota", pool,
                          "--max-lease-size", pool], stdout=log, stderr=subprocess.STDOUT)
    import shmref
    deadline = time.monotonic() + 20
    while True:
        try:
            with shmref.connect(sock, timeout=5) as c:
                c.ping()
            return p, sock, d
        except OSError:
            if p.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"shmrefd did not start: {open(log.name).read()}")
            time.sleep(0.05)


def run_one(key, proto, scale, nworkers, status):
    from distributed import Client, LocalCluster
    _, fn = WORKLOADS[key]
    errors = 0
    with LocalCluster(protocol=proto, n_workers=nworkers, threads_per_worker=1, processes=True,
                      memory_limit=0, dashboard_address=":0", host="127.0.0.1") as cl, Client(cl) as c:
        pids = list(c.run(os.getpid).values())
        base = sum(pss_kib(p) for p in pids)
        with Sampler(pids, status if proto.startswith("shmref") else None) as s:
            try:
                wall, ok = fn(c, scale)
                errors += 0 if ok else 1
            except Exception as e:  # counted and shown: the run goes on
                print(f"  {key} {proto}: {type(e).__name__}: {e}", file=sys.stderr)
                wall, errors = float("nan"), errors + 1
        stats = c.run(lambda: __import__("shmref.dask").dask.stats()) if proto.startswith("shmref") else {}
    by_ref = sum(v["received_bytes_by_ref"] for v in stats.values())
    return {"workload": key, "protocol": proto, "wall_s": wall, "pss_peak_sum_mib": sum(s.peak.values()) / 1024,
            "pss_start_sum_mib": base / 1024, "pool_peak_mib": s.pool_peak / 2**20, "errors": errors,
            "received_by_ref_mib": by_ref / 2**20}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shmrefd", required=True)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--only", default="a,b,c")
    ap.add_argument("--pool", default=None, help="the daemon's pool (default: 3x the largest workload, >= 1G)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    pool = a.pool or f"{max(1024, int(3 * 3.2e9 * a.scale / 2**20))}M"
    proc, sock, tmp = start_daemon(a.shmrefd, pool)
    os.environ["SHMREFD_SOCKET"] = sock
    import shmref

    def status():
        with shmref.connect(sock, timeout=10) as c:
            return c.status()

    rows, leaked_total, errors_total = [], 0, 0
    try:
        for key in a.only.split(","):
            for proto in ("tcp://", "shmref://"):
                r = run_one(key, proto, a.scale, a.workers, status)
                deadline = time.monotonic() + 10
                while True:  # what the daemon still holds once the cluster is closed
                    st = status()
                    leaked = st["buffers"]["live"]
                    if leaked == 0 or time.monotonic() > deadline:
                        break
                    time.sleep(0.1)
                r["leaked_buffers"] = leaked
                leaked_total += leaked
                errors_total += r["errors"]
                rows.append(r)
                print(f"  {key} {proto:10s} wall {r['wall_s']:.2f} s  PSS peak sum {r['pss_peak_sum_mib']:.0f} MiB"
                      f" (at start {r['pss_start_sum_mib']:.0f})"
                      f"  pool peak {r['pool_peak_mib']:.0f} MiB  errors {r['errors']}  leaked {leaked}", flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
    targets = {"a": (0.5, 0.4), "b": (0.7, 1.0), "c": (0.7, 1.0)}
    print(f"\nDask over tcp:// and shmref:// ({a.workers} workers, scale {a.scale}; pool {pool})")
    print("| workload | tcp wall s | shmref wall s | wall ratio (target) | tcp PSS MiB | shmref PSS MiB | PSS ratio (target) | pool peak MiB | met |")
    print("|---|---|---|---|---|---|---|---|---|")
    met_all = True
    for key in a.only.split(","):
        t = next(r for r in rows if r["workload"] == key and r["protocol"] == "tcp://")
        s = next(r for r in rows if r["workload"] == key and r["protocol"] == "shmref://")
        wr, pr = s["wall_s"] / t["wall_s"], s["pss_peak_sum_mib"] / t["pss_peak_sum_mib"]
        tw, tp = targets[key]
        met = wr <= tw and pr <= tp and s["errors"] == t["errors"] == 0
        met_all &= met
        print(f"| ({key}) {WORKLOADS[key][0]} | {t['wall_s']:.2f} | {s['wall_s']:.2f} | {wr:.2f} (<= {tw}) | "
              f"{t['pss_peak_sum_mib']:.0f} | {s['pss_peak_sum_mib']:.0f} | {pr:.2f} (<= {tp}) | "
              f"{s['pool_peak_mib']:.0f} | {'yes' if met else 'NO'} |")
    print(f"errors {errors_total}, buffers held after the workloads {leaked_total}; "
          f"targets {'met' if met_all and not errors_total and not leaked_total else 'NOT all met'}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"scale": a.scale, "workers": a.workers, "pool": pool, "rows": rows}, f, indent=1)
    return 0 if not errors_total and not leaked_total else 1


if __name__ == "__main__":
    sys.exit(main())
