# SPDX-License-Identifier: MIT
"""Functions the worker processes run (importable by spawn and forkserver children)."""
import numpy as np

import shmref


def describe(a):
    """What a worker received: whether it is backed by shmref, and a checksum."""
    info = shmref._shmref._buffer_info(a)
    return (info is not None, float(np.asarray(a, dtype=np.float64).sum()), a.shape, str(a.dtype),
            bool(a.flags.writeable))


def double_shared(a):
    """Returns 2*a as an array that lives in shmref (pickled back by reference)."""
    c = shmref.default_client()
    out = c.empty(a.shape, a.dtype)
    np.multiply(a, 2, out=out)
    return out


def square(x):
    return shmref.shared(np.full(1000, x, dtype=np.int64) ** 2)


def put_shared(q):
    """Sends an array by reference and exits at once: the retention keeps the buffer."""
    q.put(shmref.shared(np.arange(12).reshape(3, 4)))


def torch_sum(a):
    """A worker that views its (by-reference) argument as a tensor without a copy."""
    import warnings

    import torch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        t = torch.from_numpy(a)
    return (t.data_ptr() == a.ctypes.data and shmref._shmref._buffer_info(a) is not None, float(t.sum()))


def mp(x):
    """A minimal msgpack encoder (str, int, list, dict) for hand-made metadata."""
    if isinstance(x, dict):
        return bytes([0x80 | len(x)]) + b"".join(mp(k) + mp(v) for k, v in x.items())
    if isinstance(x, list):
        return (bytes([0x90 | len(x)]) if len(x) < 16 else b"\xdc" + len(x).to_bytes(2, "big")) + b"".join(map(mp, x))
    if isinstance(x, str):
        return bytes([0xa0 | len(x)]) + x.encode()
    if isinstance(x, int):
        if 0 <= x < 128:
            return bytes([x])
        if x >= 0:
            return b"\xcf" + x.to_bytes(8, "big")
        return b"\xd3" + x.to_bytes(8, "big", signed=True)
    raise TypeError(x)
