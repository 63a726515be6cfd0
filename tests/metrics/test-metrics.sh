#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-metrics.sh: `shmrefctl metrics` read by a real Prometheus text-format parser
# (Debian's python3-prometheus-client), with a daemon that has something to show: a
# retained buffer (so a tenant row exists), a consumed one, a refused lease. Then, with
# no daemon, the output must still parse and say shmref_up 0.
# Usage: test-metrics.sh SHMREFD SHMREFCTL
set -uo pipefail
if [ $# -ne 2 ]; then
    echo "usage: $0 SHMREFD_BINARY SHMREFCTL_BINARY" >&2
    exit 2
fi
SHMREFD=$1 SHMREFCTL=$2
# The Debian package, not whatever python3 comes first on PATH (pyenv and the like).
PYTHON=/usr/bin/python3
POOL_SIZE=67108864      # 64 MiB, passed as --pool-size in bytes
MAX_LEASE=8388608       # 8 MiB, so a 9 MiB put is refused (reason "limit")
. "$(dirname "$0")/../lib.sh"
test_begin metrics
sock=$tmp/s.sock
ctl() { "$SHMREFCTL" --socket "$sock" "$@"; }

# parse FILE MODE: runs the parser's checks on FILE; prints PASS/FAIL lines, which are
# counted below. MODE is "up" (a serving daemon) or "down".
cat >"$tmp/check.py" <<'EOF'
import sys

path, mode, pool_size, uid = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
results = []


def check(name, cond, detail=""):
    results.append(("PASS " if cond else "FAIL ") + name + ("" if cond or not detail else ": " + detail))


try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError as e:
    print("FAIL import prometheus_client.parser (install python3-prometheus-client): %s" % e)
    sys.exit(0)

text = open(path).read()
try:
    families = {f.name: f for f in text_string_to_metric_families(text)}
    check("the output parses as Prometheus text format (%d families)" % len(families), True)
except Exception as e:  # the parser raises ValueError and others on bad input
    print("FAIL the output parses as Prometheus text format: %r" % e)
    sys.exit(0)


def samples(name, sample_name=None):
    f = families.get(name)
    return [s for s in f.samples if sample_name is None or s.name == sample_name] if f else []


def value(name):
    s = samples(name)
    return s[0].value if len(s) == 1 else None


untyped = sorted(n for n, f in families.items() if f.type in ("untyped", "unknown"))
check("every metric has a TYPE line matching its samples", not untyped, "untyped: %s" % untyped)
keys = [(s.name, tuple(sorted(s.labels.items()))) for f in families.values() for s in f.samples]
dups = sorted({k for k in keys if keys.count(k) > 1})
check("no sample is repeated", not dups, str(dups))

if mode == "down":
    check("shmref_up is 0", value("shmref_up") == 0, "got %r" % value("shmref_up"))
    print("\n".join(results))
    sys.exit(0)

check("shmref_up is 1", value("shmref_up") == 1, "got %r" % value("shmref_up"))
check("shmref_up is a gauge", families.get("shmref_up") is not None and families["shmref_up"].type == "gauge")

pool = {s.labels.get("state"): s.value for s in samples("shmref_pool_bytes")}
check("shmref_pool_bytes has states total, leased, free, allocated, warm",
      sorted(pool) == sorted(["total", "leased", "free", "allocated", "warm"]), "got %s" % sorted(pool))
check("shmref_pool_bytes{state=total} is the --pool-size given (%d)" % pool_size,
      pool.get("total") == pool_size, "got %r" % pool.get("total"))
check("leased + free == total", pool.get("leased", -1) + pool.get("free", -1) == pool.get("total"), str(pool))
check("leased bytes are held while a put is retained", pool.get("leased", 0) > 0, str(pool))

tenant = [s.value for s in samples("shmref_tenant_bytes") if s.labels.get("uid") == uid]
check("shmref_tenant_bytes{uid=\"%s\"} > 0 while the put is retained" % uid,
      len(tenant) == 1 and tenant[0] > 0, "got %r" % tenant)
quota = [s.value for s in samples("shmref_tenant_quota_bytes") if s.labels.get("uid") == uid]
check("shmref_tenant_quota_bytes{uid=\"%s\"} is half the pool (the default)" % uid,
      quota == [pool_size // 2], "got %r" % quota)
classes = samples("shmref_pool_class_buffers")
check("shmref_pool_class_buffers has a sample per class and state",
      len(classes) >= 2 and all(set(s.labels) == {"class_bytes", "state"} for s in classes), str(classes))

counters = ["connections", "leases", "publishes", "acquires", "releases", "reclaimed_leases",
            "reclaimed_clients", "protocol_errors", "slow_clients", "buffers_created",
            "buffers_recycled", "buffers_retired", "buffers_evicted", "buffers_create_failed",
            "retentions_expired", "clients_closed", "clients_died", "refusals"]
# The parser names a counter family without its _total suffix; its samples keep it.
not_counter = [c for c in counters if families.get("shmref_" + c) is None
               or families["shmref_" + c].type != "counter"
               or not samples("shmref_" + c, "shmref_%s_total" % c)]
check("every shmref_*_total is a counter with _total samples", not not_counter, "not: %s" % not_counter)
pub = samples("shmref_publishes", "shmref_publishes_total")
check("shmref_publishes_total >= 1", len(pub) == 1 and pub[0].value >= 1, str(pub))
acq = samples("shmref_acquires", "shmref_acquires_total")
check("shmref_acquires_total >= 1", len(acq) == 1 and acq[0].value >= 1, str(acq))
gauges_total = sorted(n for n, f in families.items() if f.type != "counter"
                      and any(s.name.endswith("_total") for s in f.samples))
check("no gauge is named *_total", not gauges_total, str(gauges_total))

refusals = {s.labels.get("reason"): s.value for s in samples("shmref_refusals", "shmref_refusals_total")}
check("shmref_refusals_total has reasons quota, space, limit, access, other",
      sorted(refusals) == sorted(["quota", "space", "limit", "access", "other"]), "got %s" % sorted(refusals))
check("the refused oversized lease counts as reason=limit", refusals.get("limit", 0) >= 1, str(refusals))
print("\n".join(results))
EOF

parse() { # parse FILE MODE
    local line
    while IFS= read -r line; do
        case $line in
            PASS\ *) ok "${line#PASS }" ;;
            FAIL\ *) ko "${line#FAIL }" ;;
            *) echo "    | $line" ;;
        esac
    done < <("$PYTHON" "$tmp/check.py" "$1" "$2" "$POOL_SIZE" "$(id -u)" 2>&1)
}

if [ ! -x "$PYTHON" ]; then
    ko "$PYTHON exists"
fi

# A config file of our own, so a host's /etc/shmrefd/shmrefd.conf cannot change the numbers.
: >"$tmp/empty.conf"
"$SHMREFD" --config "$tmp/empty.conf" --socket "$sock" --pool-size "$POOL_SIZE" \
    --max-lease-size "$MAX_LEASE" 2>"$tmp/shmrefd.log" &
dpid=$!
up=1
for _ in $(seq 200); do
    ctl ping >/dev/null 2>&1 && { up=0; break; }
    kill -0 "$dpid" 2>/dev/null || break
    sleep 0.05
done
if [ $up = 0 ]; then ok "shmrefd serves"; else ko "shmrefd serves"; sed 's/^/    | /' "$tmp/shmrefd.log"; fi

# Activity: one put stays retained (a tenant row), one is consumed, one is refused.
head -c 300000 /dev/urandom >"$tmp/kept.bin"
head -c 100000 /dev/urandom >"$tmp/taken.bin"
head -c $((MAX_LEASE + 1048576)) /dev/zero >"$tmp/big.bin"
kept=$(ctl put "$tmp/kept.bin")
check "put (kept) prints a descriptor" test -n "$kept"
taken=$(ctl put --keep-ms 60000 "$tmp/taken.bin")
# shellcheck disable=SC2016 # expanded by the inner shell
check "put then get gives the same bytes" \
    bash -c '"$1" --socket "$2" get "$3" -o "$4" && cmp -s "$4" "$5"' _ \
    "$SHMREFCTL" "$sock" "$taken" "$tmp/taken.out" "$tmp/taken.bin"
ctl put "$tmp/big.bin" >/dev/null 2>&1; rc=$?
check "a put above --max-lease-size is refused with exit 1" test "$rc" = 1

ctl metrics >"$tmp/up.prom" 2>"$tmp/up.err"; rc=$?
check "shmrefctl metrics exits 0" test "$rc" = 0
check "shmrefctl metrics writes nothing to stderr" test ! -s "$tmp/up.err"
parse "$tmp/up.prom" up

# --output FILE: the textfile collector's recipe, done by shmrefctl (temp file in the same
# directory, renamed over FILE).
mkdir "$tmp/textfile"
ctl metrics --output "$tmp/textfile/shmrefd.prom" 2>"$tmp/out.err"; rc=$?
check "metrics --output FILE exits 0" test "$rc" = 0
check "FILE says shmref_up 1, and no temporary file is left" \
    bash -c 'grep -qx "shmref_up 1" "$1/shmrefd.prom" && [ "$(ls -A "$1")" = shmrefd.prom ]' _ "$tmp/textfile"
check "FILE is readable by the collector (mode 0644)" test "$(stat -c %a "$tmp/textfile/shmrefd.prom")" = 644

kill -TERM "$dpid" 2>/dev/null; wait "$dpid"; rc=$?; dpid=
check "shmrefd stops with exit 0" test "$rc" = 0

ctl metrics >"$tmp/down.prom" 2>"$tmp/down.err"; rc=$?
check "with no daemon, shmrefctl metrics exits 1" test "$rc" = 1
check "and says why on stderr" test -s "$tmp/down.err"
parse "$tmp/down.prom" down
ctl metrics --output "$tmp/textfile/shmrefd.prom" 2>/dev/null; rc=$?
check "with no daemon, metrics --output exits 1" test "$rc" = 1
check "and replaces FILE with shmref_up 0 (no stale shmref_up 1), leaving no temporary file" \
    bash -c 'grep -qx "shmref_up 0" "$1/shmrefd.prom" && ! grep -q "shmref_pool" "$1/shmrefd.prom" && [ "$(ls -A "$1")" = shmrefd.prom ]' _ "$tmp/textfile"
ctl metrics --output "$tmp/no/such/dir/x.prom" 2>/dev/null; rc=$?
check "an unwritable FILE is exit 1" test "$rc" = 1

test_end
