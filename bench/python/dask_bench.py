# SPDX-License-Identifier: MIT
"""./scripts/bench --dask: the same Dask workloads over tcp:// and shmref:// in one run.

(a) client.scatter(x, broadcast=True) of a 2 GB float64 array to 4 workers, then a task
    on each worker reading all of it; (b) a P2P rechunk of a (20000, 20000) float64
    dask.array from row chunks to column chunks; (c) a P2P DataFrame shuffle of a
    pyarrow-backed frame of ~2 GB; (d) x + x.T on a (20000, 20000) float64 dask.array of
    (2000, 2000) chunks, then a sum; (e) 20,001 tiny tasks (20,000 increments and their
    sum; not scaled). For each: wall time, the sum of the workers' peak PSS
    (/proc/PID/smaps_rollup, sampled every 50 ms), the daemon's peak pool use, errors, and
    the buffers the daemon still holds once the cluster is closed. --scale shrinks the sizes
    (0.1: a tenth of the bytes) for a quick run.

Fair by construction (issue 27 item 7): --pairs runs (default 3) of each workload per
protocol, alternating which protocol goes first (tcp, shmref; shmref, tcp; ...); the table
gives medians with their spread (min-max) and the ratio of the medians with the spread of
the per-pair ratios; each workload's result is compared across protocols (the same sums,
the same row count); the sampler is its own process, polling the workers' PSS and the
daemon's pool for both protocols alike; the daemon is started as users start it, from a
configuration file (--config=FILE, so no /etc/shmrefd/shmrefd.conf leaks in). The table
says each workload's issue-27 target (TARGETS) and whether it was met.
"""
from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
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
    """Peak PSS of each worker pid and the daemon's peak pool use, every 50 ms, sampled by a
    process of its own (this file with --sample): the scheduler runs in this process, and
    polling from it would slow one protocol's scheduler and not the other's."""

    def __init__(self, pids, sock):
        self.pids, self.sock = pids, sock
        self.peak = {p: 0 for p in pids}
        self.pool_peak = 0

    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--sample",
                                      ",".join(map(str, self.pids)), "--socket", self.sock],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        return self

    def __exit__(self, *a):
        out, _ = self.proc.communicate("", timeout=60)  # stdin closed: it prints and exits
        got = json.loads(out)
        self.peak = {int(k): v for k, v in got["peak"].items()}
        self.pool_peak = got["pool_peak"]


def sample_main(pids, sock):
    """The sampler process: until its stdin closes."""
    import shmref
    peak = {p: 0 for p in pids}
    pool_peak, n = 0, 0
    c = shmref.connect(sock, timeout=10)
    while True:
        for p in pids:
            peak[p] = max(peak[p], pss_kib(p))
        if n % 4 == 0:
            try:
                pool_peak = max(pool_peak, c.status()["pool"]["bytes_leased"])
            except OSError:
                pass
        n += 1
        r, _, _ = select.select([sys.stdin], [], [], 0.05)
        if r and not sys.stdin.read():
            break
    print(json.dumps({"peak": peak, "pool_peak": pool_peak}))


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
    return wall, ok, sums[0]


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
    return wall, abs(s - n * n / 2) < n * n * 0.01, s


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
    return wall, total == nparts * rows, total


def workload_d(c, scale):
    import distributed
    import dask.array as da
    n = int(20000 * scale ** 0.5)
    x = da.random.default_rng(3).random((n, n), chunks=(max(1, n // 10), max(1, n // 10))).persist()
    distributed.wait(x)  # the input first: the timing is x + x.T's (transposed blocks cross workers)
    t0 = time.perf_counter()
    s = float((x + x.T).sum().compute())
    wall = time.perf_counter() - t0
    return wall, abs(s - n * n) < n * n * 0.01, s


def inc(i):
    return i + 1


def workload_e(c, scale):
    """20,001 tiny tasks (not scaled: their cost is the scheduling, which no frame by
    reference changes; the target is only not to lose to tcp://)."""
    t0 = time.perf_counter()
    total = c.submit(sum, c.map(inc, range(20000), pure=False)).result()
    wall = time.perf_counter() - t0
    return wall, total == 20000 * 20001 // 2, total


WORKLOADS = {"a": ("scatter broadcast + read", workload_a), "b": ("P2P rechunk", workload_b),
             "c": ("P2P DataFrame shuffle", workload_c), "d": ("x + x.T", workload_d),
             "e": ("20,001 tiny tasks", workload_e)}
#: Issue 27's targets, shmref:// over tcp://: (wall, summed worker PSS); None: no target.
TARGETS = {"a": (0.1, 0.3), "b": (0.5, 0.8), "c": (0.7, 0.8), "d": (0.5, None), "e": (1.0, None)}


def start_daemon(binary, pool):
    """shmrefd as users start it: its settings in a configuration file, --config=FILE (no
    flag for them, and no /etc/shmrefd/shmrefd.conf read besides)."""
    d = tempfile.mkdtemp(prefix="shmref-dask-bench-")
    sock = os.path.join(d, "shmrefd.sock")
    conf = os.path.join(d, "shmrefd.conf")
    with open(conf, "w") as f:
        f.write(f"[daemon]\nsocket = {sock}\npool-size = {pool}\ntenant-quota = {pool}\nmax-lease-size = {pool}\n")
    log = open(os.path.join(d, "shmrefd.log"), "wb")
    p = subprocess.Popen([binary, f"--config={conf}"], stdout=log, stderr=subprocess.STDOUT)
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


def run_one(key, proto, scale, nworkers, sock):
    from distributed import Client, LocalCluster
    _, fn = WORKLOADS[key]
    errors = 0
    with LocalCluster(protocol=proto, n_workers=nworkers, threads_per_worker=1, processes=True,
                      memory_limit=0, dashboard_address=":0", host="127.0.0.1") as cl, Client(cl) as c:
        pids = list(c.run(os.getpid).values())
        base = sum(pss_kib(p) for p in pids)
        value = None
        with Sampler(pids, sock) as s:
            try:
                wall, ok, value = fn(c, scale)
                errors += 0 if ok else 1
            except Exception as e:  # counted and shown: the run goes on
                print(f"  {key} {proto}: {type(e).__name__}: {e}", file=sys.stderr)
                wall, errors = float("nan"), errors + 1
        stats = c.run(lambda: __import__("shmref.dask").dask.stats()) if proto.startswith("shmref") else {}
    by_ref = sum(v["received_bytes_by_ref"] for v in stats.values())
    return {"workload": key, "protocol": proto, "wall_s": wall, "pss_peak_sum_mib": sum(s.peak.values()) / 1024,
            "pss_start_sum_mib": base / 1024, "pool_peak_mib": s.pool_peak / 2**20, "errors": errors,
            "received_by_ref_mib": by_ref / 2**20, "result": value}


def _spread(xs):
    xs = [x for x in xs if x == x]  # NaN: a failed run
    if not xs:
        return float("nan"), float("nan"), float("nan")
    return statistics.median(xs), min(xs), max(xs)


def _same(a, b):
    if a is None or b is None:
        return False
    if isinstance(a, float) or isinstance(b, float):
        return abs(a - b) <= 1e-9 * max(abs(a), abs(b)) + 1e-6
    return a == b


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--sample":
        return sample_main([int(p) for p in sys.argv[2].split(",")], sys.argv[4])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shmrefd", required=True)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--pairs", type=int, default=3, help="runs per protocol, alternating which goes first (>= 1)")
    ap.add_argument("--only", default="a,b,c,d,e")
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
    keys = a.only.split(",")
    try:
        for key in keys:
            for pair in range(max(1, a.pairs)):
                order = ("tcp://", "shmref://") if pair % 2 == 0 else ("shmref://", "tcp://")
                for proto in order:
                    r = run_one(key, proto, a.scale, a.workers, sock)
                    deadline = time.monotonic() + 10
                    while True:  # what the daemon still holds once the cluster is closed
                        st = status()
                        leaked = st["buffers"]["live"]
                        if leaked == 0 or time.monotonic() > deadline:
                            break
                        time.sleep(0.1)
                    r["leaked_buffers"], r["pair"] = leaked, pair
                    leaked_total += leaked
                    errors_total += r["errors"]
                    rows.append(r)
                    print(f"  {key} pair {pair} {proto:10s} wall {r['wall_s']:.2f} s  PSS peak sum "
                          f"{r['pss_peak_sum_mib']:.0f} MiB (at start {r['pss_start_sum_mib']:.0f})  pool peak "
                          f"{r['pool_peak_mib']:.0f} MiB  errors {r['errors']}  leaked {leaked}", flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nDask over tcp:// and shmref:// ({a.workers} workers, scale {a.scale}, {a.pairs} pairs alternating; "
          f"pool {pool}). Medians (min-max); ratios: shmref's median over tcp's (min-max of the per-pair ratios)")
    print("| workload | tcp wall s | shmref wall s | wall ratio (target) | tcp PSS MiB | shmref PSS MiB "
          "| PSS ratio (target) | shmref pool peak MiB | tcp pool peak MiB | results equal | met |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    met_all, mismatches = True, 0
    for key in keys:
        t = [r for r in rows if r["workload"] == key and r["protocol"] == "tcp://"]
        s = [r for r in rows if r["workload"] == key and r["protocol"] == "shmref://"]
        tw_, sw_ = _spread([r["wall_s"] for r in t]), _spread([r["wall_s"] for r in s])
        tp_, sp_ = _spread([r["pss_peak_sum_mib"] for r in t]), _spread([r["pss_peak_sum_mib"] for r in s])
        pw = _spread([y["wall_s"] / x["wall_s"] for x, y in zip(t, s)])
        pp = _spread([y["pss_peak_sum_mib"] / x["pss_peak_sum_mib"] for x, y in zip(t, s)])
        wr, pr = sw_[0] / tw_[0], sp_[0] / tp_[0]
        # every run's result against the first tcp run's: the protocols compute the same
        same = all(_same(r["result"], t[0]["result"]) for r in t + s)
        mismatches += 0 if same else 1
        tw, tp = TARGETS[key]
        met = wr <= tw and (tp is None or pr <= tp) and same and not any(r["errors"] for r in t + s)
        met_all &= met
        f3 = lambda v, d=2: f"{v[0]:.{d}f} ({v[1]:.{d}f}-{v[2]:.{d}f})"
        print(f"| ({key}) {WORKLOADS[key][0]} | {f3(tw_)} | {f3(sw_)} | {wr:.2f} ({pw[1]:.2f}-{pw[2]:.2f}) (<= {tw}) | "
              f"{f3(tp_, 0)} | {f3(sp_, 0)} | {pr:.2f} ({pp[1]:.2f}-{pp[2]:.2f}) ({'<= ' + str(tp) if tp else 'none'}) | "
              f"{max(r['pool_peak_mib'] for r in s):.0f} | {max(r['pool_peak_mib'] for r in t):.0f} | "
              f"{'yes' if same else 'NO'} | {'yes' if met else 'NO'} |")
    print(f"errors {errors_total}, results differing across protocols {mismatches}, buffers held after the "
          f"workloads {leaked_total}; targets {'met' if met_all and not errors_total and not leaked_total else 'NOT all met'}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"scale": a.scale, "workers": a.workers, "pairs": a.pairs, "pool": pool, "rows": rows}, f,
                      indent=1)
    return 0 if not errors_total and not leaked_total and not mismatches else 1


if __name__ == "__main__":
    sys.exit(main())
