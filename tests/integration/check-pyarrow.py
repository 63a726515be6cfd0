# SPDX-License-Identifier: MIT
# check-pyarrow.py: an interop check of the C Arrow export/import against pyarrow, run by hand
# (not by ctest: it needs pyarrow, which the project does not install yet):
#   python3 -m venv /tmp/v && /tmp/v/bin/pip install pyarrow && /tmp/v/bin/python tests/integration/check-pyarrow.py build
# pyarrow exports batches (every type, nulls, slices, deep nesting) and a stream through the C Data
# Interface; libshmref imports them into units, a second connection acquires and exports them;
# pyarrow imports those, validates them fully and compares them with the originals.
import ctypes, datetime, decimal, os, subprocess, sys, tempfile, time
import pyarrow as pa

build = sys.argv[1]
lib = ctypes.CDLL(os.path.join(build, "lib", "libshmref.so"))
d = tempfile.mkdtemp()
sock = os.path.join(d, "s.sock")
daemon = subprocess.Popen([os.path.join(build, "bin", "shmrefd"), "--socket", sock, "--pool-size", "256M"],
                          stderr=open(os.path.join(d, "log"), "w"))
import atexit
atexit.register(lambda: (daemon.terminate(), daemon.wait()))  # also when a check fails
for _ in range(200):
    if os.path.exists(sock): break
    time.sleep(0.02)
time.sleep(0.1)

V = ctypes.c_void_p
lib.shmref_errmsg.restype = ctypes.c_char_p
lib.shmref_unit_data.restype = V
lib.shmref_unit_size.restype = ctypes.c_size_t
P = ctypes.POINTER(V)
for f, args in [("shmref_connect", [ctypes.c_char_p, P]), ("shmref_unit_import_array", [V, V, V, P]),
                ("shmref_unit_import_stream", [V, V, P]), ("shmref_unit_publish", [V, ctypes.c_uint32, V]),
                ("shmref_unit_acquire", [V, V, P]), ("shmref_unit_export_batch", [V, ctypes.c_int, V, V]),
                ("shmref_unit_export_stream", [V, V]), ("shmref_unit_release", [V]), ("shmref_close", [V]),
                ("shmref_errmsg", [V]), ("shmref_unit_data", [V]), ("shmref_unit_size", [V])]:
    getattr(lib, f).argtypes = args

def conn():
    c = V()
    assert lib.shmref_connect(sock.encode(), ctypes.byref(c)) == 0
    return c

def check(r, c):
    if r < 0: raise RuntimeError(f"{r}: {lib.shmref_errmsg(c).decode()}")

def release(addr, off):
    fp = ctypes.c_void_p.from_address(addr + off).value
    if fp: ctypes.CFUNCTYPE(None, V)(fp)(addr)

def roundtrip_batch(batch):
    p, c = conn(), conn()
    s = ctypes.create_string_buffer(72); a = ctypes.create_string_buffer(80)
    sa, aa = ctypes.addressof(s), ctypes.addressof(a)
    batch._export_to_c(aa, sa)
    u = V(); desc = ctypes.create_string_buffer(24)
    check(lib.shmref_unit_import_array(p, sa, aa, ctypes.byref(u)), p)
    release(aa, 64); release(sa, 56)
    check(lib.shmref_unit_publish(u, 0, desc), p)
    v = V()
    check(lib.shmref_unit_acquire(c, desc, ctypes.byref(v)), c)
    s2 = ctypes.create_string_buffer(72); a2 = ctypes.create_string_buffer(80)
    check(lib.shmref_unit_export_batch(v, 0, ctypes.addressof(s2), ctypes.addressof(a2)), c)
    base, size = lib.shmref_unit_data(v), lib.shmref_unit_size(v)
    lib.shmref_unit_release(v)
    lib.shmref_unit_release(u)
    lib.shmref_close(p)
    lib.shmref_close(c)  # the exported batch keeps the buffer
    got = pa.RecordBatch._import_from_c(ctypes.addressof(a2), ctypes.addressof(s2))
    got.validate(full=True)
    n_in = n = 0
    for col in got.columns:
        stack = [col]
        while stack:
            x = stack.pop()
            for b in x.buffers():
                if b is not None and b.size:
                    n += 1
                    n_in += base <= b.address < base + size
            if isinstance(x, pa.DictionaryArray): stack.append(x.dictionary)
    return got, n_in, n

tz = datetime.timezone.utc
n = 50
def nul(i): return i % 5 == 0
cols = {
    "i8": pa.array([None if nul(i) else (i % 100) - 50 for i in range(n)], pa.int8()),
    "u64": pa.array([None if nul(i) else 2**63 + i for i in range(n)], pa.uint64()),
    "f16": pa.array([None if nul(i) else i * 0.5 for i in range(n)], pa.float16()) if hasattr(pa, "float16") else None,
    "f64": pa.array([None if nul(i) else i * 0.25 for i in range(n)], pa.float64()),
    "bool": pa.array([None if nul(i) else i % 3 == 0 for i in range(n)]),
    "utf8": pa.array([None if nul(i) else "x" * (i % 7) for i in range(n)]),
    "large_utf8": pa.array([None if nul(i) else "é" * (i % 4) for i in range(n)], pa.large_string()),
    "binary": pa.array([None if nul(i) else bytes([i]) * (i % 3) for i in range(n)], pa.binary()),
    "large_binary": pa.array([None if nul(i) else b"ab" * (i % 3) for i in range(n)], pa.large_binary()),
    "fsb": pa.array([None if nul(i) else bytes([i] * 4) for i in range(n)], pa.binary(4)),
    "date32": pa.array([None if nul(i) else datetime.date(2020, 1, 1 + i % 28) for i in range(n)], pa.date32()),
    "date64": pa.array([None if nul(i) else datetime.date(2021, 2, 1 + i % 28) for i in range(n)], pa.date64()),
    "time32": pa.array([None if nul(i) else datetime.time(1, i % 60) for i in range(n)], pa.time32("s")),
    "time64": pa.array([None if nul(i) else datetime.time(2, i % 60, 3, 7) for i in range(n)], pa.time64("ns")),
    "ts_tz": pa.array([None if nul(i) else datetime.datetime(2022, 1, 1, tzinfo=tz) for i in range(n)], pa.timestamp("us", tz="Europe/Paris")),
    "ts": pa.array([None if nul(i) else i for i in range(n)], pa.timestamp("s")),
    "dur": pa.array([None if nul(i) else i for i in range(n)], pa.duration("ms")),
    "dec128": pa.array([None if nul(i) else decimal.Decimal(f"{i}.25") for i in range(n)], pa.decimal128(10, 2)),
    "dec256": pa.array([None if nul(i) else decimal.Decimal(f"-{i}.5") for i in range(n)], pa.decimal256(40, 1)),
    "list": pa.array([None if nul(i) else list(range(i % 4)) for i in range(n)], pa.list_(pa.int32())),
    "large_list": pa.array([None if nul(i) else ["a"] * (i % 3) for i in range(n)], pa.large_list(pa.string())),
    "fsl": pa.array([None if nul(i) else [i, i + 1, None] for i in range(n)], pa.list_(pa.int16(), 3)),
    "struct": pa.array([None if nul(i) else {"a": i, "b": str(i)} for i in range(n)], pa.struct([("a", pa.int64()), ("b", pa.string())])),
    "map": pa.array([None if nul(i) else [("k%d" % k, k) for k in range(i % 3)] for i in range(n)], pa.map_(pa.string(), pa.int32())),
    "dict": pa.array([None if nul(i) else "v%d" % (i % 4) for i in range(n)]).dictionary_encode(),
    "null": pa.nulls(n),
    "interval": pa.array([None if nul(i) else pa.MonthDayNano([1, i, 3]) for i in range(n)], pa.month_day_nano_interval()),
}
cols = {k: v for k, v in cols.items() if v is not None}
schema_md = {b"origin": b"check.py"}
batch = pa.RecordBatch.from_pydict(cols).replace_schema_metadata(schema_md)
for name, sl in [("whole", batch), ("sliced", batch.slice(7, 31)), ("sliced-1", batch.slice(1, 1)), ("empty", batch.slice(3, 0))]:
    got, n_in, nbuf = roundtrip_batch(sl)
    assert got.equals(sl, check_metadata=True), name
    assert got.schema.metadata == schema_md
    print(f"{name}: {got.num_rows} rows x {got.num_columns} columns equal after import -> unit -> export; {n_in}/{nbuf} buffers inside the mapping")

# deeper nesting and odd slices
m = 200
deep = pa.array([None if i % 7 == 0 else [{"a": [None if (i + k) % 3 == 0 else "s%d" % k for k in range(i % 4)], "b": i % 2 == 0} for _ in range(i % 3)] for i in range(m)],
                pa.list_(pa.struct([("a", pa.list_(pa.string())), ("b", pa.bool_())])))
dnull = pa.DictionaryArray.from_arrays(pa.array([None if i % 4 == 0 else i % 3 for i in range(m)], pa.int32()), pa.array(["x", None, "z"]))
bools = pa.array([None if i % 11 == 0 else i % 2 == 0 for i in range(m)])
mp = pa.array([None if i % 6 == 0 else [("k%d" % k, [k] * k) for k in range(i % 3)] for i in range(m)], pa.map_(pa.string(), pa.list_(pa.int8())))
big = pa.RecordBatch.from_pydict({"deep": deep, "dnull": dnull, "bools": bools, "map": mp})
for off, ln in [(13, 101), (64, 3), (199, 1), (9, 190)]:
    got, n_in, nbuf = roundtrip_batch(big.slice(off, ln))
    assert got.equals(big.slice(off, ln)), (off, ln)
    print(f"deep slice {off}+{ln}: equal; {n_in}/{nbuf} buffers inside")

# a stream of 3 batches
p, c = conn(), conn()
reader = pa.RecordBatchReader.from_batches(batch.schema, [batch.slice(0, 20), batch.slice(20, 20), batch.slice(40)])
st = ctypes.create_string_buffer(40); sta = ctypes.addressof(st)
reader._export_to_c(sta)
u = V(); desc = ctypes.create_string_buffer(24)
check(lib.shmref_unit_import_stream(p, sta, ctypes.byref(u)), p)
release(sta, 24)
check(lib.shmref_unit_publish(u, 0, desc), p)
v = V()
check(lib.shmref_unit_acquire(c, desc, ctypes.byref(v)), c)
st2 = ctypes.create_string_buffer(40)
check(lib.shmref_unit_export_stream(v, ctypes.addressof(st2)), c)
lib.shmref_unit_release(v)
r2 = pa.RecordBatchReader._import_from_c(ctypes.addressof(st2))
t = r2.read_all()
assert t.equals(pa.Table.from_batches([batch])), "stream"
print(f"stream: {t.num_rows} rows in {len(t.to_batches())} batches equal")
del t, r2
lib.shmref_unit_release(u)
lib.shmref_close(p); lib.shmref_close(c)
print("ok")
