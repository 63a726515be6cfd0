# SPDX-License-Identifier: MIT
"""empty / publish / acquire / share / release, Refs and the metadata convention."""
import os
import pickle
import subprocess

import numpy as np
import pytest

import shmref
from helpers import mp

DTYPES = ["float64", "float32", "float16", "int8", "uint16", "int32", "int64", "uint64", "complex64",
          "complex128", "bool", "datetime64[ns]", "timedelta64[s]", ">f8", ">i4", "U5", "S3", "V4"]


def sample(dtype, shape, seed=1):
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    n = int(np.prod(shape))
    if dt.kind in "fc":
        v = rng.standard_normal(n) * 100
        if dt.kind == "c":
            v = v + 1j * rng.standard_normal(n)
    elif dt.kind == "b":
        v = rng.integers(0, 2, n).astype(bool)
    elif dt.kind in "iu":
        v = rng.integers(0, 100, n)
    elif dt.kind in "mM":
        v = rng.integers(0, 10**9, n).astype(dt)
    elif dt.kind in "US":
        v = np.array([f"x{i % 997}" for i in range(n)]).astype(dt)
    else:
        v = np.frombuffer(rng.bytes(n * dt.itemsize), dtype=dt)
    return np.asarray(v).astype(dt).reshape(shape)


@pytest.mark.parametrize("dtype", DTYPES)
def test_roundtrip_dtypes(client, dtype):
    src = sample(dtype, (7, 5))
    a = client.empty(src.shape, dtype)
    assert a.flags.writeable and a.dtype == np.dtype(dtype) and a.shape == (7, 5)
    a[...] = src
    ref = client.publish(a)
    assert not a.flags.writeable
    b = client.acquire(ref)
    assert b.dtype == np.dtype(dtype) and b.shape == src.shape
    assert not b.flags.writeable
    np.testing.assert_array_equal(b, src)
    assert b.ctypes.data != src.ctypes.data


@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (1,), (2, 3, 4, 5)])
def test_shapes_including_0d_and_empty(client, shape):
    src = sample("int32", shape)
    a = client.empty(shape, np.int32)
    a[...] = src
    b = client.acquire(client.publish(a))
    assert b.shape == shape and b.dtype == np.int32 and b.ndim == len(shape)
    np.testing.assert_array_equal(b, src)


def test_fortran_order(client):
    src = np.asfortranarray(sample("float64", (4, 6)))
    a = client.empty(src.shape, src.dtype, order="F")
    a[...] = src
    b = client.acquire(client.publish(a))
    assert b.flags.f_contiguous and not b.flags.c_contiguous
    np.testing.assert_array_equal(b, src)


@pytest.mark.parametrize("view", [lambda x: x[::2, ::3], lambda x: x.T, lambda x: x[:, 1], lambda x: x[::-1]])
def test_share_non_contiguous(client, view):
    base = sample("float64", (10, 9))
    src = view(base)
    ref = client.share(src)
    b = client.acquire(ref)
    assert b.flags.c_contiguous
    np.testing.assert_array_equal(b, src)
    assert ref in client.shares
    client.release(ref)
    assert ref not in client.shares


def test_share_buffer_objects(client):
    assert bytes(client.acquire(client.share(b"hello"))) == b"hello"
    assert client.acquire(client.share(bytearray(b"abc"))).dtype == np.uint8
    mv = memoryview(np.arange(6, dtype=np.int16))
    b = client.acquire(client.share(mv))
    assert b.dtype == np.int16
    np.testing.assert_array_equal(b, np.arange(6))


def test_publish_contiguous_view_with_offset(client):
    a = client.empty(100, "int64")
    a[:] = np.arange(100)
    ref = client.publish(a[10:20])
    b = client.acquire(ref)
    np.testing.assert_array_equal(b, np.arange(10, 20))
    info = shmref._shmref._buffer_info(b)
    assert info["offset"] == 80


def test_publish_refusals(client, daemon):
    a = client.empty((4, 4), "float32")
    with pytest.raises(ValueError, match="contiguous"):
        client.publish(a[:, ::2])
    with pytest.raises(ValueError, match="empty"):
        client.publish(np.zeros(3))
    with pytest.raises(TypeError):
        client.publish([1, 2, 3])
    client.publish(a)
    with pytest.raises(ValueError, match="already published"):
        client.publish(a)
    with shmref.connect(daemon.socket) as other:
        b = other.empty(3)
        with pytest.raises(ValueError, match="empty"):
            client.publish(b)
    with pytest.raises(TypeError, match="objects"):
        client.empty(3, object)


def test_user_meta(client):
    a = client.empty(3, "uint8")
    a[:] = 7
    ref = client.publish(a, meta=b"\x00user\xff")
    b = client.acquire(ref)
    assert shmref.metadata(b) == b"\x00user\xff"
    assert shmref.metadata(np.zeros(2)) is None
    with pytest.raises(ValueError):
        client.publish(client.empty(1), meta=b"x" * 20000)


def test_ref_forms(client):
    a = client.empty(5, "float64")
    a[:] = 1
    ref = client.publish(a)
    text = str(ref)
    assert text.startswith("shmref1:") and text.endswith(":40") and len(text) < 64
    assert shmref.Ref(text) == ref and hash(shmref.Ref(text)) == hash(ref)
    assert shmref.Ref(bytes(ref)) == ref
    assert pickle.loads(pickle.dumps(ref)) == ref
    assert repr(ref) == f"shmref.Ref('{text}')"
    assert ref.size == 40 and len(ref.token) == 16
    np.testing.assert_array_equal(client.acquire(text), np.ones(5))
    with pytest.raises(ValueError):
        shmref.Ref("shmref1:nothex:40")
    with pytest.raises(TypeError):
        shmref.Ref(42)
    with pytest.raises(TypeError):
        client.acquire(3.5)


def test_acquire_unknown_is_enoent(client):
    with pytest.raises(FileNotFoundError):
        client.acquire("shmref1:" + "ab" * 16 + ":8")


def test_keep_lets_the_producer_go(daemon):
    with shmref.connect(daemon.socket) as p:
        a = p.empty(1000, "int16")
        a[:] = 3
        ref = p.publish(a, keep=10.0)
    del a  # the producer's connection closes with its last array
    with shmref.connect(daemon.socket) as c:
        np.testing.assert_array_equal(c.acquire(ref), np.full(1000, 3, np.int16))


def test_opaque_metadata_from_c_is_bytes(client, tmp_path):
    f = tmp_path / "blob"
    f.write_bytes(bytes(range(256)) * 3)
    out = subprocess.run([os.environ["SHMREFCTL_BIN"], "--socket", client.socket, "put", "--keep-ms", "10000",
                          str(f)], check=True, capture_output=True, text=True).stdout.strip()
    b = client.acquire(out)
    assert b.dtype == np.uint8 and bytes(b) == f.read_bytes()


def test_meta_convention(client):
    m = shmref.meta_encode("<f8", (2, 3), "C", 64, b"u")
    d = shmref.meta_decode(m)
    assert d == {"dtype": "<f8", "shape": (2, 3), "order": "C", "offset": 64, "user": b"u", "user_kind": "bin"}
    assert shmref.meta_decode(b"f8") is None           # opaque
    assert shmref.meta_decode(m[:-3] + b"\xc4\x05") is None  # not one msgpack object: opaque
    good = {"shmref": 1, "kind": "array", "dtype": "<f8", "shape": [2], "order": "C"}
    assert shmref.meta_decode(mp(good))["shape"] == (2,)
    assert shmref.meta_decode(mp({**good, "kind": "unit"})) is None
    for bad in ({**good, "order": "Z"}, {**good, "dtype": "|O8"}, {**good, "shape": [-1]}, {**good, "shmref": 2},
                {k: v for k, v in good.items() if k != "dtype"}, {**good, "shape": [1] * 33}):
        with pytest.raises(ValueError, match="array metadata"):
            shmref.meta_decode(mp(bad))
    with pytest.raises(ValueError):
        shmref.meta_encode("|O8", (1,), "C")
    with pytest.raises(ValueError):
        shmref.meta_encode("<f8", (1,), "X")


def test_status_and_repr(client):
    st = client.status()
    assert st["daemon"]["pid"] == client.daemon_pid
    assert "daemon pid" in repr(client)
    a = client.empty(2)
    assert "lease" in repr(a.base) and "writable" in repr(a.base)
    assert client.timeout == 20.0
    client.timeout = 1.5
    assert client.timeout == 1.5
    client.timeout = None
    assert client.timeout > 0
    with pytest.raises(ValueError):
        client.timeout = 0
