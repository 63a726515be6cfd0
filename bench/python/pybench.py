# SPDX-License-Identifier: MIT
"""The Python benchmark (./scripts/bench --python runs it in build/venv).

Two tables from one run, side by side:
  roundtrip   float64 arrays of 1e3, 1e5, 1e6, 1e7 (and 1e8 with --big) elements: the
              client writes its input, a server process computes its own output (input + 1)
              and the client reads it, by every method of methods.py (the same work for all;
              none forwards the client's buffer); ratios against tesseract-core's binref
              pool at the same size.
  tesseract   the seed's table: a Tesseract served locally by tesseract-core's runtime
              (tesseract-runtime serve, 127.0.0.1) whose apply returns input + 1, called
              through tesseract-core's client with json+base64, json+binref, json+binref +
              experimental_binref_pool, and with shmref references (tesseract_bench.py).
And, unless --only leaves them out: 1e3 base64 against shmref.encode in alternating
blocks (paired), the 1e3 round trip of the reused pair and shmref zero-copy on one CPU and
on two (placement), acquire + release and every call against C (acqrel, fixedcost).
Every output is compared element by element with what it must be, outside the timed part.
Then the targets (the fair rows only) checked against the numbers. --smoke: a few
iterations at small sizes; non-zero exit on a mismatch.

The shmref methods need the `shmref` package and a shmrefd: this script starts the one
given by --shmrefd on a socket in a temporary directory and stops it at the end.
"""

import argparse
import json
import os
import platform
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

import fixedcost  # noqa: E402
import methods  # noqa: E402
import wire  # noqa: E402

BASELINE = "tc-binref-pool"
SEED = {  # the seed's published numbers, 76 MB (1e7 float64), bare metal, ms
    "json+base64": 1130.0,
    "json+binref": 206.0,
    "json+binref pool": 87.0,
}

# iterations (warm-up, timed) and a time budget per row: loops stop at whichever comes first
PLAN = {
    1_000: (20, 400),
    100_000: (10, 150),
    1_000_000: (5, 60),
    10_000_000: (2, 12),
    100_000_000: (2, 3),  # two warm-ups: a forwarding server keeps the previous buffer alive
}
ROW_BUDGET_S = 25.0


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# --- data and checks ------------------------------------------------------------------


class Payload:
    """This iteration's data: the client writes ramp + it into every element of its input
    (produce), the server returns input + 1, and check() compares every element of the
    output with ramp + it + 1, outside the timed part. A stale, misplaced or missing page
    fails the row."""

    def __init__(self, n, smoke=False):
        self.n = n
        self.smoke = smoke
        self.ramp = np.arange(n, dtype=np.float64)
        self.src = np.zeros(n)  # the client's heap array, faulted in
        self.it = 0

    def produce(self, dst):
        np.add(self.ramp, float(self.it), out=dst)

    def check(self, out, method):
        if out.shape != (self.n,) or out.dtype != np.float64:
            raise AssertionError(f"{method}: got shape {out.shape} dtype {out.dtype}, want ({self.n},) float64")
        want = self.ramp + float(self.it + 1)
        if not np.array_equal(out, want):
            bad = int(np.flatnonzero(out != want)[0])
            raise AssertionError(f"{method}: iteration {self.it}: element {bad} is {out[bad]!r}, want {want[bad]!r}")


def stats(samples_ns):
    s = sorted(samples_ns)
    med = s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2
    p90 = s[min(len(s) - 1, int(0.9 * len(s) + 0.5) - 1 if len(s) > 1 else 0)]
    return med / 1e6, p90 / 1e6


# --- processes ------------------------------------------------------------------------


class Daemon:
    """This build's shmrefd on a socket in tmpdir (the daemon's default pool)."""

    def __init__(self, binary, tmpdir):
        self.socket = os.path.join(tmpdir, "shmrefd.sock")
        self.logpath = os.path.join(tmpdir, "shmrefd.log")
        self.logf = open(self.logpath, "w")
        self.proc = subprocess.Popen(
            [binary, "--socket", self.socket, "--pool-size", "6G", "--tenant-quota", "6G"],
            stdout=self.logf,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 20
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"shmrefd did not start: {self.log()}")
            time.sleep(0.02)

    def log(self):
        with open(self.logpath) as f:
            return f.read().strip()

    def pool_line(self):
        for line in self.log().splitlines():
            if "serving on" in line:
                return line.split("; ", 1)[-1]
        return ""

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.logf.close()


class Server:
    """A socket method's no-op server: this script with --serve, in another process."""

    def __init__(self, name, ctx, tmpdir):
        self.path = os.path.join(tmpdir, f"{name}.sock")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--serve", name, "--sock", self.path, "--ctx", json.dumps(ctx)],
            stdout=subprocess.PIPE,
            text=True,
        )
        r, _, _ = select.select([self.proc.stdout], [], [], 60)
        line = self.proc.stdout.readline() if r else ""
        if line.strip() != "ready":
            self.stop()
            raise RuntimeError(f"{name}: server did not start (exit {self.proc.poll()})")
        self.sock = wire.connect(self.path)
        self.sock.settimeout(300)  # a server that hangs fails its row instead of the run

    def stop(self):
        if getattr(self, "sock", None) is not None:
            self.sock.close()
            self.sock = None
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


# --- the round-trip table ---------------------------------------------------------------


def available(m, have):
    missing = [n for n in m.needs if not have.get(n)]
    return ("needs " + ", ".join(missing)) if missing else None


def run_row(m, payload, warm, iters, budget_s):
    """One row: each sample is the round trip (the client's write of its input to its read
    of one word per page of the output) plus the method's finish (releases, unlinks); the
    whole output is compared with what it must be between the two, untimed."""
    samples = []
    t_start = time.monotonic()
    for i in range(warm + iters):
        payload.it = i + 1
        t0 = time.perf_counter_ns()
        out = m.roundtrip(payload.src, payload.produce)
        methods.touch_pages(out)
        t1 = time.perf_counter_ns()
        payload.check(out, m.name)
        del out
        t2 = time.perf_counter_ns()
        m.finish()
        t3 = time.perf_counter_ns()
        after = getattr(m, "after", None)
        if after is not None:
            after()  # untimed cleanup
        if i >= warm:
            samples.append((t1 - t0) + (t3 - t2))
            if len(samples) >= 3 and time.monotonic() - t_start > budget_s:
                break
    return samples


def roundtrip_table(args, ctx, have, tmpdir):
    rows = []
    sizes = args.sizes
    for cls in methods.ALL:
        if args.only and cls.name not in args.only:
            continue
        why = available(cls, have)
        if why:
            for n in sizes:
                rows.append(record("roundtrip", cls.name, n, skipped=why))
            log(f"  {cls.name}: skipped ({why})")
            continue
        m = cls()
        server = None
        try:
            if m.transport == "socket":
                server = Server(m.name, ctx, tmpdir)
                m.sock = server.sock
            m.client_open(ctx)
            for n in sizes:
                warm, iters = (1, 3) if args.smoke else PLAN[n]
                try:
                    samples = run_row(m, Payload(n, args.smoke), warm, iters, ROW_BUDGET_S)
                    med, p90 = stats(samples)
                    rows.append(record("roundtrip", m.name, n, iterations=len(samples), median_ms=med, p90_ms=p90))
                    log(f"  {m.name:24s} {n:>11,d}  {med:10.3f} ms  (p90 {p90:.3f}, {len(samples)} it)")
                except Exception as e:  # a method that fails is a row with the error, and a failed run
                    rows.append(record("roundtrip", m.name, n, error=f"{type(e).__name__}: {e}"))
                    log(f"  {m.name:24s} {n:>11,d}  ERROR {type(e).__name__}: {e}")
                    break
            m.client_close()
        except Exception as e:
            rows.append(record("roundtrip", cls.name, sizes[0], error=f"{type(e).__name__}: {e}"))
            log(f"  {cls.name}: ERROR {type(e).__name__}: {e}")
        finally:
            if server is not None:
                server.stop()
    add_ratios(rows, BASELINE)
    return rows


def record(scenario, method, n, **kw):
    r = {"scenario": scenario, "method": method, "elements": n, "size_bytes": 8 * n}
    r.update(kw)
    return r


def add_ratios(rows, baseline):
    base = {r["elements"]: r["median_ms"] for r in rows if r["method"] == baseline and "median_ms" in r}
    for r in rows:
        if "median_ms" in r and r["elements"] in base:
            r["ratio_vs"] = baseline
            r["ratio"] = r["median_ms"] / base[r["elements"]]


# --- paired rows and acquire + release --------------------------------------------------


def open_with_servers(ms, ctx, tmpdir, servers):
    """Each socket method of ms gets its server process (appended to servers, for the
    caller to stop) and opens its client."""
    for m in ms:
        srv = Server(m.name, ctx, tmpdir)
        servers.append(srv)
        m.sock = srv.sock
        m.client_open(ctx)


def paired(args, ctx, have, tmpdir, names, n, blocks=10, per_block=40):
    """Two methods measured in alternating blocks (both servers up), so that a noisy
    neighbour hits both alike: for the close call at 1e3 between base64 and encode."""
    ms = [methods.BY_NAME[x]() for x in names]
    if any(available(m, have) for m in ms):
        return None
    servers = []
    try:
        open_with_servers(ms, ctx, tmpdir, servers)
        samples = {m.name: [] for m in ms}
        payload = Payload(n, False)
        for b in range(blocks):
            for m in ms:
                samples[m.name] += run_row(m, payload, 5 if b == 0 else 1, per_block, ROW_BUDGET_S)
        for m in ms:
            m.client_close()
    finally:
        for srv in servers:
            srv.stop()
    return {name: stats(v) + (len(v),) for name, v in samples.items()}


def placement(args, ctx, have, tmpdir, names=("mp-shared-memory-reused", "shmref-zerocopy"), n=1_000, blocks=6,
              per_block=150):
    """Where the 1e3 round trip's time goes: the reused pair and shmref zero-copy with the
    client and its server pinned to one CPU, then to two (sched_setaffinity), in
    alternating blocks (both servers up). On one CPU every wake is a switch on that CPU
    and every shared line stays in its cache: the difference is the work each method
    adds. Across two, each wake is an inter-processor interrupt and each line the other
    side wrote moves between caches: the difference adds what the method's shared state
    costs to move."""
    cpus = sorted(os.sched_getaffinity(0))
    ms = [methods.BY_NAME[x]() for x in names]
    if len(cpus) < 2 or any(available(m, have) for m in ms):
        return None
    servers = []
    out = {}
    mine = os.sched_getaffinity(0)
    try:
        open_with_servers(ms, ctx, tmpdir, servers)
        payload = Payload(n, False)
        for where, (c, s) in (("same CPU", (cpus[0], cpus[0])), ("cross CPU", (cpus[0], cpus[1]))):
            os.sched_setaffinity(0, {c})
            for srv in servers:
                os.sched_setaffinity(srv.proc.pid, {s})
            samples = {m.name: [] for m in ms}
            for b in range(blocks):
                for m in (ms if b % 2 == 0 else ms[::-1]):
                    samples[m.name] += run_row(m, payload, 20 if b < 2 else 2, per_block, ROW_BUDGET_S)
            out[where] = {name: stats(v) + (len(v),) for name, v in samples.items()}
        for m in ms:
            m.client_close()
    finally:
        os.sched_setaffinity(0, mine)
        for srv in servers:
            srv.stop()
    return out


def placement_table(pl):
    names = list(next(iter(pl.values())))
    lines = ["1e3 round trip by placement, median ms (alternating blocks; ratio to the first)", "",
             "| placement | " + " | ".join(f"`{x}`" for x in names) + " | ratio |",
             "|---|" + "---|" * (len(names) + 1)]
    for where, row in pl.items():
        base = row[names[0]][0]
        lines.append(f"| {where} | " + " | ".join(f"{fmt_ms(row[x][0])}" for x in names)
                     + f" | {row[names[-1]][0] / base:.2f}x |")
    return "\n".join(lines)


def acquire_release(args, ctx, have, daemon, iterations=4000, blocks=3):
    """Client.acquire + release of one published 4 KiB float64 array on a connection of
    its own, against the same calls from C (shmref-acqrel), in alternating blocks. A round
    trip to the daemon costs ~10x more when the daemon runs on the other vCPU of this VM,
    so both are measured with the consumer on the daemon's CPU and on the other one (the
    daemon pinned to CPU 0)."""
    if not have.get("shmref") or daemon is None:
        return None
    exe = os.path.join(os.path.dirname(os.path.abspath(args.shmrefd)), "shmref-acqrel")
    if not os.access(exe, os.X_OK):
        log(f"pybench: no {exe}: acquire + release not compared with C")
        return None
    import shmref

    cpus = sorted(os.sched_getaffinity(0))
    placements = [("same CPU", cpus[0])] + ([("other CPU", cpus[1])] if len(cpus) > 1 else [])
    prod = shmref.connect(ctx["shmref_socket"], timeout=30)
    cons = shmref.connect(ctx["shmref_socket"], timeout=30)
    daemon_cpus = os.sched_getaffinity(daemon.proc.pid)
    try:
        a = prod.empty((512,), "float64")
        a[:] = 1.0
        ref = str(prod.publish(a))
        os.sched_setaffinity(daemon.proc.pid, {cpus[0]})
        result = {}
        for label, cpu in placements:
            py, c_meds = [], []
            for _ in range(blocks):
                out = subprocess.run([exe, ctx["shmref_socket"], ref, str(iterations)], capture_output=True,
                                     text=True, timeout=120, check=True,
                                     preexec_fn=lambda cpu=cpu: os.sched_setaffinity(0, {cpu}))
                c_meds.append(json.loads(out.stdout)["median_ns"])
                os.sched_setaffinity(0, {cpu})
                try:
                    for i in range(iterations):
                        t0 = time.perf_counter_ns()
                        x = cons.acquire(ref)
                        x[0]
                        cons.release(x)
                        del x
                        py.append(time.perf_counter_ns() - t0)
                    cons.ping()
                finally:
                    os.sched_setaffinity(0, cpus)
            pm, pp = stats(py)
            cm = sorted(c_meds)[len(c_meds) // 2] / 1e6
            result[label] = {"python_median_us": pm * 1e3, "python_p90_us": pp * 1e3, "c_median_us": cm * 1e3,
                             "c_block_medians_us": [v / 1e3 for v in c_meds], "pairs": iterations * blocks,
                             "ratio": pm / cm}
        return result
    finally:
        os.sched_setaffinity(daemon.proc.pid, daemon_cpus)
        cons.close()
        prod.close()


# --- output ---------------------------------------------------------------------------


def fmt_ms(v):
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def fmt_ratio(x):
    return f"{x:.2f}x" if x >= 0.1 else f"{x:.3f}x"


def cell(r):
    if r is None:
        return "-"
    if "skipped" in r:
        return "skipped"
    if "error" in r:
        return "ERROR"
    s = fmt_ms(r["median_ms"])
    if "ratio" in r:
        s += f" ({fmt_ratio(r['ratio'])})"
    return s


def size_label(n):
    return f"1e{len(str(n)) - 1} ({8 * n / 1e6:g} MB)"


def table(rows, scenario, names, sizes, first_col="method"):
    out = [
        f"| {first_col} | " + " | ".join(size_label(n) for n in sizes) + " |",
        "|---|" + "---|" * len(sizes),
    ]
    for name in names:
        cells = [cell(next((r for r in rows if r["scenario"] == scenario and r["method"] == name and r["elements"] == n), None)) for n in sizes]
        out.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(out)


def find(rows, scenario, method, n):
    return next((r for r in rows if r["scenario"] == scenario and r["method"] == method and r["elements"] == n and "median_ms" in r), None)


def _ratio_target(rows, method, peer, n, limit, label):
    r, p = find(rows, "roundtrip", method, n), find(rows, "roundtrip", peer, n)
    if r is None or p is None:
        return {"target": label, "result": "NOT MEASURED", "measured": "row missing"}
    x = r["median_ms"] / p["median_ms"]
    return {"target": label, "result": "MET" if x <= limit else "MISSED",
            "measured": f"{x:.2f}x ({fmt_ms(r['median_ms'])} ms vs {fmt_ms(p['median_ms'])} ms)", "ratio": x}


def fixed_cost(args, ctx, have, daemon):
    """Python's fixed cost per call against the same calls from C (fixedcost.py,
    shmref-calls), at 1e3 elements, alternating blocks."""
    if not have.get("shmref") or daemon is None:
        return None
    exe = os.path.join(os.path.dirname(os.path.abspath(args.shmrefd)), "shmref-calls")
    if not os.access(exe, os.X_OK):
        log(f"pybench: no {exe}: Python's fixed cost not compared with C")
        return None
    return fixedcost.run(exe, ctx["shmref_socket"], daemon.proc.pid, log=log)


def targets(rows, pair=None, acqrel=None, trows=(), fixed=None):
    """The targets, from this run's numbers. Ratios are shmref's time over the peer's:
    below 1 is faster."""
    out = []
    # Same-tenant handoffs (issue 28): against two reused shared segments <= 1.0x at 1e3 and
    # 1e5, <= 0.9x at 1e6 and 1e7; against iceoryx2 <= 1.0x at every size.
    for peer, limits in (("mp-shared-memory-reused", (1.0, 1.0, 0.9, 0.9)), ("iceoryx2", (1.0, 1.0, 1.0, 1.0))):
        for n, limit in zip((1_000, 100_000, 1_000_000, 10_000_000), limits):
            out.append(_ratio_target(rows, "shmref-zerocopy", peer, n, limit,
                                     f"1e{len(str(n)) - 1} round trip: shmref zero-copy <= {limit:.2f}x `{peer}`"))
    N = 10_000_000
    pool = find(rows, "roundtrip", BASELINE, N)
    for method, need, label in (
        ("shmref-encode", 2.0, "1e7 round trip: shmref.encode/decode >= 2x faster than tesseract-core's pool"),
        ("shmref-zerocopy", 30.0, "1e7 round trip: shmref zero-copy >= 30x faster than tesseract-core's pool"),
    ):
        r = find(rows, "roundtrip", method, N)
        if pool is None or r is None:
            out.append({"target": label, "result": "NOT MEASURED", "measured": "row missing"})
            continue
        x = pool["median_ms"] / r["median_ms"]
        out.append({
            "target": label,
            "result": "MET" if x >= need else "MISSED",
            "measured": f"{x:.1f}x ({fmt_ms(r['median_ms'])} ms vs {fmt_ms(pool['median_ms'])} ms)",
            "speedup": x,
        })
    tp = next((r for r in trows if r["method"] == "json+binref pool" and r["elements"] == N and "median_ms" in r), None)
    ts = next((r for r in trows if r["method"] == "shmref" and r["elements"] == N and "median_ms" in r), None)
    label = "1e7 Tesseract call: shmref references >= 2x faster than json+binref pool"
    if tp is None or ts is None:
        out.append({"target": label, "result": "NOT MEASURED", "measured": "row missing"})
    else:
        x = tp["median_ms"] / ts["median_ms"]
        out.append({"target": label, "result": "MET" if x >= 2.0 else "MISSED",
                    "measured": f"{x:.1f}x ({fmt_ms(ts['median_ms'])} ms vs {fmt_ms(tp['median_ms'])} ms)",
                    "speedup": x})
    b64 = find(rows, "roundtrip", "base64-json", 1_000)
    enc = find(rows, "roundtrip", "shmref-encode", 1_000)
    label = "1e3 round trip: shmref.encode/decode no slower than base64 in JSON"
    if pair is None or b64 is None or enc is None:
        out.append({"target": label, "result": "NOT MEASURED", "measured": "row missing"})
    else:
        (em, _, en), (bm, _, bn) = pair["shmref-encode"], pair["base64-json"]
        x = em / bm
        out.append({
            "target": label,
            "result": "MET" if x <= 1.0 else "MISSED",
            "measured": f"{x:.2f}x of base64 ({fmt_ms(em)} ms vs {fmt_ms(bm)} ms, medians of {en} round trips each "
                        f"in alternating blocks; the table's rows: {enc['median_ms'] / b64['median_ms']:.2f}x)",
            "ratio": x,
        })
    label = "Python overhead of acquire + release <= 2x the same calls from C"
    if not acqrel:
        out.append({"target": label, "result": "NOT MEASURED", "measured": "needs shmref and shmref-acqrel"})
    else:
        worst = max(v["ratio"] for v in acqrel.values())
        parts = [f"{k}: {v['ratio']:.2f}x ({v['python_median_us']:.1f} vs {v['c_median_us']:.1f} us)" for k, v in acqrel.items()]
        out.append({
            "target": label,
            "result": "MET" if worst <= 2.0 else "MISSED",
            "measured": "; ".join(parts) + f" per pair, 4 KiB, {next(iter(acqrel.values()))['pairs']} pairs each, alternating blocks",
            "ratio": worst,
        })
    if fixed is not False:
        out += fixedcost.targets(fixed)
    return out


def report(rows, sizes, tesseract_rows, tsizes, tgt, meta, fixed=None, pl=None):
    lines = [f"Python round trip, median ms (ratio to `{BASELINE}` at the same size; below 1 is faster)", ""]
    lines.append(table(rows, "roundtrip", [m.name for m in methods.ALL], sizes))
    if tesseract_rows:
        import tesseract_bench

        lines += ["", "Tesseract whose apply returns input + 1 (tesseract-core runtime, served locally), median ms "
                  f"(ratio to `{tesseract_bench.BASELINE}`); seed = the seed's published 76 MB numbers, bare metal", ""]
        names = [m for m, _ in tesseract_bench.FORMATS]
        t = table(tesseract_rows, "tesseract", names, tsizes, first_col="client format")
        tl = t.splitlines()
        tl[0] += " seed, 76 MB (bare metal) |"
        tl[1] += "---|"
        for i, name in enumerate(names):
            tl[2 + i] += f" {fmt_ms(SEED[name]) if name in SEED else '-'} |"
        lines += tl
    if pl:
        lines += ["", placement_table(pl)]
    if fixed:
        lines += ["", fixedcost.table(fixed).rstrip()]
    lines += ["", "Targets (fair rows: every server writes its own output)", "", "| target | result | measured |",
              "|---|---|---|"]
    for t in tgt:
        lines.append(f"| {t['target']} | {t['result']} | {t['measured']} |")
    lines += ["", meta]
    return "\n".join(lines)


# --- main -----------------------------------------------------------------------------


def have_modules():
    have = {}
    for name in ("shmref", "torch", "tesseract_core", "iceoryx2"):  # numpy is imported above
        try:
            __import__(name)
            have[name] = True
        except Exception as e:  # a broken package is reported, not fatal
            have[name] = False
            log(f"pybench: cannot import {name}: {type(e).__name__}: {e}")
    return have


def parse_sizes(s):
    return [int(float(x)) for x in s.split(",") if x]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=parse_sizes, default=None)
    ap.add_argument("--big", action="store_true", help="add 1e8 elements (800 MB)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--only", type=lambda s: set(s.split(",")), default=None,
                    help="methods, comma-separated; also paired (1e3 base64 vs encode), placement, acqrel and fixedcost")
    ap.add_argument("--no-tesseract", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--table")
    ap.add_argument("--shmrefd")
    ap.add_argument("--require", type=lambda s: [x for x in s.split(",") if x], default=[],
                    help="modules that must import (a failure otherwise, not a skipped row)")
    ap.add_argument("--serve")
    ap.add_argument("--sock")
    ap.add_argument("--ctx")
    args = ap.parse_args()
    if args.serve:
        methods.serve(args.serve, args.sock, json.loads(args.ctx))
        return 0
    if args.sizes is None:
        args.sizes = [1_000, 100_000] if args.smoke else [1_000, 100_000, 1_000_000, 10_000_000]
        if args.big:
            args.sizes.append(100_000_000)
    for n in args.sizes:
        PLAN.setdefault(n, (2, 10))

    have = have_modules()
    missing = [m for m in args.require if m != "numpy" and not have.get(m)]
    if missing:
        log(f"pybench: required modules missing: {', '.join(missing)}")
        return 1
    tmpdir = tempfile.mkdtemp(prefix="shmref-pybench-")
    shmdir = tempfile.mkdtemp(prefix="shmref-pybench-", dir="/dev/shm")
    ctx = {"indir": os.path.join(shmdir, "in"), "outdir": os.path.join(shmdir, "out"), "shmref_socket": None,
           "run_id": f"{os.getpid()}-{time.time_ns()}",
           "iox2_root": os.path.join(tmpdir, "iceoryx2") + "/", "iox2_prefix": f"shmrefbench{os.getpid():x}_"}
    os.makedirs(ctx["indir"])
    os.makedirs(ctx["outdir"])
    daemon = None
    status = 0
    try:
        if have["shmref"]:
            if not args.shmrefd or not os.access(args.shmrefd, os.X_OK):
                log(f"pybench: no shmrefd binary at {args.shmrefd!r}: shmref methods skipped")
                have["shmref"] = False
            else:
                daemon = Daemon(args.shmrefd, tmpdir)
                ctx["shmref_socket"] = daemon.socket
                os.environ["SHMREFD_SOCKET"] = daemon.socket  # for shmref.encode's default client
        load = os.getloadavg()
        log(f"pybench: load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; sizes {args.sizes}"
            + (" (smoke: every element checked)" if args.smoke else ""))
        log("round trip:")
        rows = roundtrip_table(args, ctx, have, tmpdir)
        trows, tsizes = [], []
        if not args.no_tesseract and have["tesseract_core"]:
            import tesseract_bench

            log("tesseract (served by tesseract-runtime on 127.0.0.1):")
            tsizes = args.sizes
            trows = tesseract_bench.run(args, ctx, have, tsizes, Payload, run_row, stats, record, log)
            add_ratios(trows, tesseract_bench.BASELINE)
        allrows = rows + trows
        pair = acqrel = None
        if not args.smoke and (not args.only or "paired" in args.only):
            log("1e3 base64 vs shmref.encode, alternating blocks:")
            pair = paired(args, ctx, have, tmpdir, ["base64-json", "shmref-encode"], 1_000)
            if pair:
                for k, (med, p90, cnt) in pair.items():
                    log(f"  {k:24s} {1000:>11,d}  {med:10.3f} ms  (p90 {p90:.3f}, {cnt} it)")
        if not args.smoke and (not args.only or "acqrel" in args.only):
            log("acquire + release, Python vs C:")
            acqrel = acquire_release(args, ctx, have, daemon)
            for k, v in (acqrel or {}).items():
                log(f"  {k}: python {v['python_median_us']:.1f} us, C {v['c_median_us']:.1f} us per pair "
                    f"(C blocks {', '.join(f'{x:.1f}' for x in v['c_block_medians_us'])})")
        pl = None
        if not args.smoke and (not args.only or "placement" in args.only):
            log("1e3 round trip by placement (client and server on one CPU, then on two):")
            pl = placement(args, ctx, have, tmpdir)
            for where, row in (pl or {}).items():
                for k, (med, p90, cnt) in row.items():
                    log(f"  {where:10s} {k:24s} {med:10.3f} ms  (p90 {p90:.3f}, {cnt} it)")
        fixed = False
        if not args.smoke and (not args.only or "fixedcost" in args.only):
            log("Python's fixed cost per call, Python vs C (1e3 float64):")
            fixed = fixed_cost(args, ctx, have, daemon)
        tgt = [] if args.smoke else targets(rows, pair, acqrel, trows, fixed)
        pool = daemon.pool_line() if daemon else "no shmrefd"
        meta = (f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; Linux {platform.release()}, {os.cpu_count()} CPUs, "
                f"Python {platform.python_version()}; load average at start {load[0]:.2f}; shmrefd {pool}")
        text = report(allrows, args.sizes, trows, tsizes, tgt, meta, fixed or None, pl)
        print(text)
        versions = {}
        for mod in ("numpy", "tesseract_core", "torch", "shmref", "orjson", "pybase64", "iceoryx2"):
            try:
                versions[mod] = getattr(__import__(mod), "__version__", "?")
            except Exception:
                versions[mod] = None
        try:
            versions["tree"] = subprocess.run(["git", "-C", HERE, "describe", "--always", "--dirty"], capture_output=True,
                                              text=True, timeout=10).stdout.strip() or None
        except Exception:
            versions["tree"] = None
        doc = {"meta": meta, "versions": versions, "sizes": args.sizes, "records": allrows, "targets": tgt,
               "paired_1e3": pair, "acquire_release": acqrel, "fixed_cost": fixed or None, "placement_1e3": pl}
        if args.json:
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=1)
                f.write("\n")
        if args.table:
            with open(args.table, "w") as f:
                f.write(text + "\n")
        if any("error" in r for r in allrows):
            status = 1
            log("pybench: some rows failed (see ERROR cells)")
    finally:
        if daemon is not None:
            daemon.stop()
        shutil.rmtree(shmdir, ignore_errors=True)
        shutil.rmtree(tmpdir, ignore_errors=True)
        for f in os.listdir("/dev/shm"):  # iceoryx2's segments under this run's own prefix
            if f.startswith(ctx["iox2_prefix"]):
                os.unlink(os.path.join("/dev/shm", f))
    return status


if __name__ == "__main__":
    sys.exit(main())
