# SPDX-License-Identifier: MIT
"""Arrow units of work from Python (issue 10): Client.publish_batch / acquire_batch with
producers and consumers in separate processes, every type compared equal with pyarrow,
zero-copy proven by buffer addresses, and the consumers and producers of the PyCapsule
interface (pyarrow, polars, duckdb, nanoarrow, daft)."""
import gc
import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor

import pytest

pa = pytest.importorskip("pyarrow")

import arrow_cases
import shmref

NAMES = arrow_cases.case_names()


@pytest.fixture(scope="module")
def pool():
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as ex:
        yield ex


@pytest.fixture(scope="module")
def published(daemon, pool):
    """Every case, published by a spawned producer process (which then exits its client)."""
    return pool.submit(arrow_cases.publish_cases, daemon.socket, NAMES).result(timeout=120)


def as_table(x):
    return x if isinstance(x, pa.Table) else pa.Table.from_batches([x])


@pytest.mark.parametrize("name", NAMES)
def test_round_trip_zero_copy(client, published, name):
    want = arrow_cases.case(name)
    with client.acquire_batch(published[name]) as b:
        got = b.to_pyarrow()
        lo, hi = b._mapping_range()
        assert b.num_rows == want.num_rows
        assert b.column_names == want.schema.names
        assert b.schema.equals(want.schema)
        assert b.num_batches == (3 if name == "multi" else 1)
    assert isinstance(got, pa.Table if name == "multi" else pa.RecordBatch)
    assert as_table(got).equals(as_table(want)), f"{name}: {got} != {want}"
    for col in got.columns if isinstance(got, pa.RecordBatch) else [c for ch in got.columns for c in ch.chunks]:
        assert arrow_cases.buffers_inside(col, lo, hi) == [], f"{name}: buffers outside the mapping"
    got.validate(full=True)


def test_arrays_outlive_batch_and_client(daemon):
    """Exported arrays keep the mapping and the daemon's reference after Batch.release()
    and Client.close(); the buffer goes back when the last array is gone."""
    base = daemon.status()["buffers"]["live"]
    c = shmref.connect(daemon.socket)
    want = arrow_cases.all_types()
    ref = c.publish_batch(want)
    b = c.acquire_batch(ref)
    got = b.to_pyarrow()
    b.release()
    c.release(ref)          # the producer's lease goes
    c.ping()                # the stock's refills answered: close gives the whole stock back
    c.close()
    assert b.released
    with pytest.raises(ValueError, match="released"):
        b.to_pyarrow()
    gc.collect()
    assert daemon.wait_status("buffers.live", base + 1) == base + 1   # held by the arrays alone
    assert got.equals(want)
    got.validate(full=True)
    del got
    gc.collect()
    assert daemon.wait_status("buffers.live", base) == base


def test_capsules(client):
    t = pa.table({"x": [1, 2, 3]})
    ref = client.publish_batch(t)
    b = client.acquire_batch(ref)
    s, a = b.__arrow_c_array__()
    assert type(s).__name__ == "PyCapsule"
    del s, a        # not consumed: the capsules' destructors release them
    st = b.__arrow_c_stream__()
    del st
    assert pa.RecordBatch._import_from_c_capsule(*b.__arrow_c_array__()).equals(t.to_batches()[0])
    assert pa.schema(b).equals(t.schema)
    with pytest.raises(NotImplementedError):
        b.__arrow_c_stream__(pa.schema([("x", pa.int32())]).__arrow_c_schema__())
    multi = client.acquire_batch(client.publish_batch(pa.Table.from_batches(t.to_batches() * 2)))
    with pytest.raises(TypeError, match="2 record batches"):
        multi.__arrow_c_array__()
    assert multi.to_pyarrow().num_rows == 6
    with pytest.raises(TypeError, match="__arrow_c_array__"):
        client.publish_batch(object())
    client.release(ref)


def test_not_a_unit(client):
    ref = client.share(b"plain bytes, no manifest")
    with pytest.raises(ValueError, match="unit"):
        client.acquire_batch(ref)


# ---- consumers (this process) of a unit published by another process ----

@pytest.fixture
def simple_ref(daemon, pool):
    """A fresh unit for each consumer (the retention ends at the first acquire)."""
    return pool.submit(arrow_cases.publish_from, daemon.socket, "pyarrow_table").result(timeout=120)


def expected_simple():
    return pa.table({"x": pa.array([1.5, None, 3.0, 4.5]), "s": pa.array(["a", "bb", None, "dddd"]),
                     "i": pa.array([1, 2, 3, None], type=pa.int64())})


def test_consumer_polars(client, simple_ref):
    pl = pytest.importorskip("polars")
    with client.acquire_batch(simple_ref) as b:
        df = pl.DataFrame(b)            # through __arrow_c_stream__
        lo, hi = b._mapping_range()
    assert df.to_arrow().equals(expected_simple().cast(df.to_arrow().schema))
    assert df["x"].sum() == 9.0
    # polars keeps numeric columns where they are: the float64 data lies in the mapping
    addr = df["x"]._s.as_single_ptr()
    assert lo <= addr < hi


def test_consumer_duckdb(client, simple_ref):
    duckdb = pytest.importorskip("duckdb")
    with client.acquire_batch(simple_ref) as b:
        batch = b                                   # duckdb scans the PyCapsule object
        assert duckdb.sql("select sum(x), count(s), max(i) from batch").fetchall() == [(9.0, 3, 3)]
        tbl = b.to_pyarrow()
        assert duckdb.sql("select s from tbl where i = 2").fetchall() == [("bb",)]


def test_consumer_nanoarrow(client, simple_ref):
    na = pytest.importorskip("nanoarrow")
    with client.acquire_batch(simple_ref) as b:
        lo, hi = b._mapping_range()
        stream = na.c_array_stream(b)
        arrays = list(stream)
        assert len(arrays) == 1
        x = arrays[0].child(0)
        assert x.length == 4 and x.null_count == 1
        assert lo <= x.buffers[1] < hi                          # zero-copy
        assert na.Array(b).to_pylist() == expected_simple().to_pylist()


def test_consumer_daft(client, simple_ref):
    daft = pytest.importorskip("daft", reason="daft is not installed")
    with client.acquire_batch(simple_ref) as b:
        df = daft.from_arrow(b.to_pyarrow())
        assert df.sum("x").to_pydict() == {"x": [9.0]}
        got = df.to_arrow()
        assert got.equals(expected_simple().cast(got.schema))


# ---- producers (other processes) ----

@pytest.mark.parametrize("producer", ["pyarrow_batch", "pyarrow_table", "polars", "duckdb", "duckdb_arrow",
                                      "nanoarrow", "nanoarrow_array"])
def test_producers(daemon, pool, client, producer):
    ref = pool.submit(arrow_cases.publish_from, daemon.socket, producer).result(timeout=120)
    with client.acquire_batch(ref) as b:
        got = pa.table(b)
    want = expected_simple()
    assert got.num_rows == 4 and got.column_names == want.column_names
    assert got.cast(want.schema).equals(want), f"{producer}: {got}"


def test_consumer_process(daemon, pool, client):
    """The reverse direction: published here, acquired and checked in another process."""
    ref = client.publish_batch(arrow_cases.multi_batch())
    assert pool.submit(arrow_cases.check_in_child, daemon.socket, str(ref)).result(timeout=120) == []


def test_python_generator_stream(client):
    """A stream whose callbacks run Python (a pyarrow reader over a generator): they take
    the GIL that publish_batch released around the copy."""
    schema = pa.schema([("n", pa.int64()), ("s", pa.string())])

    def gen():
        for i in range(4):
            yield pa.record_batch([pa.array(range(i * 10, i * 10 + 10)), pa.array([str(j) for j in range(10)])],
                                  schema=schema)

    ref = client.publish_batch(pa.RecordBatchReader.from_batches(schema, gen()))
    with client.acquire_batch(ref) as b:
        assert b.num_batches == 4 and b.num_rows == 40
        assert pa.table(b).column("n").to_pylist() == list(range(40))


def test_threads(client):
    """Threads publishing and acquiring on one client; arrays freed on other threads."""
    from concurrent.futures import ThreadPoolExecutor
    want = arrow_cases.all_types()

    def work(_):
        ref = client.publish_batch(want)
        with client.acquire_batch(ref) as b:
            got = b.to_pyarrow()
        client.release(ref)
        return got

    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(work, range(32)))
    assert all(g.equals(want) for g in got)
    with ThreadPoolExecutor(4) as ex:     # the last references dropped on other threads
        list(ex.map(lambda i: got.__setitem__(i, None), range(len(got))))


def test_forked_child(client):
    import os
    ref = client.publish_batch(pa.table({"x": [1, 2, 3]}))
    b = client.acquire_batch(ref)
    t = b.to_pyarrow()
    pid = os.fork()
    if pid == 0:        # the child: the parent's Batch is not usable, its arrays are readable
        code = 0
        try:
            b.to_pyarrow()
            code = 1
        except ChildProcessError:
            pass
        if t.column(0).to_pylist() != [1, 2, 3]:
            code = 2
        b.release()     # leaves the parent's reference alone
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert b.to_pyarrow().equals(t)   # the parent's handle still works
    b.release()


def test_bench_arrow_smoke(tmp_path):
    """./scripts/bench --arrow's pyarrow rows (bench/python/arrow_bench.py) at small sizes:
    every method runs and every consumer's sum equals the floor's."""
    import json
    import os
    import subprocess
    import sys
    script = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "python", "arrow_bench.py")
    out = tmp_path / "arrow.json"
    r = subprocess.run([sys.executable, script, "--shmrefd", os.environ["SHMREFD_BIN"], "--rows", "100000",
                        "--strings", "10000", "--iterations", "2", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(out.read_text())
    base = {"c-data-in-process", "shmref-batch", "shmref-acquire", "ipc-mapping", "flight-loopback"}
    # (and shmref-batch-4k / shmref-acquire-4k where the default daemon has huge pages)
    assert base <= {x["method"] for x in rows} <= base | {"shmref-batch-4k", "shmref-acquire-4k"}
    assert all(x["sum_ok"] for x in rows)


def test_republish_a_batch(client):
    """A Batch is Arrow data like any other: publish_batch copies it into a new unit (a
    unit of several batches through its stream)."""
    for want in (arrow_cases.all_types(), arrow_cases.multi_batch()):
        with client.acquire_batch(client.publish_batch(want)) as b:
            ref2 = client.publish_batch(b)
        with client.acquire_batch(ref2) as b2:
            assert as_table(b2.to_pyarrow()).equals(as_table(want))


def test_hostile_unit_refused(client):
    """A producer that rewrites a unit's offsets (non-monotonic) and publishes it with the
    same manifest: acquire_batch refuses it, naming the array and the field."""
    import numpy as np
    ref = client.publish_batch(pa.table({"name": pa.array(["a", "bb", "ccc"])}))
    raw = client.acquire(ref)                       # the bytes as uint8, the manifest as opaque metadata
    meta = shmref.metadata(raw)
    assert meta
    data = np.array(raw)
    good = np.array([0, 1, 3, 6], dtype=np.int32).tobytes()
    at = data.tobytes().find(good)
    assert at >= 0 and at % 64 == 0
    evil = client.empty(data.shape, "uint8")
    evil[:] = data
    evil[at + 4:at + 8] = np.frombuffer(np.array([5], dtype=np.int32).tobytes(), dtype=np.uint8)  # 0, 5, 3, 6
    bad = client._publish_raw(evil, meta)
    with pytest.raises(ValueError, match=r"name.*offset|offset.*name"):
        client.acquire_batch(bad)
    with client.acquire_batch(ref) as b:           # the original is fine
        assert b.to_pyarrow().column(0).to_pylist() == ["a", "bb", "ccc"]
