# SPDX-License-Identifier: MIT
"""Arrow Flight for consumers on other machines (needs pyarrow with Flight).

A consumer on another machine cannot map a unit's bytes, so the same descriptor also
works through Flight: :class:`Server` runs next to shmrefd and serves published units by
descriptor (the ticket is the ``shmref1:`` text); ``DoGet`` acquires the unit locally and
streams its record batches straight from the mapping (the IPC writer reads the buffers
where they lie; no copy into the Python heap). :func:`fetch` acquires locally when the
daemon is reachable on this machine and has the unit, and falls back to ``DoGet``
otherwise::

    # on the producer's machine, next to shmrefd
    python -m shmref.flight --listen grpc://0.0.0.0:8815

    # anywhere
    table = shmref.flight.fetch(ref, location="grpc://producer-host:8815")

Whoever reaches the port and knows a descriptor reads the unit, as with the daemon
itself: the descriptor is the capability. Use Flight's TLS and authentication (keyword
arguments of :class:`Server`, passed to ``pyarrow.flight.FlightServerBase``) across
untrusted networks.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Optional

import pyarrow as pa
import pyarrow.flight as flight

import shmref

__all__ = ["Server", "fetch", "LOCATION_ENV"]

#: The environment variable :func:`fetch` takes the Flight location from when none is given.
LOCATION_ENV = "SHMREF_FLIGHT"


def _ref_text(ref: Any) -> str:
    if isinstance(ref, (bytes, bytearray)):
        ref = bytes(ref).decode()
    return str(shmref.Ref(ref) if not isinstance(ref, shmref.Ref) else ref)


class Server(flight.FlightServerBase):
    """A Flight server over one shmrefd: ``DoGet(ticket)`` streams the unit whose
    descriptor text is the ticket; ``GetFlightInfo`` of a command descriptor holding the
    text gives its schema and one endpoint (this server). location: where to listen
    (``grpc://127.0.0.1:0`` picks a free port; see :attr:`port`); socket: shmrefd's
    socket (None: the default rule). Other keyword arguments go to pyarrow's
    ``FlightServerBase`` (tls_certificates, auth_handler, middleware ...)."""

    def __init__(self, location: str = "grpc://127.0.0.1:0", *, socket: Optional[str] = None, **kwargs: Any):
        super().__init__(location, **kwargs)
        self._client = shmref.connect(socket)
        host = location.split("://", 1)[-1].rsplit(":", 1)[0]
        self._location = f"grpc://{host}:{self.port}"

    @property
    def location(self) -> str:
        """The location clients connect to (with the port actually bound)."""
        return self._location

    def _acquire(self, text: str) -> "shmref.Batch":
        try:
            return self._client.acquire_batch(text)
        except FileNotFoundError as e:
            raise flight.FlightServerError(f"shmref: {text}: {e.strerror}") from e
        except (ValueError, OSError) as e:
            raise flight.FlightServerError(f"shmref: {text}: {e}") from e

    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.RecordBatchStream:
        batch = self._acquire(_ref_text(ticket.ticket))
        reader = pa.RecordBatchReader.from_stream(batch)   # the stream holds the unit
        batch.release()
        return flight.RecordBatchStream(reader)

    def get_flight_info(self, context: Any, descriptor: flight.FlightDescriptor) -> flight.FlightInfo:
        if descriptor.descriptor_type != flight.DescriptorType.CMD:
            raise flight.FlightServerError("shmref: a command descriptor holding the shmref1: text")
        text = _ref_text(descriptor.command)
        with self._acquire(text) as b:
            schema, rows = b.schema, b.num_rows
        endpoint = flight.FlightEndpoint(text.encode(), [self._location])
        return flight.FlightInfo(schema, descriptor, [endpoint], rows, -1)

    def shutdown(self) -> None:
        super().shutdown()
        self._client.close()


def fetch(ref: Any, *, client: Optional["shmref.Client"] = None, location: Optional[str] = None) -> pa.Table:
    """The unit ``ref`` as a pyarrow.Table: acquired zero-copy from this machine's shmrefd
    (through client, or a connection made by the default rule) when it is reachable and
    has the unit; otherwise fetched with Flight ``DoGet`` from location (default
    ``$SHMREF_FLIGHT``). Raises the local error when there is no location to fall back to."""
    text = _ref_text(ref)
    location = location or os.environ.get(LOCATION_ENV) or None
    local_error: Optional[BaseException] = None
    own = None
    try:
        if client is None:
            client = own = shmref.connect(timeout=5)
        with client.acquire_batch(text) as b:
            return pa.table(b)
    except (FileNotFoundError, ConnectionRefusedError, ConnectionResetError, PermissionError, TimeoutError) as e:
        local_error = e         # no daemon here, or the unit is not on this machine
    finally:
        if own is not None:
            own.close()
    if location is None:
        raise local_error
    with flight.connect(location) as fc:
        return fc.do_get(flight.Ticket(text.encode())).read_all()


def main(argv: Optional[list] = None) -> int:
    """python -m shmref.flight [--listen LOCATION] [--socket PATH]: serve until killed;
    prints the location (with the port bound) on its first line."""
    p = argparse.ArgumentParser(prog="python -m shmref.flight", description=main.__doc__)
    p.add_argument("--listen", default="grpc://127.0.0.1:8815", help="grpc://HOST:PORT (port 0: any free one)")
    p.add_argument("--socket", default=None, help="shmrefd's socket (default: the C library's rule)")
    a = p.parse_args(argv)
    server = Server(a.listen, socket=a.socket)
    print(server.location, flush=True)
    try:
        server.serve()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
