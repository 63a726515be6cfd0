# SPDX-License-Identifier: MIT
"""shmref.dask: the ``shmref://`` comm backend of dask.distributed.

Dask finds it by its URI scheme through the ``distributed.comm.backends`` entry point of
the ``shmref`` distribution, so the one change a user makes is the protocol::

    LocalCluster(protocol="shmref://")          # or: dask scheduler --protocol shmref
    Client("shmref://10.0.0.5:8786")            #     dask worker shmref://10.0.0.5:8786

Addresses are TCP addresses and every message travels over TCP. The handshake of each
connection tells whether both ends reach the same shmrefd (boot id, the daemon's pid and
start time, its socket's inode); when they do, every frame of at least
``distributed.comm.shmref.threshold`` bytes (default 64 KiB) travels as a descriptor: the
sender copies it once into a lease and publishes it for one consumer (or forwards the
descriptor of a buffer it received through shmref, without a copy; an Arrow table or
record batch is serialized straight into a lease: shmref.dask.serialize), the receiver
maps it read-only and hands Dask a memoryview over the mapping. An object its sender had
writable arrives writable, as over tcp://, in a private copy-on-write mapping (no copy
until it is written); with ``writable`` false it stays a read-only view of the mapping.

Config keys (``distributed.comm.shmref.*``, also ``DASK_DISTRIBUTED__COMM__SHMREF__*``):
``threshold`` (bytes, "64 KiB"), ``socket`` (the daemon's socket; null: libshmref's
default rule), ``retention`` (how long a published frame waits for its receiver, "60s"),
``enabled`` (false: plain TCP frames), ``writable`` (true: received objects are writable
when their sender's were, at a copy; false: read-only views of the mapping, no copy).
"""
from __future__ import annotations

import dask

from .comm import DEFAULTS, SHMREF, SHMREF_TLS, ShmrefBackend, ShmrefComm, ShmrefTLSBackend, stats

# In dask's defaults (dask.config.get, DASK_* variables), and read with the same defaults
# when a program resets dask's config after this import (comm._config).
dask.config.update_defaults({"distributed": {"comm": {"shmref": dict(DEFAULTS)}}})

# shmref+tls:// is registered here, at import (the package's entry points name only
# shmref): a process that uses it imports shmref.dask first (as the shmref:// backend's
# loading does).
from distributed.comm.registry import backends as _backends  # noqa: E402

_backends.setdefault("shmref+tls", ShmrefTLSBackend())

# Arrow tables and record batches are serialized straight into a lease for a comm that
# takes frames by reference (registered lazily, at Dask's first pyarrow object).
from . import serialize  # noqa: E402,F401

__all__ = ["ShmrefBackend", "ShmrefComm", "ShmrefTLSBackend", "SHMREF", "SHMREF_TLS", "stats"]
