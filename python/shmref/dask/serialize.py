# SPDX-License-Identifier: MIT
"""Dask serializers that write straight into a lease (issue 27, item 5), where Dask lets a
comm's peer say how it wants the bytes: a serializer that takes ``context`` is given the
comm's handshake options, and a shmref comm that sends by reference says so there
(``context["shmref"]``). For such a comm an Arrow table or record batch of at least the
threshold is written in Arrow's IPC stream format (what distributed's own serializer
writes, read back by distributed's own deserializer) into a lease this process publishes
for the message's one reader: the frame is that lease, sent by descriptor with no copy.
Any other comm (tcp://, a peer of another shmrefd, a small table) gets distributed's
serializer as it is.

Where Dask does not allow it: a numpy array's frame is a view of the array itself (there
is no serializer's copy to redirect: the comm's copy into a lease is the sender's only
copy); distributed's P2P shuffle writes its shards with its own ``serialize_table`` into
bytes, not through these registrations.
"""
from __future__ import annotations

import sys

import numpy as np

from distributed.protocol.serialize import dask_serialize

from shmref import _shmref

from . import comm


def _into_lease(obj, write, context):
    """The frames of obj written by write(stream) into a published lease, or None when
    this comm does not take frames by reference (or the lease fails: the caller's
    serializer then runs as it is)."""
    if not (context and context.get("shmref")):
        return None
    import pyarrow as pa
    st = comm._state()
    if st.client is None:
        return None
    mock = pa.MockOutputStream()
    write(mock)
    n = mock.size()
    if n < st.threshold:
        return None
    try:
        arr = st.client.empty(n, np.uint8)
    except OSError:
        return None
    write(pa.FixedSizeBufferWriter(pa.py_buffer(arr)))
    ref = _shmref._publish_buffer(_shmref._buffer_info(arr)["buffer"], st.keep)  # for one reader
    st.add_mapping(arr, str(ref), published=True)
    return {}, [memoryview(arr).cast("B").toreadonly()]


def _register():
    """Replaces distributed's pyarrow serializers by the ones above (which fall back to
    them): called by Dask's lazy registration of "pyarrow", at the first pyarrow object it
    serializes, after distributed's own module registered its functions."""
    import pyarrow as pa
    from distributed.protocol import arrow  # noqa: F401  (registers distributed's)

    def stream_of(obj):
        def write(sink):
            with pa.ipc.new_stream(sink, obj.schema) as w:
                w.write(obj)
        return write

    for typ in (pa.Table, pa.RecordBatch):
        plain = dask_serialize.dispatch(typ)

        def serialize(obj, context=None, _plain=plain):
            got = _into_lease(obj, stream_of(obj), context)
            return got if got is not None else _plain(obj)

        dask_serialize.register(typ)(serialize)


if "distributed.protocol.arrow" in sys.modules:  # already registered: replace them now
    _register()
else:
    dask_serialize.register_lazy("pyarrow")(_register)
