# SPDX-License-Identifier: MIT
"""The Arrow data of test_arrow.py and test_flight.py: every type of issue 10, with nulls
everywhere; importable by spawned producer processes, which build the same data."""
import datetime as dt
import decimal

import numpy as np
import pyarrow as pa

N = 5  # rows of every column; row 2 is null in each


def _nulls(values):
    v = list(values)
    v[2] = None
    return v


def columns():
    """name -> a pyarrow array of N rows with a null at row 2."""
    c = {}
    for t in (pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()):
        c[str(t)] = pa.array(_nulls(range(1, N + 1)), type=t)
    c["float16"] = pa.array(np.arange(N, dtype=np.float16), mask=np.arange(N) == 2)
    c["float32"] = pa.array(_nulls([0.5 * i for i in range(N)]), type=pa.float32())
    c["float64"] = pa.array(_nulls([0.25 * i for i in range(N)]), type=pa.float64())
    c["bool"] = pa.array(_nulls([True, False, True, True, False]))
    words = ["a", "bb", "", "dddd", "ééé"]
    c["utf8"] = pa.array(_nulls(words), type=pa.string())
    c["large_utf8"] = pa.array(_nulls(words), type=pa.large_string())
    c["binary"] = pa.array(_nulls([w.encode() for w in words]), type=pa.binary())
    c["large_binary"] = pa.array(_nulls([w.encode() for w in words]), type=pa.large_binary())
    c["fixed_size_binary"] = pa.array(_nulls([b"abc", b"def", b"ghi", b"jkl", b"mno"]), type=pa.binary(3))
    days = [dt.date(2020, 1, 1) + dt.timedelta(days=i * 40) for i in range(N)]
    c["date32"] = pa.array(_nulls(days), type=pa.date32())
    c["date64"] = pa.array(_nulls(days), type=pa.date64())
    for unit, t in (("s", pa.time32("s")), ("ms", pa.time32("ms")), ("us", pa.time64("us")), ("ns", pa.time64("ns"))):
        c[f"time_{unit}"] = pa.array(_nulls([i * 1000 for i in range(N)]), type=t)
    for unit in ("s", "ms", "us", "ns"):
        c[f"timestamp_{unit}"] = pa.array(_nulls(range(N)), type=pa.timestamp(unit))
        c[f"timestamp_{unit}_tz"] = pa.array(_nulls(range(N)), type=pa.timestamp(unit, tz="Europe/Paris"))
        c[f"duration_{unit}"] = pa.array(_nulls(range(-2, N - 2)), type=pa.duration(unit))
    c["decimal128"] = pa.array(_nulls([decimal.Decimal(f"{i}.{i}5") for i in range(N)]), type=pa.decimal128(10, 2))
    c["decimal256"] = pa.array(_nulls([decimal.Decimal(f"-{i}1234567890123456789012345678901.12345") for i in range(N)]),
                               type=pa.decimal256(40, 5))
    c["list"] = pa.array([[1, None], [], None, [4, 5, 6], None], type=pa.list_(pa.int32()))
    c["large_list"] = pa.array([["x"], None, None, ["y", None, "zz"], []], type=pa.large_list(pa.string()))
    c["fixed_size_list"] = pa.array([[1.0, 2.0], [None, 3.0], None, [5.0, 6.0], [7.0, 8.0]],
                                    type=pa.list_(pa.float64(), 2))
    c["struct"] = pa.array([{"a": 1, "b": "x"}, {"a": None, "b": "y"}, None, {"a": 4, "b": None}, {"a": 5, "b": "z"}],
                           type=pa.struct([("a", pa.int64()), ("b", pa.string())]))
    c["map"] = pa.array([[("k", 1)], [], None, [("a", None), ("b", 2)], [("c", 3)]], type=pa.map_(pa.string(), pa.int32()))
    c["dictionary"] = pa.array(_nulls(["red", "green", "red", "blue", "green"])).dictionary_encode()
    c["dictionary_int8"] = pa.DictionaryArray.from_arrays(pa.array([0, 1, None, 1, 0], type=pa.int8()),
                                                          pa.array(["lo", "hi"]))
    c["list_of_struct"] = pa.array([[{"p": 1}], None, None, [{"p": None}, None], []],
                                   type=pa.list_(pa.struct([("p", pa.int16())])))
    return c


def all_types():
    """One record batch with every column."""
    c = columns()
    return pa.RecordBatch.from_arrays(list(c.values()), names=list(c.keys()))


def multi_batch():
    """A table of three batches of the same schema (the second one sliced)."""
    rb = all_types()
    return pa.Table.from_batches([rb, rb.slice(1, 3), rb.slice(0, 2)])


def case(name):
    """The data published for a case name: a column's name (a one-column batch), 'all',
    'sliced' (a slice of 'all' at offset 1), or 'multi' (a table of three batches)."""
    if name == "all":
        return all_types()
    if name == "sliced":
        return all_types().slice(1, 3)
    if name == "multi":
        return multi_batch()
    col = columns()[name]
    return pa.RecordBatch.from_arrays([col], names=[name])


def case_names():
    return list(columns()) + ["all", "sliced", "multi"]


def publish_cases(socket, names):
    """In a producer process: publish every case (kept 60 s), return name -> ref text."""
    import shmref
    c = shmref.connect(socket)
    out = {n: str(c.publish_batch(case(n), keep=60.0)) for n in names}
    c.close()
    return out


def publish_from(socket, producer):
    """In a producer process: the same table published by another library; returns the ref."""
    import shmref
    t = pa.table({"x": pa.array([1.5, None, 3.0, 4.5]), "s": pa.array(["a", "bb", None, "dddd"]),
                  "i": pa.array([1, 2, 3, None], type=pa.int64())})
    if producer == "pyarrow_batch":
        obj = t.to_batches()[0]
    elif producer == "pyarrow_table":
        obj = t
    elif producer == "polars":
        import polars as pl
        obj = pl.from_arrow(t)
    elif producer == "duckdb":
        import duckdb
        obj = duckdb.sql("select * from t")
    elif producer == "duckdb_arrow":
        import duckdb
        obj = duckdb.sql("select * from t").arrow()
    elif producer == "nanoarrow":
        import nanoarrow as na
        obj = na.c_array_stream(t)
    elif producer == "nanoarrow_array":
        import nanoarrow as na
        obj = na.c_array(t.to_batches()[0])
    else:
        raise ValueError(producer)
    import shmref
    c = shmref.connect(socket)
    ref = str(c.publish_batch(obj, keep=60.0))
    c.close()
    return ref


def buffers_inside(arr, lo, hi):
    """The (address, size) of every buffer of a pyarrow array (children and dictionaries
    included) that lies outside [lo, hi); an empty list proves zero-copy."""
    out = []
    for b in arr.buffers():
        if b is not None and b.size > 0 and not (lo <= b.address and b.address + b.size <= hi):
            out.append((hex(b.address), b.size))
    if pa.types.is_dictionary(arr.type):
        out += buffers_inside(arr.dictionary, lo, hi)
    for i in range(arr.type.num_fields):
        child = arr.field(i) if pa.types.is_struct(arr.type) else None
        if child is not None and pa.types.is_dictionary(child.type):
            out += buffers_inside(child.dictionary, lo, hi)
    return out


def check_in_child(socket, ref):
    """In a consumer process: acquire the multi-batch table; returns what is wrong."""
    import shmref
    with shmref.connect(socket) as c, c.acquire_batch(ref) as b:
        lo, hi = b._mapping_range()
        t = pa.table(b)
    bad = [] if t.equals(multi_batch()) else ["not equal"]
    for ch in t.columns:
        for col in ch.chunks:
            bad += buffers_inside(col, lo, hi)
    return bad
