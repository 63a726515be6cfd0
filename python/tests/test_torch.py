# SPDX-License-Identifier: MIT
"""torch interop: from_numpy / frombuffer share memory with leased and acquired arrays;
DLPack through numpy; share() takes CPU tensors; tensors through multiprocessing."""
import multiprocessing as mp
import warnings

import numpy as np
import pytest

import helpers
import shmref

torch = pytest.importorskip("torch")


def test_from_numpy_on_a_lease_shares_memory(client):
    a = client.empty((4, 5), "float32")
    t = torch.from_numpy(a)
    t.fill_(2.0)                               # written through the tensor ...
    assert float(a.sum()) == 40.0              # ... seen in the lease
    assert t.data_ptr() == a.ctypes.data
    ref = client.publish(a)
    b = client.acquire(ref)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # torch warns: the array is read-only
        tb = torch.from_numpy(b)
    assert tb.data_ptr() == b.ctypes.data and tb.dtype == torch.float32 and tuple(tb.shape) == (4, 5)
    assert float(tb.sum()) == 40.0


def test_frombuffer_on_an_acquired_array(client):
    a = client.empty(1000, "int64")
    a[:] = np.arange(1000)
    b = client.acquire(client.publish(a))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        t = torch.frombuffer(b, dtype=torch.int64)
    assert t.data_ptr() == b.ctypes.data
    assert int(t.sum()) == 999 * 1000 // 2
    with pytest.raises(BufferError):
        client.release(b)                      # the tensor uses the buffer: refused, not freed
    del b
    assert int(t[-1]) == 999                   # the tensor keeps the mapping


def test_dlpack_through_numpy(client):
    a = client.empty(64, "float64")
    a[:] = 1.25
    t = torch.from_dlpack(a)                   # numpy exports the lease
    assert t.data_ptr() == a.ctypes.data
    back = np.from_dlpack(t)
    assert back.ctypes.data == a.ctypes.data
    b = client.acquire(client.publish(a))
    try:
        tb = torch.from_dlpack(b)              # a read-only array: numpy may refuse to export it
    except (BufferError, RuntimeError, TypeError):
        tb = torch.from_numpy(np.array(b))
    assert float(tb.sum()) == 80.0


def test_share_a_tensor(client):
    t = torch.arange(12, dtype=torch.float64).reshape(3, 4).T   # non-contiguous
    b = client.acquire(client.share(t))
    np.testing.assert_array_equal(b, t.numpy())
    assert b.dtype == np.float64 and b.shape == (4, 3)


def test_encode_a_tensor(client):
    t = torch.ones(100_000, dtype=torch.float32)
    j = shmref.encode({"t": t}, client)
    assert j["t"]["data"]["encoding"] == "shmref" and j["t"]["dtype"] == "float32"
    np.testing.assert_array_equal(shmref.decode(j, client)["t"], t.numpy())


def test_tensors_from_shared_arrays_in_workers(daemon):
    arrays = [shmref.shared(np.full(5000, k, dtype=np.float32)) for k in range(3)]
    with mp.get_context("spawn").Pool(2) as pool:
        got = pool.map(helpers.torch_sum, arrays)
    assert got == [(True, 0.0), (True, 5000.0), (True, 10000.0)]
